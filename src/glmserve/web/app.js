// The chat page: conversations in the sidebar, the open one in the middle, the composer below.
// Replies stream from POST /v1/chat/completions; Stop aborts the request (the server then
// aborts the generation); everything is kept in this browser (store.js).

import { Api } from "./api.js";
import { Attachments } from "./attachments.js";
import { fillSettingsForm, readSettingsForm } from "./settings-form.js";
import * as store from "./store.js";
import { conversationItem, editView, messageView } from "./views.js";

const $ = (id) => document.getElementById(id);
const ui = Object.fromEntries([
  "sidebar", "scrim", "conversations", "new-chat", "import-button", "import-file", "export-button", "open-sidebar",
  "close-sidebar", "model", "title", "settings-button", "banner", "messages", "composer", "attachments",
  "attach-button", "attach-file", "input", "send", "stop", "settings", "settings-form", "settings-error",
  "settings-cancel", "forget-key", "key-dialog", "key-form", "key-input", "key-error",
].map((id) => [id.replace(/-(\w)/g, (_, c) => c.toUpperCase()), $(id)]));

const state = {
  conversations: store.loadConversations(),
  current: null, // the open conversation; null: a new one, stored once its first message is sent
  models: [],
  settings: store.loadSettings(),
  apiKey: store.loadApiKey(),
  needsKey: false,
  generation: null, // the AbortController of the reply being streamed
};
const api = new Api(() => state.apiKey);
const attachments = new Attachments(ui.attachments, (message) => showBanner(message));

// ---- banner, storage ------------------------------------------------------------------------

function showBanner(text, action = null) {
  ui.banner.replaceChildren(document.createTextNode(text));
  if (action) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = action.label;
    b.addEventListener("click", action.run);
    ui.banner.append(" ", b);
  }
  ui.banner.hidden = false;
}

const clearBanner = () => (ui.banner.hidden = true);

function persist(conversation = state.current) {
  if (conversation) conversation.updated = Date.now();
  state.conversations.sort((a, b) => b.updated - a.updated);
  if (!store.saveConversations(state.conversations)) {
    showBanner("This browser's storage is full: the conversation is not saved. Export and delete old conversations.");
  }
}

// ---- models and the API key -----------------------------------------------------------------

function currentCard() {
  return state.models.find((m) => m.id === ui.model.value);
}

const takesImages = () => Boolean(currentCard() && (currentCard().capabilities || []).includes("vision"));

function askKey(message = "") {
  ui.keyError.textContent = message;
  ui.keyInput.value = "";
  if (!ui.keyDialog.open) ui.keyDialog.showModal();
  ui.keyInput.focus();
}

async function loadModels() {
  try {
    state.models = await api.models();
  } catch (err) {
    if (err.status === 401) {
      state.needsKey = true;
      ui.forgetKey.hidden = !state.apiKey;
      askKey(state.apiKey ? "The server refused this key." : "");
      showBanner("This server needs an API key.", { label: "Enter the key", run: () => askKey() });
      return false;
    }
    showBanner(`Cannot list the models: ${err.message}`, { label: "Try again", run: loadModels });
    return false;
  }
  clearBanner();
  ui.forgetKey.hidden = !state.apiKey;
  const saved = store.loadModel();
  const chosen = ui.model.value || saved;
  ui.model.replaceChildren(...state.models.map((card) => {
    const option = document.createElement("option");
    option.value = card.id;
    option.textContent = modelLabel(card);
    return option;
  }));
  if (state.models.some((m) => m.id === chosen)) ui.model.value = chosen;
  updateAttachButton();
  if (state.models.filter((m) => m.status && !m.parent).length > 1) followModels();
  return true;
}

/** "name", "name (unloaded)", "name (loading…)", "tuned (LoRA adapter of base)". */
function modelLabel(card) {
  if (card.parent) return `${card.id} (LoRA adapter of ${card.parent})`;
  if (card.status === "loading") return `${card.id} (loading…)`;
  return card.status && card.status !== "loaded" ? `${card.id} (${card.status})` : card.id;
}

