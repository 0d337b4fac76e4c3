// The page: sign-in, then the sidebar, the open conversation, the model picker and the day's tokens.
// The address says which conversation is open (#/c/<id>), so a reload comes back to it.

import { api, ApiError, whenSignedOut } from "./api.js";
import { Chat } from "./chat.js";
import { Drawer, Theme } from "./chrome.js";
import { SearchBox } from "./search.js";
import { defaultModel, loadAccount, SettingsDialog } from "./settings.js";
import { ConversationMenu } from "./sharing.js";
import { Sidebar } from "./sidebar.js";

const $ = (id) => document.getElementById(id);

let chat;
let sidebar;
let drawer;
let menu;
let usageMissing = false; // GET /v1/usage answered 404: this service has no usage endpoint
let me = null; // the signed-in user
let models = { preferred: null, items: [] }; // GET /v1/models

async function boot() {
  whenSignedOut(() => signedOut("Your session has ended. Sign in again."));
  wireSignIn();
  wireApp();
  let session;
  try {
    session = await api("GET", "/v1/session");
  } catch (err) {
    showSignIn(false, err.message);
    return;
  }
  if (session.user) await showApp(session.user);
  else showSignIn(session.local_mode);
}

// -- signing in ---------------------------------------------------------------------------------------------
function wireSignIn() {
  $("signin-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    await signIn(() => api("POST", "/v1/session", { token: $("token").value.trim() }));
  });
  $("demo-button").addEventListener("click", () => signIn(() => api("POST", "/v1/session/demo", { plan: "free" })));
}

async function signIn(call) {
  const error = $("signin-error");
  error.hidden = true;
  try {
    const { user, token } = await call();
    $("token").value = "";
    await showApp(user);
    if (token) showToken(token); // a demo user: its token is shown until dismissed
  } catch (err) {
    words(error, err.message);
    error.hidden = false;
  }
}

function showSignIn(localMode, message = "") {
  $("app").hidden = true;
  $("signin").hidden = false;
  $("demo").hidden = !localMode;
  words($("signin-error"), message);
  $("signin-error").hidden = !message;
  $("token").focus();
}

function signedOut(message) {
  if ($("app").hidden) return; // already signing in: that form shows its own error
  chat.closeAll();
  $("token-note").hidden = true;
  api("GET", "/v1/session").then((s) => showSignIn(s.local_mode, message), () => showSignIn(false, message));
}

// -- the chat -----------------------------------------------------------------------------------------------
function wireApp() {
  chat = new Chat({ messages: $("messages"), empty: $("empty"), send: $("send"), stop: $("stop") }, {
    model: () => $("model").value || undefined,
    created: (id) => {
      history.replaceState(null, "", `#/c/${encodeURIComponent(id)}`);
      sidebar.bump(id);
      sidebar.setActive(id);
      setTitle(null);
    },
    replied: (id) => {
      sidebar.bump(id);
      refreshUsage();
    },
    title: (title) => setTitle(title),
    lost: () => api("GET", "/v1/session").then((s) => {
      if (!s.user) signedOut("Your session has ended. Sign in again.");
    }, () => null),
    failed: (err, text) => {
      if (text && !$("input").value) $("input").value = text; // not sent: give the words back
      showBanner(describe(err));
    },
    opened: (pool) => { // the picker follows the model that answered last in the reopened conversation
      if (pool && [...$("model").options].some((o) => o.value === pool)) $("model").value = pool;
    },
  });
  menu = new ConversationMenu(() => shownConversation());
  new SettingsDialog({
    models: () => models.items, serviceDefault: () => models.preferred,
    defaultChanged: (pool) => { if (!chat.conversationId) pick(pool); },
    deletedAll: () => {
      sidebar.reset().catch((err) => showBanner(describe(err)));
      chat.closeAll();
      if (location.hash) location.hash = "";
      else openFromAddress();
    },
  });
  drawer = new Drawer($("app"), $("menu"), $("scrim"));
  new Theme($("theme"));
  new SearchBox({ input: $("search"), results: $("search-results"), list: $("conversation-list"),
                  sentinel: $("list-sentinel") }, () => drawer.close());
  sidebar = new Sidebar({ list: $("conversation-list"), sentinel: $("list-sentinel"), scroller: $("conversations") },
    (title) => setTitle(title), (err) => showBanner(describe(err)), {
      share: (id) => { drawer.close(); menu.openDialog(target(id)); },
      exportAs: (id, format) => menu.exportAs(format, target(id)),
    });
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("input").addEventListener("input", grow);
  const narrow = window.matchMedia("(max-width: 720px)");
  const hint = () => { // the keys don't fit in one line of a phone's message box
    $("input").placeholder = narrow.matches ? "Message Parley…"
      : "Message Parley… (Enter to send, Shift+Enter for a new line)";
  };
  narrow.addEventListener("change", hint);
  hint();
  $("stop").addEventListener("click", () => chat.stop());
  $("banner-close").addEventListener("click", () => { $("banner").hidden = true; });
  $("token-close").addEventListener("click", () => { $("token-note").hidden = true; $("input").focus(); });
  $("conversations").addEventListener("click", (e) => { if (e.target.closest("a")) drawer.close(); });
  $("new-chat").addEventListener("click", () => drawer.close());
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || e.defaultPrevented) return;
    if (drawer.isOpen()) drawer.close(true);
    else if (chat.activeGeneration()) chat.stop(); // Escape stops the reply being written, as in ChatGPT
  });
  $("sign-out").addEventListener("click", async () => {
    await api("DELETE", "/v1/session").catch(() => null);
    signedOut("");
  });
  window.addEventListener("hashchange", openFromAddress);
}

