// rag-mag demo page: asks POST /api/ask/stream (server-sent events read with fetch) once per selected index
// and draws the streamed answer, the latency and each source's score split into cosine and document norm.
// API requests go through apiFetch (auth.js), which sends the key when the demo asks for one.
"use strict";

const SIDE_BY_SIDE = "__side_by_side__";
// Why there is no answer, by the result's abstained_by (rag_mag/components/answer_builder.py).
const ABSTAINED_BECAUSE = {
  reader: "The reader found no answer in the passages below.",
  score: "No passage scored above this index's min_score.",
};
const page = { indexes: [], maxChars: 1000, maxTopK: 8, panels: [] };

function byId(id) { return document.getElementById(id); }

function number(value, digits = 3) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "?";
}

function duration(ms) {
  if (typeof ms !== "number") return "?";
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`;
}

async function readJson(response) {
  try { return await response.json(); } catch (error) { return null; }
}

function messageOf(body, response) {
  if (body && body.error && body.error.message) return body.error.message;
  return `the demo server answered HTTP ${response.status} ${response.statusText || ""}`.trim();
}

function showError(message) {
  const box = byId("error");
  box.textContent = message;
  box.hidden = false;
}

function hideError() { byId("error").hidden = true; }

// ------------------------------------------------------------------------------------------ start-up
function indexLabel(info) { return `${info.name} (${info.strategy}, ${info.documents} passages)`; }

// After an upload or a delete (documents.js): the passage counts in the index list, selection kept.
async function refreshIndexCounts() {
  const response = await apiFetch("/api/indexes");
  const body = await readJson(response);
  if (!response.ok || !body) return;
  page.indexes = body.indexes;
  for (const option of byId("index").options) {
    const info = body.indexes.find((item) => item.name === option.value);
    if (info) option.text = indexLabel(info);
  }
}

async function loadIndexes() {
  const select = byId("index");
  try {
    const response = await apiFetch("/api/indexes");
    const body = await readJson(response);
    if (!response.ok || !body) throw new Error(messageOf(body, response));
    page.indexes = body.indexes;
    page.maxChars = body.max_question_chars;
    page.maxTopK = body.max_top_k;
    select.replaceChildren();
    for (const info of body.indexes) {
      select.add(new Option(indexLabel(info), info.name));
    }
    if (body.indexes.length > 1) {
      const names = body.indexes.map((info) => info.name).join(" vs ");
      select.add(new Option(`side by side: ${names}`, SIDE_BY_SIDE));
      select.value = SIDE_BY_SIDE;  // the most telling view: the same question under each strategy
    }
    const topK = byId("top-k");
    topK.max = String(page.maxTopK);
    const preferred = body.indexes.find((info) => info.default) || body.indexes[0];
    if (preferred) topK.value = String(preferred.default_top_k);
    updateCount();
  } catch (error) {
    select.replaceChildren(new Option("no index", ""));
    showError(`Cannot load the list of indexes: ${error.message}`);
  }
}

async function checkHealth() {
  const pill = byId("llm-status");
  try {
    const response = await fetch("/health");
    const body = await readJson(response);
    const up = response.ok && body && body.llm && body.llm.reachable;
    pill.className = `pill ${up ? "pill-ok" : "pill-bad"}`;
    pill.textContent = up ? "LLM: ready" : "LLM: unreachable";
    pill.title = up ? (body.llm.url ? `vLLM at ${body.llm.url}` : "vLLM answers")
      : ((body && body.llm && body.llm.error) || "the health check failed");
  } catch (error) {
    pill.className = "pill pill-bad";
    pill.textContent = "demo server unreachable";
    pill.title = error.message;
  }
}

function updateCount() {
  const count = byId("char-count");
  const length = byId("question").value.trim().length;
  count.textContent = `${length} / ${page.maxChars}`;
  count.classList.toggle("over", length > page.maxChars);
}

// ------------------------------------------------------------------------------------------ panels
function documentNormScale() {
  // One scale for every panel, so the norm bars of two strategies can be compared side by side.
  let largest = 1;
  for (const panel of page.panels) {
    for (const source of panel.sources) {
      if (typeof source.document_norm === "number") largest = Math.max(largest, source.document_norm);
    }
  }
  return largest;
}

function renderAllSources() {
  const scale = documentNormScale();
  for (const panel of page.panels) {
    // Side by side: where each passage ranked in the other panels (the strategies disagree where magnitude counts).
    const others = page.panels.filter((other) => other !== panel && other.sources.length)
      .map((other) => ({ name: other.name, ranks: new Map(other.sources.map((s) => [s.id, s.rank])) }));
    panel.renderSources(scale, others);
  }
}

function makePanel(name) {
  const info = page.indexes.find((item) => item.name === name) || { name, strategy: "?", documents: "?" };
  const node = byId("panel-template").content.firstElementChild.cloneNode(true);
  node.dataset.index = name;
  node.querySelector(".panel-name").textContent = name;
  node.querySelector(".panel-meta").textContent = `strategy ${info.strategy} · ${info.documents} passages`;
  const answer = node.querySelector(".answer-text");
  const answerLabel = node.querySelector(".answer-label");
  const why = node.querySelector(".abstention-why");
  const timing = node.querySelector(".timing");
  const errorBox = node.querySelector(".panel-error");
  const sourcesLabel = node.querySelector(".sources-label");
  const list = node.querySelector(".sources");

  const panel = {
    node,
    name,
    state: "idle",
    sources: [],
    setState(state) { panel.state = state; node.dataset.state = state; },
    addToken(text) {
      if (panel.state !== "streaming") { answer.textContent = ""; panel.setState("streaming"); }
      answer.textContent += text;
    },
    setSources(sources, retrievalMs) {
      panel.sources = sources || [];
      if (retrievalMs !== undefined) timing.textContent = `retrieved in ${duration(retrievalMs)} · generating…`;
      renderAllSources();
    },
    finish(result) {
      // answerable false: the documents do not answer; the answer is "The documents do not say.", a notice
      // apart from an answer, and the sources are only the closest ones.
      const abstained = result.answerable === false;
      node.dataset.answerable = abstained ? "false" : "true";
      answer.textContent = result.answer || "(the model returned an empty answer)";
      answerLabel.textContent = abstained ? "No answer" : "Answer";
      why.textContent = abstained ? (ABSTAINED_BECAUSE[result.abstained_by] || "") : "";
      why.hidden = !why.textContent;
      sourcesLabel.textContent = abstained ? "Closest sources" : "Sources";
      const parts = [`total ${duration(result.latency_ms)}`];
      if (result.retrieval_ms != null) parts.push(`retrieval ${duration(result.retrieval_ms)}`);
      if (result.first_token_ms != null) parts.push(`first token ${duration(result.first_token_ms)}`);
      if (result.queue_ms >= 50) parts.push(`waited ${duration(result.queue_ms)} for a free slot`);
      timing.textContent = parts.join(" · ");
      timing.dataset.latencyMs = String(result.latency_ms);
      if (Array.isArray(result.queries) && result.queries.length > 1) {  // a multi-hop pipeline's search rounds
        const queries = node.querySelector(".queries");
        queries.replaceChildren(...result.queries.map((query, round) => {
          const item = document.createElement("li");
          item.textContent = `round ${round + 1}: ${query}`;
          return item;
        }));
        queries.hidden = false;
      }
      panel.setSources(result.sources);
      panel.setState("done");
    },
    fail(message) {
      errorBox.textContent = message;
      errorBox.hidden = false;
      if (panel.state !== "streaming") answer.textContent = "";
      timing.textContent = "";
      panel.setState("error");
    },
    renderSources(scale, others) {
      sourcesLabel.hidden = !panel.sources.length;
      list.replaceChildren();
      for (const source of panel.sources) list.append(sourceItem(source, scale, others));
    },
  };
  page.panels.push(panel);
  byId("results").append(node);
  return panel;
}

function sourceItem(source, normScale, others) {
  const item = byId("source-template").content.firstElementChild.cloneNode(true);
  if (source.hop) {
    const hop = item.querySelector(".hop");
    hop.textContent = `round ${source.hop}`;
    hop.hidden = false;
  }
  const elsewhere = item.querySelector(".elsewhere");
  elsewhere.textContent = others.map((other) => {
    const rank = other.ranks.get(source.id);
    return rank ? `${other.name} #${rank}` : `${other.name}: not in top ${other.ranks.size}`;
  }).join(" · ");
  if (others.some((other) => other.ranks.get(source.id) !== source.rank)) elsewhere.classList.add("moved");
  item.querySelector(".rank").textContent = String(source.rank);
  // Wikipedia titles of some datasets come wrapped in quotes: "History of the Quakers".
  // A file's chunk is cited by file and page; a corpus passage by its (Wikipedia) title, some wrapped in quotes.
  // The same text in other files (merged by the retriever) is cited too: "a.pdf, page 2; also in b.pdf, page 5".
  const where = (cited) => (cited.page ? `${cited.file}, page ${cited.page}` : cited.file);
  const copies = [...new Set((source.also_in || []).map(where))];
  item.querySelector(".title").textContent = source.file
    ? where(source) + (copies.length ? `; also in ${copies.join(", ")}` : "")
    : (source.title || source.id).replace(/^"(.*)"$/, "$1");
  item.querySelector(".score").textContent = number(source.score);
  const cosine = typeof source.cosine === "number" ? source.cosine : 0;
  const norm = typeof source.document_norm === "number" ? source.document_norm : 0;
  item.querySelector(".fill-cosine").style.width = `${Math.max(0, Math.min(1, cosine)) * 100}%`;
  item.querySelector(".fill-norm").style.width = `${Math.max(0, Math.min(1, norm / normScale)) * 100}%`;
  item.querySelector(".value-cosine").textContent = number(source.cosine);
  item.querySelector(".value-norm").textContent = number(source.document_norm);
  item.querySelector(".formula").textContent =
    `${number(source.score)} = cos ${number(source.cosine)} × |q| ${number(source.query_norm)} × |d| ${number(source.document_norm)}`;
  const text = item.querySelector(".text");
  text.textContent = "";
  if (source.answer_span && source.excerpt) {  // the answer's words, marked where the passage holds them
    const [start, end] = source.answer_span;
    const mark = document.createElement("mark");
    mark.textContent = source.excerpt.slice(start, end);
    text.append(source.excerpt.slice(0, start), mark, source.excerpt.slice(end));
  } else {
    text.textContent = source.text || "";
  }
  text.addEventListener("click", () => text.classList.toggle("open"));
  return item;
}

