// rag-mag demo page, the documents panel: uploads files into an index (POST /api/documents, multipart), follows
// the indexing job (GET /api/documents/jobs/ID), lists the index's files with their chunk counts and deletes one.
// Uploads and deletes carry the header X-RagMag-Upload: 1, which the demo requires (a form on another page cannot
// send it). Uses byId, readJson, messageOf and refreshIndexCounts from app.js, apiFetch from auth.js.
"use strict";

const UPLOAD_HEADERS = { "X-RagMag-Upload": "1" };
const POLL_MS = 400;
const documentsPanel = { index: "", maxUploadMb: null, types: [], polling: new Set(), lastJob: null };

function documentsUrl(extra = {}) {
  const query = new URLSearchParams({ index: documentsPanel.index, ...extra });
  return `/api/documents?${query}`;
}

function showDocumentsError(message) {
  const box = byId("documents-error");
  box.textContent = message;
  box.hidden = !message;
}

function plural(count, word) { return `${count} ${word}${count === 1 ? "" : "s"}`; }

// ------------------------------------------------------------------------------------------ the list
function skippedReasons() {
  const reasons = new Map();
  const job = documentsPanel.lastJob;
  if (job && job.state === "done") for (const item of job.skipped || []) reasons.set(item.file, item.reason);
  return reasons;
}

function documentItem(entry, reasons) {
  const item = byId("document-template").content.firstElementChild.cloneNode(true);
  item.dataset.file = entry.file;
  item.dataset.chunks = String(entry.chunks);
  item.querySelector(".document-name").textContent = entry.file;
  const chunks = item.querySelector(".document-chunks");
  if (entry.indexed) {
    chunks.textContent = plural(entry.chunks, "chunk");
  } else {
    item.classList.add("not-indexed");
    chunks.textContent = reasons.has(entry.file) ? `not indexed: ${reasons.get(entry.file)}` : "waiting to be indexed";
  }
  const button = item.querySelector(".document-delete");
  if (entry.uploaded) {
    button.addEventListener("click", () => deleteDocument(entry.file, button));
  } else {
    button.remove();  // indexed from another folder by `rag-mag index`: removed with `rag-mag index --remove`
    chunks.textContent += " · indexed with rag-mag index";
  }
  return item;
}

function renderDocuments(body) {
  documentsPanel.maxUploadMb = body.max_upload_mb;
  documentsPanel.types = body.types;
  byId("upload-files").accept = body.types.join(",");
  byId("upload-limits").textContent =
    `${body.types.join(" ")} · at most ${body.max_upload_mb} MB each, ${body.max_files_per_upload} at once`;
  const indexed = body.files.filter((entry) => entry.indexed);
  byId("documents-summary").textContent =
    `${plural(indexed.length, "file")}, ${plural(body.chunks, "chunk")} of ${body.documents} passages in the index`;
  const reasons = skippedReasons();
  const list = byId("document-list");
  list.replaceChildren(...body.files.map((entry) => documentItem(entry, reasons)));
  if (!body.files.length) {
    const empty = document.createElement("li");
    empty.className = "document-empty muted";
    empty.textContent = "No files in this index yet: upload some, then ask about them.";
    list.append(empty);
  }
}

async function loadDocuments() {
  if (!documentsPanel.index) return;
  try {
    const response = await apiFetch(documentsUrl());
    const body = await readJson(response);
    if (!response.ok || !body) throw new Error(messageOf(body, response));
    if (body.job) {
      showJob(body.job);
      if (!["done", "failed"].includes(body.job.state)) followJob(body.job.id);
    }
    renderDocuments(body);
  } catch (error) {
    showDocumentsError(`Cannot load the documents: ${error.message}`);
  }
}

