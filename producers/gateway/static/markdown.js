// Model output as Markdown that cannot run script: marked (GFM: tables, fenced and indented code,
// strike-through, autolinks), then DOMPurify, then highlight.js on code. All three are vendored
// from npm under ./vendor/ (no build step, nothing loaded from elsewhere).
//
// Three walls, each enough on its own for the page's promise:
// 1. marked's HTML tokens are rendered as their own escaped characters, so "<img onerror=…>" or
//    "<script>" in a reply shows as those characters, like any other text.
// 2. DOMPurify then keeps only the tags and attributes listed below, and only http(s) and mailto
//    links; a link to anything else becomes plain text.
// 3. The page's Content-Security-Policy runs no inline script or handler, whatever got through.
// Highlighted code is sanitised again (spans with classes only) before it reaches the page.

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.js";
import hljs from "./vendor/highlight.min.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escape = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

const marked = new Marked({
  gfm: true,
  breaks: true, // a single newline is a line break, as people (and models) write chat
  renderer: {
    html({ text, block }) {
      return block ? `<p>${escape(text)}</p>` : escape(text);
    },
    // The page loads no image from elsewhere (img-src 'self'): an image is shown as a link to it.
    image({ href, text }) {
      return `<a href="${escape(href)}">${escape(text || href)}</a>`;
    },
  },
});

const ALLOWED_TAGS = ["a", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
  "i", "li", "ol", "p", "pre", "s", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul", "input"];
const POLICY = {
  ALLOWED_TAGS, ALLOWED_ATTR: ["href", "title", "class", "align", "start", "type", "checked", "disabled"],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i, RETURN_DOM_FRAGMENT: true,
  // DOMPurify tests every attribute it does not know as URI-safe against ALLOWED_URI_REGEXP, so type="checkbox"
  // was dropped and with it every task-list box. A type is never a URL; inputs other than checkboxes go below.
  ADD_URI_SAFE_ATTR: ["type"],
};
const CODE_POLICY = { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"], RETURN_DOM_FRAGMENT: true };

export function renderMarkdown(text) {
  const fragment = DOMPurify.sanitize(marked.parse(String(text)), POLICY);
  for (const node of [...fragment.childNodes]) { // marked's newlines between blocks: not part of the text
    if (node.nodeType === Node.TEXT_NODE && !node.textContent.trim()) node.remove();
  }
  for (const input of fragment.querySelectorAll("input")) { // GFM task lists only: a box, shown, never ticked here
    if (input.type !== "checkbox" || !input.parentElement?.closest("li")) {
      input.remove();
      continue;
    }
    input.disabled = true;
    input.closest("li").classList.add("task");
  }
  for (const link of fragment.querySelectorAll("a")) finishLink(link);
  for (const table of fragment.querySelectorAll("table")) wrap(table, "table-wrap");
  for (const code of fragment.querySelectorAll("pre > code")) codeBlock(code);
  return fragment;
}

function finishLink(link) {
  const href = link.getAttribute("href") || "";
  if (!/^(https?:|mailto:)/i.test(href)) { // DOMPurify dropped it (javascript:, data:, …): plain text
    link.replaceWith(document.createTextNode(link.textContent));
    return;
  }
  link.rel = "noopener noreferrer nofollow";
  link.target = "_blank";
}

function wrap(node, className) {
  const box = document.createElement("div");
  box.className = className;
  node.replaceWith(box);
  box.append(node);
  return box;
}

// Highlight with the fence's language (when highlight.js knows it; guessing is slow and often wrong,
// so unnamed code stays plain) and add a header with the language and a Copy button.
function codeBlock(code) {
  const source = code.textContent;
  const named = /language-([\w#+.-]+)/.exec(code.className)?.[1];
  if (named && hljs.getLanguage(named)) {
    const { value } = hljs.highlight(source, { language: named, ignoreIllegals: true });
    code.replaceChildren(DOMPurify.sanitize(value, CODE_POLICY));
  }
  code.classList.add("hljs");
  const block = wrap(code.parentElement, "code-block");
  const head = document.createElement("div");
  head.className = "code-head";
  const label = document.createElement("span");
  label.textContent = named || "code";
  head.append(label, copyButton(() => source, "Copy code"));
  block.prepend(head);
}

// A button that copies text() to the clipboard and says so for a moment.
export function copyButton(text, label = "Copy") {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = "Copy";
  button.setAttribute("aria-label", label);
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text());
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  return button;
}
