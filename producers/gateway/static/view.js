// Building the elements of a conversation: a user's message and a reply with its version switcher.
// Model text only ever reaches the page through renderMarkdown (text nodes) or textContent.

import { renderMarkdown } from "./markdown.js";

const STATUS = {
  generating: "Writing…",
  stopped: "Stopped",
  length: "Cut off at the length limit",
  failed: "Failed",
  blocked: "Removed by the content rules",
};

const LINK = {
  reconnecting: "Connection lost. Reconnecting… the reply will continue where it left off.",
  lost: "Still can't reach Parley. Trying again every few seconds…",
};

export function userView(msg) {
  const node = el("article", "msg user");
  const bubble = el("div", "bubble");
  bubble.textContent = msg.content; // what the person typed, shown as typed (a blocked one: the notice)
  node.classList.toggle("blocked", msg.status === "blocked");
  node.append(bubble);
  return node;
}

// versions: {index, count, go(delta)}; actions: {regenerate() | null}
export function replyView(msg, versions, actions) {
  const node = el("article", "msg assistant");
  node.dataset.generationId = msg.generation_id || "";
  const body = el("div", "md");
  const thinking = el("p", "thinking");
  thinking.textContent = "…";
  const notice = el("p", "notice");
  notice.setAttribute("role", "status");
  const meta = el("footer", "reply-meta");
  if (versions.count > 1) meta.append(switcher(versions));
  meta.append(el("span", "model"), el("span", "status"));
  if (actions.regenerate) {
    const again = button("Regenerate", "regenerate", actions.regenerate);
    again.title = "Write another reply to the same message (with the model picked above)";
    meta.append(again);
  }
  node.append(body, thinking, notice, meta);
  paintReply(node, msg);
  return node;
}

// Bring a reply's element up to date with its message (called on every streamed chunk).
export function paintReply(node, msg) {
  node.querySelector(".md").replaceChildren(renderMarkdown(msg.content || ""));
  node.querySelector(".thinking").hidden = Boolean(msg.content) || msg.status !== "generating";
  node.classList.toggle("generating", msg.status === "generating");
  node.setAttribute("aria-busy", String(msg.status === "generating"));
  node.classList.toggle("failed", msg.status === "failed");
  node.classList.toggle("blocked", msg.status === "blocked");
  const notice = [msg.notice, LINK[msg.link]].filter(Boolean).join(" ");
  node.querySelector(".notice").textContent = notice;
  node.querySelector(".notice").hidden = !notice;
  node.classList.toggle("reconnecting", Boolean(LINK[msg.link]));
  node.querySelector(".status").textContent = STATUS[msg.status] || "";
  node.querySelector(".model").textContent = modelLabel(msg);
}

export function modelLabel(msg) {
  if (!msg.pool && !msg.model) return "";
  const label = [msg.pool, msg.model].filter(Boolean).join(" · ");
  return msg.route_reason === "overflow" ? `${label} (the requested model was busy)` : label;
}

function switcher({ index, count, go }) {
  const box = el("span", "versions");
  const prev = button("‹", "prev", () => go(-1));
  const next = button("›", "next", () => go(+1));
  prev.setAttribute("aria-label", "Previous version");
  next.setAttribute("aria-label", "Next version");
  prev.disabled = index === 0;
  next.disabled = index === count - 1;
  const label = el("span", "version-label");
  label.textContent = `${index + 1}/${count}`;
  box.append(prev, label, next);
  return box;
}

export function button(text, className, onClick) {
  const b = el("button", className);
  b.type = "button";
  b.textContent = text;
  b.addEventListener("click", onClick);
  return b;
}

export function el(tag, className = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}