// ------------------------------------------------------------------------------------------ jobs
function showJob(job) {
  documentsPanel.lastJob = job;
  const status = byId("upload-status");
  status.hidden = false;
  status.dataset.state = job.state;
  if (job.state === "queued") status.textContent = "Queued: starts when the running indexing job ends…";
  else if (job.state === "running") {
    status.textContent = job.files_total
      ? `Indexing: ${job.files_done} / ${plural(job.files_total, "file")}, ${plural(job.chunks_encoded, "chunk")} encoded…`
      : "Indexing: reading the files…";
  } else if (job.state === "done") status.textContent = `Indexed. ${job.summary}`;
  else status.textContent = `Indexing failed: ${job.error}`;
  const skipped = byId("skipped-list");
  skipped.replaceChildren(...(job.skipped || []).map((item) => {
    const line = document.createElement("li");
    line.textContent = `skipped ${item.file}: ${item.reason}`;
    return line;
  }));
  skipped.hidden = !(job.skipped || []).length;
}

async function followJob(jobId) {
  if (documentsPanel.polling.has(jobId)) return;
  documentsPanel.polling.add(jobId);
  try {
    for (;;) {
      const response = await apiFetch(`/api/documents/jobs/${encodeURIComponent(jobId)}`);
      const body = await readJson(response);
      if (response.status === 429) {  // over the key's rate: wait as told, then follow on
        const seconds = Number.parseInt(response.headers.get("Retry-After") || "1", 10);
        await new Promise((resolve) => setTimeout(resolve, Math.max(1, seconds) * 1000));
        continue;
      }
      if (!response.ok || !body) throw new Error(messageOf(body, response));
      showJob(body.job);
      if (["done", "failed"].includes(body.job.state)) break;
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
  } catch (error) {
    showDocumentsError(`Lost track of the indexing job: ${error.message}`);
  } finally {
    documentsPanel.polling.delete(jobId);
  }
  await loadDocuments();
  await refreshIndexCounts();
}

// ------------------------------------------------------------------------------------------ upload and delete
function tooLarge(files) {
  const limit = documentsPanel.maxUploadMb;
  return limit ? files.filter((file) => file.size > limit * 1e6) : [];
}

async function uploadDocuments(event) {
  event.preventDefault();
  showDocumentsError("");
  const input = byId("upload-files");
  const files = Array.from(input.files);
  if (!files.length) return showDocumentsError("Choose one or more files to upload first.");
  const over = tooLarge(files);
  if (over.length) {
    return showDocumentsError(`${over.map((file) => file.name).join(", ")}: over the limit of ` +
                              `${documentsPanel.maxUploadMb} MB per file`);
  }
  const form = new FormData();
  for (const file of files) form.append("files", file, file.name);
  const button = byId("upload-button");
  button.disabled = true;
  try {
    const response = await apiFetch(documentsUrl(), { method: "POST", headers: UPLOAD_HEADERS, body: form });
    const body = await readJson(response);
    if (!response.ok || !body) throw new Error(messageOf(body, response));
    input.value = "";
    showJob(body.job);
    loadDocuments();
    followJob(body.job.id);
  } catch (error) {
    showDocumentsError(`Upload refused: ${error.message}`);
  } finally {
    button.disabled = false;
  }
}

async function deleteDocument(name, button) {
  showDocumentsError("");
  button.disabled = true;
  try {
    const response = await apiFetch(documentsUrl({ file: name }), { method: "DELETE", headers: UPLOAD_HEADERS });
    const body = await readJson(response);
    if (!response.ok || !body) throw new Error(messageOf(body, response));
    showJob(body.job);
    followJob(body.job.id);
  } catch (error) {
    showDocumentsError(`Cannot delete ${name}: ${error.message}`);
    button.disabled = false;
  }
}

// ------------------------------------------------------------------------------------------ start-up
async function loadDocumentIndexes() {
  const select = byId("documents-index");
  try {
    const response = await apiFetch("/api/indexes");
    const body = await readJson(response);
    if (!response.ok || !body) throw new Error(messageOf(body, response));
    select.replaceChildren(...body.indexes.map((info) => new Option(info.name, info.name)));
    select.value = body.default;
    documentsPanel.index = select.value;
    await loadDocuments();
  } catch (error) {
    showDocumentsError(`Cannot load the list of indexes: ${error.message}`);
  }
}

byId("upload-form").addEventListener("submit", uploadDocuments);
byId("documents-index").addEventListener("change", (event) => {
  documentsPanel.index = event.target.value;
  documentsPanel.lastJob = null;
  byId("upload-status").hidden = true;
  byId("skipped-list").hidden = true;
  loadDocuments();
});
loadDocumentIndexes();
