// What the page keeps in the browser (localStorage): conversations, settings, the chosen model
// and the API key. A conversation is
//   {id, title, created, updated, system, messages, stats}
// with `system` the system prompt (or "") and `messages` the OpenAI-format turns after it;
// `stats[i]` describes reply `messages[i]` ({model, tokens, tokensPerSecond, finishReason}).
// Export and import use `glmserve chat`'s /save format: {"messages": [system?, ...turns]}.

const KEYS = {
  conversations: "glmserve.conversations",
  settings: "glmserve.settings",
  model: "glmserve.model",
  apiKey: "glmserve.apiKey",
};
const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);

export const DEFAULT_SETTINGS = { system: "", temperature: null, top_p: null, max_tokens: null, extra: {} };

function read(key, fallback) {
  try {
    const text = localStorage.getItem(key);
    return text === null ? fallback : JSON.parse(text);
  } catch {
    return fallback;
  }
}

/** Stores `value` under `key`; false when the browser's storage is full. */
function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false;
  }
}

export const loadSettings = () => ({ ...DEFAULT_SETTINGS, ...read(KEYS.settings, {}) });
export const saveSettings = (settings) => write(KEYS.settings, settings);
export const loadModel = () => read(KEYS.model, null);
export const saveModel = (model) => write(KEYS.model, model);
export const loadApiKey = () => read(KEYS.apiKey, "");
export const saveApiKey = (key) => (key ? write(KEYS.apiKey, key) : localStorage.removeItem(KEYS.apiKey));

/** The stored conversations, most recently updated first. */
export function loadConversations() {
  const list = read(KEYS.conversations, []);
  return Array.isArray(list) ? list.filter((c) => c && Array.isArray(c.messages)).sort((a, b) => b.updated - a.updated) : [];
}

/** Stores every conversation; false when they do not fit the browser's storage. */
export const saveConversations = (list) => write(KEYS.conversations, list);

export function newConversation(system = "") {
  const now = Date.now();
  const id = crypto.randomUUID ? crypto.randomUUID() : `${now}-${Math.random().toString(16).slice(2)}`;
  return { id, title: "New chat", created: now, updated: now, system, messages: [], stats: {} };
}

/** The text of a message's content: a string, or the text parts of a list. */
export function textOf(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.filter((p) => p && p.type === "text").map((p) => p.text).join("\n");
}

export function titleFrom(text) {
  const line = text.trim().split("\n")[0] || "New chat";
  return line.length > 60 ? `${line.slice(0, 57)}...` : line;
}

/** A conversation as OpenAI-format JSON text: {"messages": [...]}, as `glmserve chat` /save writes. */
export function exportConversation(conversation) {
  const head = conversation.system ? [{ role: "system", content: conversation.system }] : [];
  return JSON.stringify({ messages: [...head, ...conversation.messages] }, null, 2);
}

/**
 * A new conversation from exported JSON text: {"messages": [...]} or a bare message list.
 * The first system message becomes its system prompt. Throws Error naming what is wrong.
 */
export function importConversation(text) {
  let data;
  try {
    data = JSON.parse(text);
  } catch (err) {
    throw new Error(`not JSON: ${err.message}`);
  }
  const messages = Array.isArray(data) ? data : data && data.messages;
  if (!Array.isArray(messages)) throw new Error('expected {"messages": [...]} or a list of messages');
  messages.forEach((m, i) => {
    const ok = m && typeof m === "object" && ROLES.has(m.role) &&
      (typeof m.content === "string" || Array.isArray(m.content) || (m.content == null && m.role === "assistant"));
    if (!ok) throw new Error(`message ${i}: expected a role (${[...ROLES].join(", ")}) and a content`);
  });
  const system = messages.find((m) => m.role === "system");
  const conversation = newConversation(system ? textOf(system.content) : "");
  conversation.messages = messages.filter((m) => m.role !== "system");
  const firstUser = conversation.messages.find((m) => m.role === "user");
  conversation.title = firstUser ? titleFrom(textOf(firstUser.content)) : "Imported chat";
  return conversation;
}
