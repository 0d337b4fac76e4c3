// The open conversation's ⋯ menu: Share (a read-only link to a snapshot of the branch on screen, with
// Copy and Revoke) and Export (the branch on screen as Markdown or JSON, downloaded by the browser).
// The sidebar's ⋯ menus use the same dialog and downloads for a conversation that is not open (its newest branch).

import { api } from "./api.js";

const $ = (id) => document.getElementById(id);

export class ConversationMenu {
  // current(): {conversationId, lastId} of the conversation on screen, or null
  constructor(current) {
    this.current = current;
    this.share = null; // the share link the dialog shows
    this.target = null; // {conversationId, lastId} the dialog is about
    const button = $("chat-menu-button");
    button.addEventListener("click", () => this.toggle(!this.isOpen()));
    document.addEventListener("click", (e) => {
      if (this.isOpen() && !e.target.closest(".chat-actions")) this.toggle(false);
    });
    $("chat-menu").addEventListener("keydown", (e) => {
      if (e.key === "Escape") { e.preventDefault(); this.toggle(false); button.focus(); }
    });
    $("share-open").addEventListener("click", () => { this.toggle(false); this.openDialog(); });
    $("export-md").addEventListener("click", () => this.exportAs("markdown"));
    $("export-json").addEventListener("click", () => this.exportAs("json"));
    $("share-create").addEventListener("click", () => this.create());
    $("share-copy").addEventListener("click", () => this.copy());
    $("share-revoke").addEventListener("click", () => this.revoke());
    $("share-close").addEventListener("click", () => $("share-dialog").close());
  }

  isOpen() { return !$("chat-menu").hidden; }

  toggle(open) {
    $("chat-menu").hidden = !open;
    $("chat-menu-button").setAttribute("aria-expanded", String(open));
    if (open) $("chat-menu").querySelector("button").focus();
  }

  // Shown only while a saved conversation is open.
  update() {
    $("chat-actions").hidden = !this.current();
    if ($("chat-actions").hidden) this.toggle(false);
  }

  // target: {conversationId, lastId (null: the newest branch)}; by default the conversation on screen
  exportAs(format, target = this.current()) {
    this.toggle(false);
    const open = target;
    if (!open) return;
    const params = new URLSearchParams({ format });
    if (open.lastId) params.set("message_id", open.lastId);
    const link = document.createElement("a"); // the answer is an attachment: the browser saves it
    link.href = `/v1/conversations/${encodeURIComponent(open.conversationId)}/export?${params}`;
    link.download = "";
    document.body.append(link);
    link.click();
    link.remove();
  }

  async openDialog(target = this.current()) {
    const open = target;
    if (!open) return;
    this.target = open;
    this.show(null, "");
    $("share-dialog").showModal();
    try {
      const { items } = await api("GET", `/v1/shares?conversation_id=${encodeURIComponent(open.conversationId)}`);
      this.show(items[0] ?? null, "");
    } catch (err) {
      this.show(null, err.message);
    }
  }

  async create() {
    const open = this.target;
    if (!open) return;
    try {
      const body = open.lastId ? { message_id: open.lastId } : {};
      this.show(await api("POST", `/v1/conversations/${encodeURIComponent(open.conversationId)}/share`, body), "");
    } catch (err) {
      this.show(this.share, err.message);
    }
  }

  async revoke() {
    if (!this.share) return;
    try {
      await api("DELETE", `/v1/shares/${encodeURIComponent(this.share.share_id)}`);
      this.show(null, "The link is revoked: it no longer opens anything.");
    } catch (err) {
      this.show(this.share, err.message);
    }
  }

  async copy() {
    try {
      await navigator.clipboard.writeText($("share-link").value);
      $("share-copy").textContent = "Copied";
    } catch {
      $("share-link").select();
      $("share-copy").textContent = "Press Ctrl+C";
    }
    setTimeout(() => { $("share-copy").textContent = "Copy link"; }, 1500);
  }

  // share: the link shown (null: none yet); note: a line under it
  show(share, note) {
    this.share = share;
    $("share-link").value = share ? new URL(share.path, location.origin).href : "";
    $("share-link-row").hidden = !share;
    $("share-revoke").hidden = !share;
    $("share-copy").hidden = !share;
    $("share-create").textContent = share ? "Update link" : "Create link";
    $("share-explain").textContent = share
      ? `Anyone with this link can read the conversation as it was when the link was made (${share.message_count} `
        + "messages); later messages are not in it. Update link makes a new one that shows them."
      : "Make a read-only link to this conversation as it is now. Anyone with the link can read it, "
        + "without an account; later messages are not shown.";
    $("share-note").textContent = note;
    $("share-note").hidden = !note;
  }
}
