// A small Markdown renderer for model output that cannot run script.
//
// It never parses HTML: every character of the reply reaches the page as a text node
// (createTextNode / textContent), and the only elements are the ones built here. So
// "<img onerror=…>" or "<script>" in a reply shows as those characters, nothing more.
// Links become <a> only for http: and https: URLs.
//
// Supported: fenced code (``` or ~~~, also while still open mid-stream), inline code,
// **bold**, *italic* / _italic_, ~~strike~~, # headings, - * + and 1. lists,
// > quotes, --- rules, [text](url) and bare http(s) URLs. A single newline is a line break.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w#+.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const BULLET = /^\s{0,3}[-*+]\s+(.*)$/;
const NUMBERED = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;

export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) { i += 1; continue; }
    if ((m = FENCE.exec(line))) { i = codeBlock(out, lines, i, m[1], m[2]); continue; }
    if ((m = HEADING.exec(line))) { out.append(el(`h${m[1].length}`, inline(m[2]))); i += 1; continue; }
    if (RULE.test(line)) { out.append(el("hr")); i += 1; continue; }
    if (BULLET.test(line)) { i = list(out, lines, i, "ul", BULLET); continue; }
    if (NUMBERED.test(line)) { i = list(out, lines, i, "ol", NUMBERED); continue; }
    if (QUOTE.test(line)) { i = quote(out, lines, i); continue; }
    i = paragraph(out, lines, i);
  }
  return out;
}

function codeBlock(out, lines, start, fence, lang) {
  const body = [];
  let i = start + 1;
  const closing = new RegExp(`^ {0,3}${fence[0] === "`" ? "`" : "~"}{${fence.length},}\\s*$`);
  while (i < lines.length && !closing.test(lines[i])) body.push(lines[i++]);
  const code = el("code");
  code.textContent = body.join("\n");
  if (lang) code.dataset.lang = lang;
  const head = el("div", [el("span", [lang || "code"]), copyButton(code)]);
  head.className = "code-head";
  const block = el("div", [head, el("pre", [code])]);
  block.className = "code-block";
  out.append(block);
  return i + 1; // past the closing fence (or the end, while the reply is still streaming)
}

function copyButton(code) {
  const button = el("button", ["Copy"]);
  button.type = "button";
  button.className = "copy";
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(code.textContent);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  return button;
}

function list(out, lines, start, tag, pattern) {
  const node = el(tag);
  let i = start;
  let m;
  if (tag === "ol") {
    const first = Number(pattern.exec(lines[i])[1]);
    if (first !== 1) node.start = first;
  }
  while (i < lines.length && (m = pattern.exec(lines[i]))) {
    const parts = [m[tag === "ol" ? 2 : 1]];
    i += 1;
    // An indented line that is not itself an item continues the item above it.
    while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !BULLET.test(lines[i]) && !NUMBERED.test(lines[i])) {
      parts.push(lines[i++].trim());
    }
    node.append(el("li", inlineLines(parts)));
  }
  out.append(node);
  return i;
}

function quote(out, lines, start) {
  const parts = [];
  let i = start;
  let m;
  while (i < lines.length && (m = QUOTE.exec(lines[i]))) { parts.push(m[1]); i += 1; }
  const block = el("blockquote");
  block.append(renderMarkdown(parts.join("\n")));
  out.append(block);
  return i;
}

function paragraph(out, lines, start) {
  const parts = [];
  let i = start;
  while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) parts.push(lines[i++]);
  out.append(el("p", inlineLines(parts)));
  return i;
}

function startsBlock(line) {
  return [FENCE, HEADING, RULE, BULLET, NUMBERED, QUOTE].some((re) => re.test(line));
}

function inlineLines(parts) {
  const nodes = [];
  parts.forEach((part, n) => {
    if (n > 0) nodes.push(el("br"));
    nodes.push(...inline(part));
  });
  return nodes;
}

// -- inline ----------------------------------------------------------------------------------------------
// Each rule: a pattern and how to build its node. At every step the earliest match wins;
// on a tie, the rule listed first (code before links before emphasis).
const INLINE = [
  { re: /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/, make: (m) => el("code", [m[2]]) },
  { re: /\[([^\]\n]+)\]\(\s*<?([^)\s>]+)>?\s*\)/, make: (m) => link(m[2], m[1], m[0]) },
  { re: /\bhttps?:\/\/[^\s<>()[\]]*[^\s<>()[\].,;:!?'"*_~]/, make: (m) => link(m[0], null, m[0]) },
  { re: /\*\*(?=\S)([\s\S]*?\S)\*\*/, make: (m) => el("strong", inline(m[1])) },
  { re: /(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)/, make: (m) => el("strong", inline(m[1])) },
  { re: /~~(?=\S)([\s\S]*?\S)~~/, make: (m) => el("del", inline(m[1])) },
  { re: /\*(?=[^\s*])([^*]*?[^\s*])\*/, make: (m) => el("em", inline(m[1])) },
  { re: /(?<!\w)_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/, make: (m) => el("em", inline(m[1])) },
];

export function inline(text) {
  const nodes = [];
  let rest = text;
  while (rest) {
    let best = null;
    for (const rule of INLINE) {
      const m = rule.re.exec(rest);
      if (m && (best === null || m.index < best.m.index)) best = { m, rule };
    }
    if (best === null) { nodes.push(rest); break; }
    if (best.m.index > 0) nodes.push(rest.slice(0, best.m.index));
    nodes.push(best.rule.make(best.m));
    rest = rest.slice(best.m.index + best.m[0].length);
  }
  return nodes;
}

function link(href, label, raw) {
  const url = safeUrl(href);
  if (url === null) return raw; // not http(s): shown as the characters it was written with
  const a = el("a", label === null ? [href] : inline(label));
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  return a;
}

export function safeUrl(href) {
  try {
    const url = new URL(href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

// An element whose children are nodes or strings; strings become text nodes, never markup.
function el(tag, children = []) {
  const node = document.createElement(tag);
  node.append(...children);
  return node;
}
