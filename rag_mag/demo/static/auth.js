// rag-mag demo page, the key: when the demo asks for keys (`rag-mag keys add`), the page asks for one once, keeps
// it in sessionStorage for this browser session (never in a URL, never in a cookie) and sends it as
// "Authorization: Bearer KEY" on every API request. Loaded before app.js and documents.js, which call apiFetch.
"use strict";

const KEY_STORAGE = "rag-mag-key";

function storedKey() {
  try { return sessionStorage.getItem(KEY_STORAGE) || ""; } catch (error) { return ""; }
}

function forgetKey() {
  try { sessionStorage.removeItem(KEY_STORAGE); } catch (error) { /* storage off: nothing kept */ }
}

function withKey(options = {}, key = storedKey()) {
  const headers = new Headers(options.headers || {});
  if (key) headers.set("Authorization", `Bearer ${key}`);
  return { ...options, headers };
}

function showKeyForm(message) {
  const form = document.getElementById("key-form");
  const note = document.getElementById("key-message");
  note.textContent = message;
  form.hidden = false;
  document.getElementById("forget-key").hidden = true;
  document.getElementById("api-key").focus();
}

// fetch() with the key; a 401 forgets a refused key and opens the key form.
async function apiFetch(url, options = {}) {
  const key = storedKey();
  const response = await fetch(url, withKey(options, key));
  if (response.status === 401) {
    if (key) forgetKey();
    showKeyForm(key ? "The key was refused (unknown or revoked). Enter another key."
                    : "This demo needs a key. Enter the key you were given (rag-mag keys add).");
  }
  return response;
}

async function useKey(event) {
  event.preventDefault();
  const input = document.getElementById("api-key");
  const key = input.value.trim();
  const note = document.getElementById("key-message");
  if (!key) { note.textContent = "Enter a key first."; return; }
  const response = await fetch("/api/indexes", withKey({}, key));
  if (!response.ok) {
    let message = `the demo answered HTTP ${response.status}`;
    try { message = (await response.json()).error.message; } catch (error) { /* keep the status */ }
    note.textContent = `Key refused: ${message}`;
    return;
  }
  try { sessionStorage.setItem(KEY_STORAGE, key); } catch (error) { /* the page cannot keep it */ }
  input.value = "";
  location.reload();  // every panel loads again, with the key
}

document.getElementById("key-form").addEventListener("submit", useKey);
document.getElementById("forget-key").addEventListener("click", () => { forgetKey(); location.reload(); });
document.getElementById("forget-key").hidden = !storedKey();
