// Building the elements of a conversation: a user's message (with its edit box and versions) and a
// reply with its version switcher. Model text only ever reaches the page through renderMarkdown
// (sanitised) or textContent. Every control carries a data-focus key, so the page can put focus
// back on "the same" control after it redraws.

import { copyButton, renderMarkdown } from "./markdown.js";

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

// versions: {index, count, go(delta)}; actions: {edit(text) | null, editing, setEditing(bool)}; at: group index
export function userView(msg, versions, actions, at) {
  const node = el("article", "msg user");
  node.dataset.messageId = msg.message_id || "";
  if (actions.editing) {
    node.append(editBox(msg, actions, at));
    return node;
  }
  const bubble = el("div", "bubble");
  bubble.textContent = msg.content; // what the person typed, shown as typed (a blocked one: the notice)
  node.append(speaker("You said:"));
  node.classList.toggle("blocked", msg.status === "blocked");
  const meta = el("footer", "user-meta");
  if (versions.count > 1) meta.append(switcher(versions, "message", `u${at}`));
  meta.append(focusable(copyButton(() => msg.content, "Copy message"), `ucopy${at}`));
  if (actions.edit) {
    const edit = focusable(button("Edit", "edit", () => actions.setEditing(true)), `edit${at}`);
    edit.setAttribute("aria-label", "Edit message");
    edit.title = "Change this message and send it again; the old version stays a click away";
    meta.append(edit);
  }
  node.append(bubble, meta);
  return node;
}

function editBox(msg, actions, at) {
  const form = el("form", "edit-box");
  const area = el("textarea");
  area.value = msg.content;
  area.rows = Math.min(8, Math.max(2, msg.content.split("\n").length));
  area.setAttribute("aria-label", "Edit message");
  area.dataset.focus = `editing${at}`;
  const save = button("Send", "primary", () => null);
  save.type = "submit";
  const cancel = button("Cancel", "cancel", () => actions.setEditing(false));
  form.append(area, el("div", "edit-actions"));
  form.lastChild.append(cancel, save);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (area.value.trim()) actions.edit(area.value);
  });
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); form.requestSubmit(); }
    if (e.key === "Escape") { e.stopPropagation(); actions.setEditing(false); }
  });
  return form;
}

// versions: {index, count, go(delta)}; actions: {regenerate() | null, busy}
export function replyView(msg, versions, actions, at) {
  const node = el("article", "msg assistant");
  node.dataset.generationId = msg.generation_id || "";
  const route = el("p", "route"); // a fallback (another pool, a prepared reply), said from the reply's start
  const body = el("div", "md");
  const thinking = el("p", "thinking");
  thinking.textContent = "…";
  const notice = el("p", "notice");
  notice.setAttribute("role", "status");
  const meta = el("footer", "reply-meta");
  if (versions.count > 1) meta.append(switcher(versions, "version", `r${at}`));
  meta.append(el("span", "model"), el("span", "status"));
  const copy = focusable(copyButton(() => msg.content || "", "Copy reply"), `rcopy${at}`);
  copy.classList.add("copy-reply");
  meta.append(copy);
  if (actions.regenerate) {
    const again = focusable(button("Regenerate", "regenerate", () => {
      if (again.getAttribute("aria-disabled") !== "true") actions.regenerate();
    }), `regen${at}`);
    again.title = "Write another reply to the same message (with the model picked above)";
    // Kept focusable while a reply is written (aria-disabled, not disabled): focus stays where it was.
    again.setAttribute("aria-disabled", String(Boolean(actions.busy)));
    meta.append(again);
  }
  node.append(speaker("Parley replied:"), route, body, thinking, notice, meta);
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
  const route = routeText(msg);
  node.querySelector(".route").textContent = route;
  node.querySelector(".route").hidden = !route;
}

export function modelLabel(msg) {
  return [msg.pool, msg.model].filter(Boolean).join(" · ");
}

// Which model answered, when it is not the one asked for.
export function routeText(msg) {
  if (msg.route_reason === "canned") {
    return "Every model was busy, so this is a prepared reply, not a model's. Send it again in a while for a "
      + "model's answer.";
  }
  if (msg.route_reason !== "overflow") return "";
  const asked = msg.requested_pool && msg.requested_pool !== msg.pool ? msg.requested_pool : "The model asked for";
  const by = [msg.pool, msg.model && `(${msg.model})`].filter(Boolean).join(" ");
  return `${asked} was busy, so ${by || "a smaller model"} answered instead. Your next message still goes to `
    + "the model picked above.";
}

function switcher({ index, count, go }, what, key) {
  const box = el("span", "versions");
  const prev = focusable(button("‹", "prev", () => go(-1)), `${key}prev`);
  const next = focusable(button("›", "next", () => go(+1)), `${key}next`);
  prev.setAttribute("aria-label", `Previous ${what}`);
  next.setAttribute("aria-label", `Next ${what}`);
  prev.disabled = index === 0;
  next.disabled = index === count - 1;
  const label = el("span", "version-label");
  label.textContent = `${index + 1}/${count}`;
  box.append(prev, label, next);
  return box;
}

// Who is speaking, for screen readers (the bubbles' sides and colours say it to the eye).
function speaker(text) {
  const label = el("span", "sr-only");
  label.textContent = text;
  return label;
}

function focusable(node, key) {
  node.dataset.focus = key;
  return node;
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
