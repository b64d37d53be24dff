// DOM for one message and one conversation-list entry. Text a user or a model wrote goes in as
// text (textContent) except an assistant's Markdown, which goes through render.js.

import { copyButton, renderMarkdown } from "./render.js";
import { textOf } from "./store.js";

const ROLE_NAMES = { user: "You", assistant: "Assistant", tool: "Tool result", system: "System", developer: "Developer" };

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

const SVG = "http://www.w3.org/2000/svg";
const ICONS = {
  rename: "M4 20h4L19 9l-4-4L4 16v4zM14 6l4 4",
  delete: "M4 7h16M9 7V4h6v3M6 7l1 13h10l1-13",
};

/** A button showing only an icon, named for screen readers and tooltips by `label`. */
function iconButton(icon, label, onClick) {
  const b = button("", onClick, "icon small");
  b.setAttribute("aria-label", label);
  b.title = label;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", ICONS[icon]);
  svg.append(path);
  b.append(svg);
  return b;
}

function button(label, onClick, className = "") {
  const b = el("button", className, label);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

/** "42 tokens · 35.1 tokens/s" for a reply's stats ({model, tokens, tokensPerSecond, finishReason}). */
export function statsLine(stats) {
  const parts = [];
  if (stats.model) parts.push(stats.model);
  if (stats.tokens != null) parts.push(`${stats.tokens} tokens`);
  if (stats.tokensPerSecond != null) parts.push(`${stats.tokensPerSecond.toFixed(1)} tokens/s`);
  if (stats.finishReason === "length") parts.push("cut at max_tokens");
  if (stats.stopped) parts.push("stopped");
  return parts.join(" · ");
}

/**
 * A message's element. `actions`: {regenerate, edit} callbacks for the last turn's buttons.
 * The returned element has `update(message, stats, streaming)` to redraw it while it streams.
 */
export function messageView(message, stats, actions = {}) {
  const root = el("article", `msg ${message.role}`);
  root.dataset.role = message.role;
  const head = el("div", "role", ROLE_NAMES[message.role] || message.role);
  const reasoning = el("details", "reasoning");
  const reasoningText = el("div", "reasoning-text");
  reasoning.append(el("summary", "", "Reasoning"), reasoningText);
  const images = el("div", "images");
  const body = el("div", message.role === "assistant" ? "content markdown" : "content plain");
  const calls = el("div", "tool-calls");
  const meta = el("div", "meta");
  const bar = el("div", "actions");
  root.append(head, reasoning, images, body, calls, meta, bar);

  root.update = (msg, st, streaming = false) => {
    root.classList.toggle("streaming", streaming);
    reasoning.hidden = !msg.reasoning_content;
    reasoningText.textContent = msg.reasoning_content || "";
    reasoning.querySelector("summary").textContent = streaming && !textOf(msg.content) ? "Reasoning..." : "Reasoning";
    images.replaceChildren(...imageParts(msg.content));
    const text = textOf(msg.content);
    if (msg.role === "assistant") renderMarkdown(body, text);
    else body.textContent = text;
    body.hidden = !text && msg.role !== "user" && !streaming;
    calls.replaceChildren(...(msg.tool_calls || []).map(toolCallView));
    if (msg.role === "tool" && msg.tool_call_id) head.textContent = `Tool result (${msg.tool_call_id})`;
    meta.textContent = st ? statsLine(st) : "";
    bar.replaceChildren();
    if (!streaming) {
      bar.append(copyButton(() => textOf(msg.content), "Copy"));
      if (actions.edit) bar.append(button("Edit", actions.edit, "edit"));
      if (actions.regenerate) bar.append(button(msg.role === "assistant" ? "Regenerate" : "Retry", actions.regenerate, "regenerate"));
    }
  };
  root.update(message, stats);
  return root;
}

function imageParts(content) {
  if (!Array.isArray(content)) return [];
  return content.filter((p) => p && p.type === "image_url").map((p) => {
    const url = (p.image_url && p.image_url.url) || "";
    if (url.startsWith("data:image/")) {
      const img = el("img");
      img.alt = "attached image";
      img.src = url;
      return img;
    }
    return el("span", "image-link", `image: ${url}`); // remote images are not loaded by the page
  });
}

function toolCallView(call) {
  const box = el("div", "tool-call");
  const fn = call.function || {};
  box.append(el("div", "tool-name", `Tool call: ${fn.name || "?"}`),
    el("div", "tool-note", "The model asked for this tool; this page does not run tools."));
  const pre = el("pre");
  let args = fn.arguments || "";
  try {
    args = JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    // partial or invalid JSON: shown as it came
  }
  pre.append(el("code", "", args));
  box.append(pre);
  return box;
}

/** The editor that replaces a user message being edited: calls onSend(text) or onCancel(). */
export function editView(text, onSend, onCancel) {
  const root = el("div", "editor");
  const area = el("textarea");
  area.value = text;
  area.rows = Math.min(12, text.split("\n").length + 1);
  area.setAttribute("aria-label", "Edit your message");
  area.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      onSend(area.value);
    } else if (event.key === "Escape") onCancel();
  });
  root.append(area, el("div", "bar"));
  root.lastChild.append(button("Cancel", onCancel), button("Send", () => onSend(area.value), "primary"));
  setTimeout(() => area.focus());
  return root;
}

/** A conversation-list entry: open on click, rename in place, delete. */
export function conversationItem(conversation, current, { open, rename, remove }) {
  const li = el("li", conversation.id === current ? "current" : "");
  const title = button(conversation.title, () => open(conversation), "title");
  title.setAttribute("aria-current", conversation.id === current ? "true" : "false");
  const renameButton = iconButton("rename", `Rename "${conversation.title}"`, () => {
    const input = el("input", "rename");
    input.value = conversation.title;
    input.setAttribute("aria-label", "New title");
    let finished = false;
    const done = (save) => {
      if (finished) return;
      finished = true;
      if (save && input.value.trim()) rename(conversation, input.value.trim());
      else li.replaceWith(conversationItem(conversation, current, { open, rename, remove }));
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") done(true);
      else if (event.key === "Escape") done(false);
    });
    input.addEventListener("blur", () => done(true));
    title.replaceWith(input);
    input.focus();
    input.select();
  });
  const deleteButton = iconButton("delete", `Delete "${conversation.title}"`, () => remove(conversation));
  li.append(title, renameButton, deleteButton);
  return li;
}
