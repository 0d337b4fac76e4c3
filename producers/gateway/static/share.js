// A shared conversation, read-only: /s/<share_id> reads GET /v1/shares/<share_id> (no sign-in) and shows
// its messages as the chat page does. What people wrote goes in as text; replies through renderMarkdown,
// which cannot run script (see markdown.js), under the same Content-Security-Policy as the chat page.

import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const STATUS = { stopped: "Stopped", length: "Cut off at the length limit", failed: "Failed",
  blocked: "Removed by the content rules" };

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function messageView(msg) {
  const node = el("article", `msg ${msg.role === "user" ? "user" : "assistant"}`);
  if (msg.role === "user") {
    node.append(el("span", "sr-only", "They said:"), el("div", "bubble", msg.content));
    return node;
  }
  const body = el("div", "md");
  body.append(renderMarkdown(msg.content || ""));
  const meta = el("footer", "reply-meta");
  if (msg.model) meta.append(el("span", "model", msg.model));
  if (STATUS[msg.status]) meta.append(el("span", "status", STATUS[msg.status]));
  node.append(el("span", "sr-only", "Parley replied:"), body, meta);
  return node;
}

async function show() {
  const shareId = decodeURIComponent(location.pathname.split("/").pop() || "");
  let response;
  try {
    response = await fetch(`/v1/shares/${encodeURIComponent(shareId)}`, { credentials: "omit" });
  } catch {
    return fail("Can't reach Parley. Check your connection and reload.");
  }
  if (!response.ok) {
    return fail(response.status === 404 ? "This link does not work: it was revoked, its conversation was "
      + "deleted, or it was copied wrong." : `Parley answered ${response.status}. Reload to try again.`);
  }
  const share = await response.json();
  const title = share.title || "Shared conversation";
  $("shared-title").textContent = title;
  document.title = `${title} · Parley`;
  $("shared-when").textContent = `Shared ${new Date(share.created_at).toLocaleString()}`;
  $("shared-messages").replaceChildren(...share.messages.map(messageView));
}

function fail(message) {
  $("shared-error").textContent = message;
  $("shared-error").hidden = false;
}

show();