// A server of several models loads and unloads them as requests come: the picker follows
// GET /models/events, and reads the list again when a model is loaded or unloaded (its LoRA
// adapters and capabilities come and go with it). One follower for the page's life; it starts
// again 5 s after the stream drops.
let following = false;

async function followModels() {
  if (following) return;
  following = true;
  try {
    for await (const event of api.modelEvents()) {
      const card = state.models.find((m) => m.id === event.model && !m.parent);
      if (!card || card.status === event.status) continue;
      card.status = event.status;
      const option = [...ui.model.options].find((o) => o.value === card.id);
      if (option) option.textContent = modelLabel(card);
      if (event.status !== "loading") loadModels(); // the follower goes on: `following` is set
    }
  } catch {
    // the server went away or restarted: try again in a while
  }
  following = false;
  setTimeout(followModels, 5000);
}

ui.keyForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  state.apiKey = ui.keyInput.value.trim();
  store.saveApiKey(state.apiKey);
  if (await loadModels()) ui.keyDialog.close();
});

ui.forgetKey.addEventListener("click", () => {
  state.apiKey = "";
  store.saveApiKey("");
  ui.settings.close();
  loadModels();
});

ui.model.addEventListener("change", () => {
  store.saveModel(ui.model.value);
  updateAttachButton();
});

// ---- rendering ------------------------------------------------------------------------------

function renderList() {
  const handlers = { open: openConversation, rename: renameConversation, remove: deleteConversation };
  const current = state.current && state.current.id;
  ui.conversations.replaceChildren(...state.conversations.map((c) => conversationItem(c, current, handlers)));
}

function systemView(text) {
  const details = document.createElement("details");
  details.className = "system-prompt";
  const summary = document.createElement("summary");
  summary.textContent = "System prompt";
  const body = document.createElement("div");
  body.textContent = text;
  details.append(summary, body);
  return details;
}

function renderConversation() {
  const conv = state.current;
  ui.title.textContent = conv ? conv.title : "New chat";
  document.title = conv ? `${conv.title} - glmserve` : "glmserve";
  if (!conv || (!conv.messages.length && !conv.system)) {
    const empty = document.createElement("div");
    empty.className = "empty";
    empty.textContent = "Ask anything. Replies stream from this server's model.";
    ui.messages.replaceChildren(empty);
    return;
  }
  const views = conv.system ? [systemView(conv.system)] : [];
  const last = conv.messages.length - 1;
  const lastUser = conv.messages.map((m) => m.role).lastIndexOf("user");
  conv.messages.forEach((message, i) => {
    const actions = {};
    if (i === lastUser) actions.edit = () => startEdit(i);
    if (i === last && (message.role === "assistant" || message.role === "user")) actions.regenerate = regenerate;
    views.push(messageView(message, conv.stats[i], actions));
  });
  ui.messages.replaceChildren(...views);
  scrollToEnd(true);
}

function scrollToEnd(force = false) {
  const box = ui.messages;
  const nearEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 120;
  if (force || nearEnd) box.scrollTop = box.scrollHeight;
}

function showError(err) {
  if (err.status === 401) {
    askKey("The server refused the key.");
    return;
  }
  const box = document.createElement("div");
  box.className = "error-msg";
  box.setAttribute("role", "alert");
  box.textContent = err.message;
  ui.messages.append(box);
  scrollToEnd(true);
}

// ---- conversations --------------------------------------------------------------------------

function openConversation(conversation) {
  stopGeneration();
  state.current = conversation;
  closeSidebar();
  renderList();
  renderConversation();
}

function newChat() {
  stopGeneration();
  state.current = null;
  closeSidebar();
  renderList();
  renderConversation();
  ui.input.focus();
}

function renameConversation(conversation, title) {
  conversation.title = title;
  persist(conversation);
  renderList();
  if (conversation === state.current) ui.title.textContent = title;
}

function deleteConversation(conversation) {
  if (!confirm(`Delete "${conversation.title}"?`)) return;
  if (conversation === state.current) {
    stopGeneration();
    state.current = null;
    renderConversation();
  }
  state.conversations = state.conversations.filter((c) => c !== conversation);
  persist(null);
  renderList();
}