async function showApp(user) {
  $("signin").hidden = true;
  $("app").hidden = false;
  me = user;
  $("who").textContent = `${user.display_name || "Signed in"} · ${user.plan} plan`;
  const rest = Promise.all([sidebar.reset().catch((err) => showBanner(describe(err))), refreshUsage()]);
  // The address is opened as soon as the picker has its models, in the same turn: a new chat's default model is
  // picked before anyone can pick one. Opened after the list and usage reads too, it undid a pick made meanwhile
  // (the next message then went to the default model).
  await loadModels();
  await openFromAddress();
  await rest;
  $("input").focus();
}

async function openFromAddress() {
  const match = /^#\/c\/([^/]+)(?:\/m\/(.+))?$/.exec(location.hash);
  const id = match ? decodeURIComponent(match[1]) : null;
  const messageId = match?.[2] ? decodeURIComponent(match[2]) : null; // a search hit: show that message
  if (messageId) history.replaceState(null, "", `#/c/${encodeURIComponent(id)}`);
  else if (id === chat.conversationId && id !== null) return;
  $("banner").hidden = true;
  if (!id && me) pick(defaultModel(models.preferred)); // a new chat starts on the default model
  sidebar.setActive(id);
  setTitle(id ? sidebar.titleOf(id) : null);
  try {
    await chat.open(id, messageId);
  } catch (err) {
    showBanner(err.status === 404 ? "That conversation doesn't exist, or isn't yours." : describe(err));
  }
}

async function send() {
  const text = $("input").value;
  if (!text.trim() || chat.busy()) return;
  $("input").value = "";
  grow();
  $("banner").hidden = true;
  await chat.send(text);
}

async function loadModels() {
  // The account's default model too: a settings read that fails leaves the service's default.
  const [{ default: preferred, items }] = await Promise.all([api("GET", "/v1/models"), loadAccount().catch(() => null)]);
  models = { preferred, items };
  const start = defaultModel(preferred);
  const picker = $("model");
  picker.replaceChildren(...items.map(({ pool, model }) => {
    const option = document.createElement("option");
    option.value = pool;
    option.textContent = `${pool} · ${model}`;
    option.selected = pool === start;
    return option;
  }));
}

function pick(pool) {
  if ([...$("model").options].some((o) => o.value === pool)) $("model").value = pool;
}

// Remaining daily tokens, if this service reports them (GET /v1/usage); nothing shown where it doesn't.
async function refreshUsage() {
  if (usageMissing) return;
  let usage;
  try {
    usage = await api("GET", "/v1/usage");
  } catch (err) {
    usageMissing = err instanceof ApiError && err.status === 404;
    return;
  }
  const box = $("usage");
  const remaining = usage.remaining ?? usage.remaining_tokens;
  if (typeof remaining !== "number") return;
  const limit = usage.daily_limit ?? usage.limit;
  const parts = [`${remaining.toLocaleString()} ${typeof limit === "number" ? `of ${limit.toLocaleString()} ` : ""}`
    + "tokens left today"];
  const resets = resetTime(usage.resets_at);
  if (resets) parts.push(`resets ${resets.toISOString().slice(11, 16)} UTC`);
  box.textContent = parts.join(" · ");
  box.hidden = false;
}

// resets_at may be epoch seconds or an ISO string.
function resetTime(value) {
  if (value === undefined || value === null) return null;
  const when = new Date(typeof value === "number" ? value * 1000 : value);
  return Number.isNaN(when.getTime()) ? null : when;
}

// -- small things -------------------------------------------------------------------------------------------
function setTitle(title) {
  $("chat-title").textContent = title || (chat.conversationId ? "New conversation" : "New chat");
  document.title = title ? `${title} · Parley` : "Parley";
  menu.update();
}

// The open conversation and the last message on screen (share and export take that branch).
function shownConversation() {
  if (!chat.conversationId) return null;
  const last = chat.groups().at(-1);
  return { conversationId: chat.conversationId, lastId: last?.reply?.message_id || last?.user?.message_id || null };
}

// A conversation of the sidebar: the branch on screen when it is the open one, else its newest.
function target(conversationId) {
  const open = shownConversation();
  return open?.conversationId === conversationId ? open : { conversationId, lastId: null };
}

function describe(err) {
  if (!(err instanceof ApiError)) return "Something went wrong in the page. Reload it; nothing you sent is lost.";
  const wait = err.retryAfterS;
  const hint = err.status === 503 && wait ? ` Try again in ${Math.ceil(wait)} s.` : "";
  return err.message + hint;
}

function showToken(token) {
  $("token-value").textContent = token;
  $("token-note").hidden = false;
}

function showBanner(text, kind = "error") {
  words($("banner-text"), text);
  $("banner").className = `banner ${kind}`;
  $("banner").hidden = false;
}

// A message from the server, with `command` spans shown as code rather than as backticks (text nodes only).
function words(node, text) {
  node.replaceChildren(...String(text).split(/`([^`\n]+)`/).map((part, i) => {
    if (i % 2 === 0) return document.createTextNode(part);
    const code = document.createElement("code");
    code.textContent = part;
    return code;
  }));
}

function grow() {
  const input = $("input");
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, 240)}px`;
}

boot();
