// The list of conversations: newest first, more loaded as it scrolls, titles filled in when the
// service has written them (it titles a conversation after its first reply). Each one has a ⋯ menu, always
// shown (a touch screen has no hover): rename, share, export, and delete (after a confirmation: a deleted
// conversation is gone for good).

import { api } from "./api.js";
import { el } from "./view.js";

const PAGE = 20;
const TITLE_POLL_MS = 3000;
const TITLE_WAIT_MS = 120_000; // stop asking after this long: some conversations never get a title

export class Sidebar {
  // ui: {list, sentinel, scroller}; onTitle(title) when the open conversation gets its title;
  // onError(err) when a rename or delete fails; hooks: {share(id), exportAs(id, format)} for the ⋯ menu
  constructor(ui, onTitle, onError = () => {}, hooks = {}) {
    this.ui = ui;
    this.onTitle = onTitle;
    this.onError = onError;
    this.hooks = hooks;
    this.menuFor = null; // the conversation whose ⋯ menu is open
    document.addEventListener("click", (e) => {
      // A click that redrew the list (⋯ itself) has a target no longer in the page: not a click outside.
      if (this.menuFor && e.target.isConnected && !e.target.closest(".conversation-item.menu-open")) this.openMenu(null);
    });
    this.items = [];
    this.cursor = null;
    this.done = false;
    this.loading = false;
    this.activeId = null;
    this.untitled = new Map(); // conversation id -> when we started waiting for its title
    this.poller = 0;
    new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.more();
    }, { root: ui.scroller, rootMargin: "120px" }).observe(ui.sentinel);
  }

  async reset() {
    this.items = [];
    this.cursor = null;
    this.done = false;
    this.render();
    await this.more();
  }

  async more() {
    if (this.loading || this.done) return;
    this.loading = true;
    try {
      const query = new URLSearchParams({ limit: String(PAGE), ...(this.cursor ? { cursor: this.cursor } : {}) });
      const page = await api("GET", `/v1/conversations?${query}`);
      const seen = new Set(this.items.map((c) => c.conversation_id));
      this.items.push(...page.items.filter((c) => !seen.has(c.conversation_id)));
      this.cursor = page.next_cursor;
      this.done = !page.next_cursor;
      this.render();
    } finally {
      this.loading = false;
    }
    if (!this.done && this.sentinelVisible()) this.more(); // a tall window: keep filling it
  }

  sentinelVisible() {
    const box = this.ui.scroller.getBoundingClientRect();
    return this.ui.sentinel.getBoundingClientRect().top < box.bottom + 120;
  }

  // A conversation was just used: to the top, and wait for its title if it has none yet.
  bump(conversationId, changes = {}) {
    const found = this.items.find((c) => c.conversation_id === conversationId);
    const item = { conversation_id: conversationId, title: null, ...found, ...changes };
    this.items = [item, ...this.items.filter((c) => c !== found)];
    if (!item.title) this.waitForTitle(conversationId);
    this.render();
  }

  waitForTitle(conversationId) {
    if (!this.untitled.has(conversationId)) this.untitled.set(conversationId, Date.now());
    if (!this.poller) this.poller = setInterval(() => this.pollTitles(), TITLE_POLL_MS);
  }

  async pollTitles() {
    for (const [id, since] of this.untitled) if (Date.now() - since > TITLE_WAIT_MS) this.untitled.delete(id);
    if (!this.untitled.size) {
      clearInterval(this.poller);
      this.poller = 0;
      return;
    }
    let page;
    try {
      page = await api("GET", `/v1/conversations?limit=${PAGE}`);
    } catch {
      return; // try again on the next tick
    }
    for (const fresh of page.items) {
      const item = this.items.find((c) => c.conversation_id === fresh.conversation_id);
      if (fresh.title && this.untitled.delete(fresh.conversation_id) && item) {
        item.title = fresh.title;
        this.render();
        if (fresh.conversation_id === this.activeId) this.onTitle(fresh.title);
      }
    }
  }

  setActive(conversationId) {
    this.activeId = conversationId;
    this.render();
  }

  titleOf(conversationId) {
    return this.items.find((c) => c.conversation_id === conversationId)?.title || null;
  }

  moreButton(c) {
    const open = this.menuFor === c.conversation_id;
    const button = el("button", "conversation-more");
    button.type = "button";
    button.textContent = "⋯";
    button.setAttribute("aria-label", `Actions for ${c.title || "new conversation"}`);
    button.setAttribute("aria-haspopup", "menu");
    button.setAttribute("aria-expanded", String(open));
    button.addEventListener("click", () => this.openMenu(open ? null : c.conversation_id));
    return button;
  }

  menu(c) {
    const box = el("div", "conversation-menu");
    box.setAttribute("role", "menu");
    box.setAttribute("aria-label", `Actions for ${c.title || "new conversation"}`);
    const id = c.conversation_id;
    const item = (label, kind, run) => {
      const b = el("button", kind);
      b.type = "button";
      b.setAttribute("role", "menuitem");
      b.textContent = label;
      b.addEventListener("click", () => {
        this.openMenu(null);
        Promise.resolve().then(run).catch(this.onError);
      });
      return b;
    };
    box.append(item("Rename", "rename", () => this.rename(c)),
      item("Share…", "share", () => this.hooks.share?.(id)),
      item("Export as Markdown", "export-md", () => this.hooks.exportAs?.(id, "markdown")),
      item("Export as JSON", "export-json", () => this.hooks.exportAs?.(id, "json")),
      item("Delete", "delete", () => this.remove(c)));
    box.addEventListener("keydown", (e) => {
      const items = [...box.querySelectorAll("button")];
      const at = items.indexOf(document.activeElement);
      if (e.key === "Escape") {
        e.preventDefault(); // the drawer stays open: only the menu closes
        e.stopPropagation();
        this.openMenu(null, true);
      } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
        e.preventDefault();
        items[(at + (e.key === "ArrowDown" ? 1 : items.length - 1)) % items.length].focus();
      }
    });
    return box;
  }

  // Open the ⋯ menu of one conversation (null: close it); focus goes to its first item, or back to ⋯.
  openMenu(conversationId, refocus = false) {
    const was = this.menuFor;
    this.menuFor = conversationId;
    this.render();
    const item = (id) => [...this.ui.list.children].find((li) => li.dataset.conversationId === id);
    if (conversationId) item(conversationId)?.querySelector(".conversation-menu button")?.focus();
    else if (refocus && was) item(was)?.querySelector(".conversation-more")?.focus();
  }

  async rename(c) {
    const title = window.prompt("New name for this conversation:", c.title || "");
    if (title === null || !title.trim()) return;
    const saved = await api("PATCH", `/v1/conversations/${encodeURIComponent(c.conversation_id)}`, { title });
    c.title = saved.title;
    this.untitled.delete(c.conversation_id);
    this.render();
    if (c.conversation_id === this.activeId) this.onTitle(saved.title);
  }

  async remove(c) {
    if (!window.confirm(`Delete "${c.title || "New conversation"}"? Its messages are erased for good.`)) return;
    await api("DELETE", `/v1/conversations/${encodeURIComponent(c.conversation_id)}`);
    this.items = this.items.filter((item) => item !== c);
    this.untitled.delete(c.conversation_id);
    this.render();
    if (c.conversation_id === this.activeId) location.hash = ""; // back to a new, empty conversation
  }

  render() {
    this.ui.list.replaceChildren(...this.items.map((c) => {
      const link = el("a", c.title ? "conversation" : "conversation untitled");
      link.href = `#/c/${encodeURIComponent(c.conversation_id)}`;
      link.textContent = c.title || "New conversation";
      link.dataset.conversationId = c.conversation_id;
      if (c.conversation_id === this.activeId) link.setAttribute("aria-current", "page");
      const li = el("li", "conversation-item");
      li.dataset.conversationId = c.conversation_id;
      li.append(link, this.moreButton(c));
      if (this.menuFor === c.conversation_id) {
        li.classList.add("menu-open");
        li.append(this.menu(c));
      }
      return li;
    }));
    this.ui.sentinel.hidden = this.done;
  }
}
