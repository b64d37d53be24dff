// Model output as HTML: Markdown (marked) -> sanitized (DOMPurify) -> code highlighted
// (highlight.js), with a copy button on each code block. Model output is untrusted: nothing it
// writes may run script, load a remote resource (the page's Content-Security-Policy blocks
// those too) or style the page.

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";
import hljs from "./vendor/highlight.min.js";

const markdown = new Marked({ gfm: true, breaks: false });
hljs.configure({ ignoreUnescapedHTML: true });

const PURIFY = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option"],
  FORBID_ATTR: ["style"],
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

/** Markdown `text` as sanitized HTML (a string safe to assign to innerHTML). */
export function markdownToSafeHtml(text) {
  return DOMPurify.sanitize(markdown.parse(text), PURIFY);
}

/** Copies `text` to the clipboard (the Clipboard API, or a selection where that is missing:
 * it needs a secure context, which a server on a LAN address over http is not). */
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.className = "offscreen";
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

/** A small button that copies `getText()` and says so for a moment. */
export function copyButton(getText, label = "Copy") {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = label;
  button.addEventListener("click", async () => {
    try {
      await copyText(getText());
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => (button.textContent = label), 1500);
  });
  return button;
}

/** Renders Markdown `text` into `element`: sanitized, highlighted, copy buttons on code. */
export function renderMarkdown(element, text) {
  element.innerHTML = markdownToSafeHtml(text);
  for (const code of element.querySelectorAll("pre > code")) {
    const lang = [...code.classList].find((c) => c.startsWith("language-"));
    if (!lang || hljs.getLanguage(lang.slice(9))) hljs.highlightElement(code);
    const source = code.textContent;
    code.parentElement.classList.add("code");
    code.parentElement.prepend(copyButton(() => source));
  }
}