function exportCurrent() {
  if (!state.current) {
    showBanner("Nothing to export: open a conversation first.");
    return;
  }
  const blob = new Blob([store.exportConversation(state.current)], { type: "application/json" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `${state.current.title.replace(/[^\w.-]+/g, "-").replace(/^-+|-+$/g, "") || "chat"}.json`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
}

async function importFile(file) {
  try {
    const conversation = store.importConversation(await file.text());
    state.conversations.unshift(conversation);
    persist(conversation);
    clearBanner();
    openConversation(conversation);
  } catch (err) {
    showBanner(`Cannot import ${file.name}: ${err.message}`);
  }
}

// ---- sending and streaming ------------------------------------------------------------------

function requestBody(conv) {
  const s = state.settings;
  const head = conv.system ? [{ role: "system", content: conv.system }] : [];
  const body = { model: ui.model.value, messages: [...head, ...conv.messages], stream_options: { include_usage: true } };
  for (const name of ["temperature", "top_p", "max_tokens"]) if (s[name] != null) body[name] = s[name];
  return { ...body, ...s.extra };
}

function mergeToolCall(calls, delta) {
  const index = delta.index ?? calls.length;
  const call = (calls[index] ||= { id: "", type: "function", function: { name: "", arguments: "" } });
  if (delta.id) call.id = delta.id;
  if (delta.function && delta.function.name) call.function.name += delta.function.name;
  if (delta.function && delta.function.arguments) call.function.arguments += delta.function.arguments;
}

function setGenerating(controller) {
  state.generation = controller;
  document.body.classList.toggle("generating", Boolean(controller));
  ui.send.hidden = Boolean(controller);
  ui.stop.hidden = !controller;
}

function stopGeneration() {
  if (state.generation) state.generation.abort();
}

/** Streams the assistant's reply to `conv` (whose last message is the user's) into the view,
 * then stores it with its stats; a stopped reply is kept as far as it came. */
async function generate(conv) {
  if (!ui.model.value) {
    showBanner("No model to ask: the server's model list could not be read.", { label: "Try again", run: loadModels });
    return;
  }
  const reply = { role: "assistant", content: "" };
  const stats = { model: ui.model.value };
  const view = messageView(reply, stats);
  view.update(reply, stats, true);
  ui.messages.querySelector(".empty")?.remove();
  ui.messages.append(view);
  scrollToEnd(true);
  const controller = new AbortController();
  setGenerating(controller);
  const calls = [];
  let first = 0, last = 0, error = null, queued = false;
  const redraw = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      view.update(reply, stats, true);
      scrollToEnd();
    });
  };
  try {
    for await (const chunk of api.chat(requestBody(conv), controller.signal)) {
      if (chunk.usage) stats.tokens = chunk.usage.completion_tokens;
      if (chunk.model) stats.model = chunk.model;
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      const delta = choice.delta || {};
      if (delta.content || delta.reasoning_content || delta.tool_calls) {
        last = performance.now();
        first ||= last;
      }
      if (delta.content) reply.content += delta.content;
      if (delta.reasoning_content) reply.reasoning_content = (reply.reasoning_content || "") + delta.reasoning_content;
      for (const d of delta.tool_calls || []) mergeToolCall(calls, d);
      if (calls.length) reply.tool_calls = calls;
      if (choice.finish_reason) stats.finishReason = choice.finish_reason;
      redraw();
    }
  } catch (err) {
    if (err.name === "AbortError") stats.stopped = true;
    else error = err;
  }
  if (state.generation === controller) setGenerating(null);
  if (stats.tokens > 1 && last > first) stats.tokensPerSecond = (stats.tokens - 1) / ((last - first) / 1000);
  if (reply.content || reply.reasoning_content || reply.tool_calls) {
    if (reply.tool_calls && !reply.content) reply.content = null;
    conv.messages.push(reply);
    conv.stats[conv.messages.length - 1] = stats;
    persist(conv);
    renderList();
  }
  if (conv === state.current) {
    renderConversation();
    if (error) showError(error);
  }
}

function userContent(text, images) {
  if (!images.length) return text;
  return [...images.map((url) => ({ type: "image_url", image_url: { url } })), { type: "text", text }];
}

