// One conversation on screen: its messages and reply versions, sending, regenerating, stopping,
// and following every reply that is still being written (also ones started before a reload).

import { api, follow, loadConversation, startReply } from "./api.js";
import { branchOf, replyKey, reveal } from "./branch.js";
import { paintReply, replyView, userView } from "./view.js";

const DONE = { end: "complete", stopped: "stopped", length: "length", error: "failed", blocked: "blocked" };
let localIds = 0;

export class Chat {
  // ui: {messages, empty, send, stop}
  // hooks: {model(), created(id), replied(id), title(text), failed(err, text), lost(), opened(pool)}
  constructor(ui, hooks) {
    this.ui = ui;
    this.hooks = hooks;
    this.conversationId = null;
    this.messages = [];
    this.chosen = new Set(); // generation ids picked in a version switcher (or just written)
    this.chosenUsers = new Set(); // user message ids picked the same way
    this.editing = null; // the user message whose edit box is open
    this.replies = new Map(); // generation id -> the reply as it streamed into this page
    this.followers = new Map(); // generation id -> {handle, conversationId}, while still being written
    this.views = new Map(); // generation id -> its element on screen
    this.sending = false;
    this.stopping = null;
    this.opened = 0;
    this.dirty = new Set();
    this.frame = 0;
  }

  async open(conversationId, messageId = null) {
    const ticket = ++this.opened;
    this.conversationId = conversationId;
    this.messages = [];
    this.editing = null;
    this.render();
    if (!conversationId) return;
    const { title, items } = await this.load(conversationId);
    if (ticket !== this.opened) return; // another conversation was opened meanwhile
    this.hooks.title(title);
    if (messageId) reveal(items, messageId, this.chosen, this.chosenUsers);
    this.adopt(items);
    this.hooks.opened(pickedPool(this.groups()));
    if (messageId) this.show(messageId);
  }

  // Scroll a message (found by search) into view and mark it for a moment.
  show(messageId) {
    const node = [...this.ui.messages.querySelectorAll("article")].find(
      (n) => n.dataset.messageId === messageId || n.dataset.generationId === messageId);
    if (!node) return;
    node.classList.add("found");
    node.scrollIntoView({ block: "center" });
    setTimeout(() => node.classList.remove("found"), 2500);
  }

  load(conversationId) {
    return loadConversation(conversationId);
  }

  // Show the saved messages; replies streamed in this page keep the text as it arrived, and any
  // reply still being written is followed (this is how a reopened conversation re-attaches).
  adopt(items) {
    const known = new Set(items.map((m) => m.generation_id));
    this.messages = items.map((m) => {
      if (m.role !== "assistant" || !m.generation_id) return m;
      const mine = this.replies.get(m.generation_id);
      if (mine) { // what the server knows that the stream didn't (ids, usage); never the text or the status
        // A row still generating was saved before routing: its pool is the one asked for, and the stream's
        // message_start already said who answers (a fallback included).
        const skip = m.status === "generating" && mine.route_reason ? ROUTE_KEYS : NEVER_ADOPTED;
        for (const [key, value] of Object.entries(m)) {
          if (value !== null && !skip.has(key)) mine[key] = value;
        }
        return mine;
      }
      if (m.status !== "generating") return m;
      const live = { ...m, content: "" }; // the stream replays from the start of the generation
      this.replies.set(m.generation_id, live);
      return live;
    });
    for (const reply of this.replies.values()) { // started here, not saved yet: keep showing it
      if (reply.conversation_id === this.conversationId && !known.has(reply.generation_id)) {
        this.messages.push(...(reply.localUser ? [reply.localUser] : []), reply);
      }
    }
    for (const m of this.messages) {
      if (m.status === "generating" && m.generation_id && !this.followers.has(m.generation_id)) {
        this.follow(this.conversationId, m);
      }
    }
    this.render();
  }

  send(text) {
    const last = this.groups().at(-1)?.reply;
    const after = last && !String(last.generation_id).startsWith("pending-") ? replyKey(last) : null;
    const user = { role: "user", message_id: `local-${++localIds}`, parent_id: after, content: text,
                   status: "complete" };
    const body = { content: text, model: this.hooks.model(), ...(after ? { parent_id: after } : {}) };
    return this.submit((id) => `/v1/conversations/${encodeURIComponent(id)}/messages`, body, user, user.message_id);
  }

  // Edit and resend: a sibling of `group.user` (same parent) with a reply of its own, shown at once.
  edit(group, text) {
    const target = group.user;
    const user = { role: "user", message_id: `local-${++localIds}`, parent_id: target.parent_id ?? null,
                   turn: target.turn, content: text, status: "complete" };
    for (const u of group.users) this.chosenUsers.delete(u.message_id);
    this.editing = null;
    const path = (id) => `/v1/conversations/${encodeURIComponent(id)}/messages/${encodeURIComponent(target.message_id)}/edit`;
    return this.submit(path, { content: text, model: this.hooks.model() }, user, user.message_id);
  }

