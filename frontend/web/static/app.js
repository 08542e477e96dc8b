// The chat page: talks to this server's /v1/models and /v1/chat/completions (streamed), renders replies as
// Markdown (markdown.js escapes first), folds the reasoning, aborts with Stop, and keeps the conversation and
// settings in localStorage. With an API key on the server, the page asks for it (kept for this tab only, in
// sessionStorage) and sends it as a Bearer token.
"use strict";

const STORE = "ringserve.chat";
const KEY_STORE = "ringserve.apiKey";
const $ = (id) => document.getElementById(id);

const state = loadState();
let controller = null;        // the AbortController of the reply in progress

function loadState() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE) || "{}");
    return { messages: Array.isArray(saved.messages) ? saved.messages : [], settings: saved.settings || {} };
  } catch (e) {
    return { messages: [], settings: {} };
  }
}

function saveState() {
  state.settings = { model: $("model").value, system: $("system").value,
                     temperature: $("temperature").value, maxTokens: $("max-tokens").value };
  localStorage.setItem(STORE, JSON.stringify(state));
}

function headers() {
  const out = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

function showStatus(text) {
  $("status").textContent = text || "";
  $("status").hidden = !text;
}

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && (body.error.message || body.error)) || response.statusText;
  } catch (e) {
    return `${response.status} ${response.statusText}`;
  }
}

// ------------------------------------------------------------------ models and the API key
async function loadModels() {
  const response = await fetch("/v1/models", { headers: headers() });
  if (response.status === 401) {
    $("key-form").hidden = false;
    if (sessionStorage.getItem(KEY_STORE)) {
      $("key-error").textContent = "That key was not accepted.";
      $("key-error").hidden = false;
    }
    return false;
  }
  if (!response.ok) {
    showStatus(`Could not list the models: ${await errorText(response)}`);
    return false;
  }
  $("key-form").hidden = true;
  const select = $("model");
  select.replaceChildren();
  for (const card of (await response.json()).data) {
    const option = document.createElement("option");
    option.value = option.textContent = card.id;
    select.append(option);
  }
  if (state.settings.model && [...select.options].some((o) => o.value === state.settings.model)) {
    select.value = state.settings.model;
  }
  return true;
}

// ------------------------------------------------------------------ the conversation
function messageElement(message) {
  const element = document.createElement("div");
  element.className = `message ${message.role}`;
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = message.role;
  element.append(role);
  if (message.role === "assistant") {
    const details = document.createElement("details");
    details.className = "reasoning";
    details.hidden = !message.reasoning;
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    const reasoning = document.createElement("div");
    details.append(summary, reasoning);
    const content = document.createElement("div");
    content.className = "content";
    element.append(details, content);
  } else {
    const content = document.createElement("div");
    content.className = "content";
    element.append(content);
  }
  fill(element, message);
  return element;
}

function fill(element, message) {
  const content = element.querySelector(".content");
  if (message.role === "assistant") {
    const details = element.querySelector("details.reasoning");
    details.hidden = !message.reasoning;
    details.querySelector("div").textContent = message.reasoning || "";
    content.innerHTML = Markdown.render(message.content || "");     // escaped by the renderer
  } else {
    content.textContent = message.content;
  }
}

function renderAll() {
  $("messages").replaceChildren(...state.messages.map(messageElement));
  $("messages").scrollTop = $("messages").scrollHeight;
}

function requestMessages() {
  const system = $("system").value.trim();
  const history = state.messages.filter((m) => m.role === "user" || m.role === "assistant")
    .map((m) => ({ role: m.role, content: m.content || "" }));
  return system ? [{ role: "system", content: system }, ...history] : history;
}

// Reads an SSE stream of chat completion chunks, calling onDelta(delta) for each.
async function readStream(response, onDelta) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || String(chunk.error));
        for (const choice of chunk.choices || []) onDelta(choice.delta || {});
      }
    }
  }
}

async function send(text) {
  const user = { role: "user", content: text };
  state.messages.push(user);
  const reply = { role: "assistant", content: "", reasoning: "" };
  state.messages.push(reply);
  saveState();
  renderAll();
  const element = $("messages").lastElementChild;
  controller = new AbortController();
  setBusy(true);
  showStatus("");
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      fill(element, reply);
      $("messages").scrollTop = $("messages").scrollHeight;
    });
  };
  const body = { model: $("model").value, messages: requestMessages().slice(0, -1), stream: true };
  const temperature = parseFloat($("temperature").value);
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  if (maxTokens > 0) body.max_tokens = maxTokens;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (response.status === 401) {
      sessionStorage.removeItem(KEY_STORE);
      await loadModels();
      throw new Error("The server needs an API key.");
    }
    if (!response.ok) throw new Error(await errorText(response));
    await readStream(response, (delta) => {
      if (delta.content) reply.content += delta.content;
      const reasoning = delta.reasoning || delta.reasoning_content;
      if (reasoning) reply.reasoning += reasoning;
      redraw();
    });
  } catch (error) {
    if (error.name !== "AbortError") {
      showStatus(error.message);
      if (!reply.content) reply.content = "";
    }
  } finally {
    controller = null;
    setBusy(false);
    if (!reply.content && !reply.reasoning) state.messages.pop();
    saveState();
    renderAll();
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.dataset.busy = busy ? "true" : "false";
}

// ------------------------------------------------------------------ wiring
function restoreSettings() {
  const s = state.settings;
  if (s.system !== undefined) $("system").value = s.system;
  if (s.temperature !== undefined) $("temperature").value = s.temperature;
  if (s.maxTokens !== undefined) $("max-tokens").value = s.maxTokens;
}

document.addEventListener("DOMContentLoaded", () => {
  restoreSettings();
  renderAll();
  setBusy(false);
  loadModels();
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("new-chat").addEventListener("click", () => {
    if (controller) controller.abort();
    state.messages = [];
    saveState();
    renderAll();
  });
  $("key-entry").addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORE, $("api-key").value.trim());
    $("api-key").value = "";
    await loadModels();
  });
  for (const id of ["model", "system", "temperature", "max-tokens"]) $(id).addEventListener("change", saveState);
});