// ------------------------------------------------------------------------------------------ asking
function parseEvent(block) {
  let kind = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) kind = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  return { kind, data: data.length ? JSON.parse(data.join("\n")) : null };
}

function handleEvent(panel, event) {
  if (event.kind === "sources") panel.setSources(event.data.sources, event.data.retrieval_ms);
  else if (event.kind === "token") panel.addToken(event.data.text);
  else if (event.kind === "done") panel.finish(event.data);
  else if (event.kind === "error") panel.fail(messageOf(event.data, { status: event.data.status }));
}

// Returns "question-error" when the server refused the question itself (shown once, above the panels).
async function streamAnswer(question, name, topK, panel) {
  panel.setState("waiting");
  let response;
  try {
    response = await apiFetch("/api/ask/stream", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify({ question, index: name, top_k: topK }),
    });
  } catch (error) {
    panel.fail(`Cannot reach the demo server (${error.message}). Is \`rag-mag serve\` still running?`);
    return "failed";
  }
  if (!response.ok) {
    const body = await readJson(response);
    const message = messageOf(body, response);
    if (response.status < 500 && body && body.error && ["question", "top_k"].includes(body.error.param)) {
      showError(message);
      return "question-error";
    }
    panel.fail(message);
    if (response.status === 503) checkHealth();
    return "failed";
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (block.trim()) handleEvent(panel, parseEvent(block));
      }
    }
  } catch (error) {
    panel.fail(`The answer stream broke off: ${error.message}`);
    return "failed";
  }
  if (panel.state !== "done" && panel.state !== "error") {
    panel.fail("The answer stream ended without an answer; see the demo server's log.");
  }
  return panel.state;
}

async function ask(event) {
  event.preventDefault();
  hideError();
  const selected = byId("index").value;
  const names = selected === SIDE_BY_SIDE ? page.indexes.map((info) => info.name) : [selected];
  const topK = Number.parseInt(byId("top-k").value, 10);
  const question = byId("question").value;
  byId("results").replaceChildren();
  page.panels = [];
  const button = byId("ask-button");
  button.disabled = true;
  try {
    const outcomes = await Promise.all(names.map(
      (name) => streamAnswer(question, name, Number.isFinite(topK) ? topK : null, makePanel(name))));
    if (outcomes.includes("question-error")) {
      byId("results").replaceChildren();
      page.panels = [];
    }
  } finally {
    button.disabled = false;
  }
}

byId("ask-form").addEventListener("submit", ask);
byId("question").addEventListener("input", updateCount);
byId("question").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    byId("ask-form").requestSubmit();
  }
});
loadIndexes();
checkHealth();