  setEditing(messageId) {
    this.editing = messageId;
    this.render();
  }

  regenerate(group) {
    const target = group.user?.message_id || group.reply.message_id;
    const path = (id) => `/v1/conversations/${encodeURIComponent(id)}/messages/${encodeURIComponent(target)}/regenerate`;
    return this.submit(path, { model: this.hooks.model() }, null, target);
  }

  async submit(pathFor, body, user, parentId) {
    if (this.busy()) return false;
    this.sending = true;
    const pending = { role: "assistant", generation_id: `pending-${++localIds}`, parent_id: parentId, content: "",
                      status: "generating", notice: "Sending…", pool: body.model };
    this.messages.push(...(user ? [user] : []), pending);
    this.chosen.add(pending.generation_id);
    this.render();
    let conversationId = this.conversationId;
    try {
      if (!conversationId) {
        conversationId = (await api("POST", "/v1/conversations", {})).conversation_id;
        this.conversationId = conversationId;
        this.hooks.created(conversationId);
      }
      const start = await startReply(pathFor(conversationId), body);
      const reply = { role: "assistant", conversation_id: conversationId, generation_id: start.generation_id,
                      message_id: start.message_id, parent_id: parentId, ...routeOf(start),
                      content: "", status: "generating", localUser: user };
      this.replies.set(reply.generation_id, reply);
      this.chosen.add(reply.generation_id);
      this.messages = this.messages.map((m) => (m === pending ? reply : m));
      this.follow(conversationId, reply);
      this.sending = false;
      this.render();
      await this.refresh(conversationId);
      return true;
    } catch (err) {
      this.messages = this.messages.filter((m) => m !== pending && m !== user);
      this.hooks.failed(err, user ? user.content : null);
      return false;
    } finally {
      this.sending = false;
      this.render();
    }
  }

  // The saved ids of what was just sent (needed to regenerate it); the streamed text stays as it is.
  async refresh(conversationId) {
    try {
      const { items } = await this.load(conversationId);
      if (this.conversationId === conversationId) this.adopt(items);
    } catch {
      // Still shown as sent; the next open of this conversation brings the saved ids.
    }
  }

  async stop() {
    const generationId = this.activeGeneration();
    if (!generationId) return;
    this.stopping = generationId;
    this.renderControls();
    try {
      await api("POST", `/v1/generations/${encodeURIComponent(generationId)}/cancel`);
    } catch (err) {
      this.stopping = null;
      this.renderControls();
      this.hooks.failed(err, null);
    }
  }

  follow(conversationId, reply) {
    const id = reply.generation_id;
    const update = (changes) => { Object.assign(reply, changes); this.paint(reply); };
    const wait = countdown((text) => update({ notice: reply.content ? "" : text }));
    const settle = (changes) => { wait.stop(); update(changes); };
    const handle = follow(id, {
      start: (d) => update(routeOf(d)), // a fallback is known from here, and shown in the reply at once
      // The first estimate, and a newer one whenever the service finds the countdown off.
      queued: (d) => { if (!reply.content) wait.start(d); },
      // A worker died mid-reply; the next delta (from the worker taking over) clears this notice.
      recovering: (d) => settle({ notice: d.message || "Reconnecting to another worker…" }),
      delta: (text) => settle({ notice: "", content: reply.content + text }),
      snapshot: (text) => settle({ notice: "", content: text }),
      // The output check withdrew the reply: what was shown goes, the notice stays in its place.
      retracted: (notice) => settle({ notice, content: "", status: "blocked" }),
      error: (d) => settle({ notice: d.message || "The model could not answer. Try regenerating." }),
      state: (link) => {
        update({ link });
        if (link === "lost") this.hooks.lost(); // perhaps signed out: a stream can't say 401
      },
      end: (d) => {
        wait.stop();
        this.followers.delete(id);
        Object.assign(reply, { status: DONE[d.stop_reason] || "complete", usage: d.usage, link: "live" });
        if (this.stopping === id) this.stopping = null;
        if (this.conversationId === conversationId) this.render();
        this.hooks.replied(conversationId);
      },
    });
    const close = () => { wait.stop(); handle.close(); };
    this.followers.set(id, { handle: { close }, conversationId });
  }

  closeAll() {
    for (const { handle } of this.followers.values()) handle.close();
    this.followers.clear();
    this.replies.clear();
    this.chosen.clear();
    this.chosenUsers.clear();
    this.conversationId = null;
    this.messages = [];
  }

  busy() {
    return this.sending || this.activeGeneration() !== null;
  }

  activeGeneration() {
    for (const [id, f] of this.followers) if (f.conversationId === this.conversationId) return id;
    return null;
  }

  // -- drawing ---------------------------------------------------------------------------------------------
  groups() {
    return branchOf(this.messages, this.chosen, this.chosenUsers);
  }