async function send() {
  const text = ui.input.value;
  if (state.generation || (!text.trim() && !attachments.count)) return;
  if (!state.current) {
    state.current = store.newConversation(state.settings.system);
    state.conversations.unshift(state.current);
  }
  const conv = state.current;
  conv.messages.push({ role: "user", content: userContent(text, attachments.take()) });
  if (conv.title === "New chat") conv.title = store.titleFrom(text || "Image");
  ui.input.value = "";
  autosize();
  persist(conv);
  renderList();
  renderConversation();
  await generate(conv);
}

async function regenerate() {
  const conv = state.current;
  if (!conv || state.generation) return;
  if (conv.messages.at(-1).role === "assistant") {
    conv.messages.pop();
    delete conv.stats[conv.messages.length];
  }
  renderConversation();
  await generate(conv);
}

function startEdit(index) {
  const conv = state.current;
  if (state.generation) return;
  const old = conv.messages[index];
  const images = Array.isArray(old.content) ? old.content.filter((p) => p.type === "image_url").map((p) => p.image_url.url) : [];
  const view = ui.messages.querySelectorAll("article.msg")[index];
  view.querySelector(".content").replaceWith(editView(store.textOf(old.content), async (text) => {
    conv.messages = conv.messages.slice(0, index);
    for (const key of Object.keys(conv.stats)) if (Number(key) >= index) delete conv.stats[key];
    conv.messages.push({ role: "user", content: userContent(text, images) });
    persist(conv);
    renderConversation();
    await generate(conv);
  }, renderConversation));
  view.querySelector(".actions").replaceChildren();
}

// ---- images and settings ------------------------------------------------------------------

function updateAttachButton() {
  ui.attachButton.hidden = !takesImages();
}

function addImages(files) {
  if (!takesImages()) showBanner(`${ui.model.value || "This model"} does not take images.`);
  else attachments.add(files);
}

function openSettings() {
  fillSettingsForm(state.settings);
  ui.settingsError.textContent = "";
  ui.forgetKey.hidden = !state.apiKey;
  ui.settings.showModal();
}

ui.settingsForm.addEventListener("submit", (event) => {
  event.preventDefault();
  try {
    state.settings = readSettingsForm();
  } catch (err) {
    ui.settingsError.textContent = err.message;
    return;
  }
  store.saveSettings(state.settings);
  ui.settings.close();
});

// ---- composer and the rest of the wiring ----------------------------------------------------

function autosize() {
  ui.input.style.height = "auto";
  ui.input.style.height = `${Math.min(ui.input.scrollHeight, 240)}px`;
}

function closeSidebar() {
  ui.sidebar.classList.remove("open");
  ui.scrim.hidden = true;
}

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
ui.input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
ui.input.addEventListener("input", autosize);
ui.input.addEventListener("paste", (event) => {
  const images = [...(event.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
  if (images.length) {
    event.preventDefault();
    addImages(images);
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && state.generation && !document.querySelector("dialog[open]")) stopGeneration();
});
ui.stop.addEventListener("click", stopGeneration);
ui.attachButton.addEventListener("click", () => ui.attachFile.click());
ui.attachFile.addEventListener("change", () => {
  addImages([...ui.attachFile.files]);
  ui.attachFile.value = "";
});
ui.newChat.addEventListener("click", newChat);
ui.importButton.addEventListener("click", () => ui.importFile.click());
ui.importFile.addEventListener("change", () => {
  if (ui.importFile.files[0]) importFile(ui.importFile.files[0]);
  ui.importFile.value = "";
});
ui.exportButton.addEventListener("click", exportCurrent);
ui.settingsButton.addEventListener("click", openSettings);
ui.settingsCancel.addEventListener("click", () => ui.settings.close());
ui.openSidebar.addEventListener("click", () => {
  ui.sidebar.classList.add("open");
  ui.scrim.hidden = false;
});
ui.closeSidebar.addEventListener("click", closeSidebar);
ui.scrim.addEventListener("click", closeSidebar);

state.current = state.conversations[0] || null;
renderList();
renderConversation();
loadModels().then(() => document.body.classList.add("ready"));
ui.input.focus();