  render() {
    const focused = document.activeElement?.dataset?.focus;
    this.views.clear();
    const nodes = [];
    const groups = this.groups();
    const busy = this.busy();
    groups.forEach((group, n) => {
      const { user, reply } = group;
      if (user) {
        const saved = !String(user.message_id).startsWith("local-");
        nodes.push(userView(user, { index: group.userIndex, count: group.users.length,
          go: (step) => this.pickUser(group, group.userIndex + step) }, {
          edit: saved && !busy ? (text) => this.edit(group, text) : null,
          editing: this.editing === user.message_id,
          setEditing: (on) => this.setEditing(on ? user.message_id : null),
        }, n));
      }
      if (!reply) return;
      // Any reply can be written again: an earlier one starts a branch there (the later turns stay on the old one).
      const view = replyView(reply, { index: group.replyIndex, count: group.replies.length,
        go: (step) => this.pickReply(group, group.replyIndex + step) },
      { regenerate: () => this.regenerate(group), busy: busy || reply.status === "generating" }, n);
      this.views.set(reply.generation_id, view);
      nodes.push(view);
    });
    this.ui.messages.replaceChildren(...nodes);
    this.ui.empty.hidden = nodes.length > 0;
    this.renderControls();
    this.ui.messages.scrollTop = this.ui.messages.scrollHeight;
    this.refocus(focused);
  }

  // The control that had focus before a redraw gets it back (its twin in the new elements);
  // a switcher arrow that became disabled hands it to the other arrow.
  refocus(key) {
    if (!key) return;
    let target = this.ui.messages.querySelector(`[data-focus="${key}"]`);
    if (target?.disabled) target = [...target.parentElement.querySelectorAll("button")].find((b) => !b.disabled);
    const twin = key.startsWith("editing") ? `edit${key.slice(7)}` : key.replace(/^edit(\d+)$/, "editing$1");
    if (!target && twin !== key) target = this.ui.messages.querySelector(`[data-focus="${twin}"]`); // box <-> button
    target?.focus({ preventScroll: true });
  }

  pickReply(group, index) {
    for (const r of group.replies) this.chosen.delete(replyKey(r));
    this.chosen.add(replyKey(group.replies[index]));
    this.render();
  }

  pickUser(group, index) {
    for (const u of group.users) this.chosenUsers.delete(u.message_id);
    this.chosenUsers.add(group.users[index].message_id);
    this.render();
  }

  paint(reply) {
    // Streamed chunks are drawn at most once a frame.
    this.dirty.add(reply);
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      const box = this.ui.messages;
      const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
      for (const r of this.dirty) {
        const view = this.views.get(r.generation_id);
        if (view) paintReply(view, r);
      }
      this.dirty.clear();
      if (atBottom) box.scrollTop = box.scrollHeight;
    });
  }

  renderControls() {
    const busy = this.busy();
    this.ui.send.hidden = busy;
    this.ui.stop.hidden = !busy;
    const active = this.activeGeneration();
    this.ui.stop.disabled = active === null || this.stopping === active;
    this.ui.stop.textContent = this.stopping === active && active !== null ? "Stopping…" : "Stop";
  }
}

// What message_start says about who answers: the pool and model, and why (a fallback, or as asked).
function routeOf(start) {
  return { model: start.model, pool: start.pool, route_reason: start.route_reason,
           requested_pool: start.requested_pool };
}

const FALLBACKS = new Set(["overflow", "canned"]);
const NEVER_ADOPTED = new Set(["content", "status"]);
const ROUTE_KEYS = new Set([...NEVER_ADOPTED, "pool", "model", "route_reason", "requested_pool"]);

// The model picker follows the reopened conversation's last reply, unless that was a fallback: the person picked
// the model it was moved away from, not the one that stood in (that pool is not known for older overflows).
function pickedPool(groups) {
  for (let i = groups.length - 1; i >= 0; i -= 1) {
    const reply = groups[i].reply;
    if (!reply) continue;
    if (!FALLBACKS.has(reply.route_reason)) return reply.pool || null;
    if (reply.requested_pool) return reply.requested_pool;
  }
  return null;
}

// A queued reply's wait, counted down each second between the estimates the service sends.
function countdown(show) {
  let timer = null;
  const stop = () => { clearInterval(timer); timer = null; };
  const start = ({ position, estimated_wait_s: wait }) => {
    stop();
    const until = Date.now() + wait * 1000;
    const tick = () => show(queuedText(position, wait, (until - Date.now()) / 1000));
    tick();
    timer = setInterval(tick, 1000);
  };
  return { start, stop };
}

function queuedText(position, wait, left) {
  // The place moves down with the wait. Seconds for the last 20, steps of 5 before: the notice is a status line
  // that a screen reader reads out, so it should not change every second for a minute.
  const place = wait > 0 ? Math.max(1, Math.ceil((position * Math.max(left, 0)) / wait)) : position;
  const seconds = left > 20 ? Math.ceil(left / 5) * 5 : Math.ceil(left);
  const eta = left >= 1 ? `, about ${seconds} s` : ", starting any moment";
  return `Queued: ${place === 1 ? "next" : `number ${place}`} in line${eta}.`;
}
