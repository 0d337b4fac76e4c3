// The settings dialog: the model new chats start with and custom instructions (both kept in the account, so
// every device sees them), what the plan keeps and for how long, export or delete every conversation, and API
// tokens (list, make one — shown once — and revoke).

import { api } from "./api.js";
import { button, el } from "./view.js";

const $ = (id) => document.getElementById(id);
const DAY_S = 86_400;
const MAX_INSTRUCTIONS = 4000;
let account = null; // GET /v1/account as last read or saved

// The account's settings, read when the page signs in and again when the dialog opens.
export async function loadAccount() {
  account = null; // another user's, until this read answers
  account = await api("GET", "/v1/account");
  return account;
}

// The model a new chat starts with: the account's pick (the service's default until one is saved).
export function defaultModel(serviceDefault) {
  return account?.default_model || serviceDefault;
}

export class SettingsDialog {
  // hooks: {models() -> [{pool, model}], serviceDefault() -> pool, defaultChanged(pool), deletedAll(count)}
  constructor(hooks) {
    this.hooks = hooks;
    $("settings-open").addEventListener("click", () => this.open());
    $("settings-close").addEventListener("click", () => $("settings-dialog").close());
    $("default-model").addEventListener("change", () => {
      this.pickDefault($("default-model").value).catch((err) => this.say("model-note", err.message));
    });
    $("instructions").addEventListener("input", () => this.count());
    $("instructions-save").addEventListener("click", () => {
      this.saveInstructions().catch((err) => this.say("instructions-note", err.message));
    });
    $("export-all").addEventListener("click", () => this.exportAll("json"));
    $("export-all-md").addEventListener("click", () => this.exportAll("markdown"));
    $("delete-all").addEventListener("click", () => this.deleteAll().catch((err) => this.say("data-note", err.message)));
    $("token-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.createToken().catch((err) => this.say("tokens-note", err.message));
    });
    $("token-copy").addEventListener("click", () => this.copyToken());
  }

  async open() {
    for (const id of ["data-note", "tokens-note", "token-new", "model-note", "instructions-note"]) $(id).hidden = true;
    // Not editable until the account is read: what is typed before would be overwritten by what it holds.
    $("instructions").disabled = $("instructions-save").disabled = true;
    this.fillModels();
    $("settings-dialog").showModal();
    await Promise.all([this.showAccount().catch((err) => this.say("data-note", err.message)),
      this.listTokens().catch((err) => this.say("tokens-note", err.message))]);
  }

  fillModels() {
    const current = defaultModel(this.hooks.serviceDefault());
    $("default-model").replaceChildren(...this.hooks.models().map(({ pool, model }) => {
      const option = el("option");
      option.value = pool;
      option.textContent = `${pool} · ${model}`;
      option.selected = pool === current;
      return option;
    }));
  }

  async pickDefault(pool) {
    account = await api("PATCH", "/v1/account", { default_model: pool });
    this.say("model-note", "Saved: new chats start with this model.");
    this.hooks.defaultChanged(pool);
  }

  async showAccount() {
    const now = await loadAccount();
    $("retention").textContent = retentionText(now);
    this.fillModels();
    const box = $("instructions");
    box.value = now.instructions || "";
    box.disabled = $("instructions-save").disabled = now.no_retention;
    if (now.no_retention) this.say("instructions-note", "Your plan keeps nothing, so it cannot keep instructions.");
    this.count();
  }

  count() {
    const n = $("instructions").value.length;
    $("instructions-count").textContent = `${n.toLocaleString("en")} / ${MAX_INSTRUCTIONS.toLocaleString("en")}`;
  }

  async saveInstructions() {
    const text = $("instructions").value;
    account = await api("PATCH", "/v1/account", { instructions: text });
    $("instructions").value = account.instructions || "";
    this.count();
    this.say("instructions-note", account.instructions
      ? "Saved: new chats follow these instructions." : "Erased: new chats have no custom instructions.");
  }

  exportAll(format) {
    const link = el("a"); // an attachment: the browser saves it
    link.href = `/v1/conversations/export?format=${format}`;
    link.download = "";
    document.body.append(link);
    link.click();
    link.remove();
  }

  async deleteAll() {
    if (!window.confirm("Delete every conversation? Their messages are erased for good; this cannot be undone.")) {
      return;
    }
    const { deleted } = await api("DELETE", "/v1/account/conversations");
    this.say("data-note", `Deleted ${deleted} conversation${deleted === 1 ? "" : "s"}.`);
    this.hooks.deletedAll(deleted);
  }

  async listTokens() {
    const { items } = await api("GET", "/v1/tokens");
    $("token-list").replaceChildren(...items.map((t) => tokenRow(t, () => this.revoke(t))));
    $("token-none").hidden = items.length > 0;
  }

  async createToken() {
    const name = $("token-name").value.trim();
    const made = await api("POST", "/v1/tokens", name ? { name } : {});
    $("token-name").value = "";
    $("token-secret").textContent = made.token;
    $("token-new").hidden = false;
    $("tokens-note").hidden = true;
    await this.listTokens();
  }

  async revoke(t) {
    if (!window.confirm(`Revoke ${t.name ? `"${t.name}"` : "this token"}? Anything using it stops working at once.`)) {
      return;
    }
    try {
      await api("DELETE", `/v1/tokens/${encodeURIComponent(t.token_id)}`);
      this.say("tokens-note", "Revoked: that token no longer works.");
      await this.listTokens();
    } catch (err) {
      this.say("tokens-note", err.message);
    }
  }

  async copyToken() {
    try {
      await navigator.clipboard.writeText($("token-secret").textContent);
      $("token-copy").textContent = "Copied";
    } catch {
      $("token-copy").textContent = "Select and copy it";
    }
    setTimeout(() => { $("token-copy").textContent = "Copy"; }, 1500);
  }

  say(id, text) {
    $(id).textContent = text;
    $(id).hidden = !text;
  }
}

export function retentionText({ plan, retention_days: days, no_retention: none, purge_after_delete_s: purge }) {
  if (none) {
    return `Your ${plan} plan keeps nothing: replies are streamed to you and no message is stored, listed or `
      + "titled.";
  }
  const kept = days > 0 ? `kept until they have been idle ${days} day${days === 1 ? "" : "s"}, then deleted`
    : "kept until you delete them";
  const gone = purge < 60 ? "within a minute" : purge < DAY_S ? `within ${Math.ceil(purge / 3600)} h`
    : `within ${Math.ceil(purge / DAY_S)} days`;
  return `Your ${plan} plan: conversations are ${kept}. A deleted conversation is erased ${gone}, share links `
    + "included; messages are stored encrypted.";
}

function tokenRow(t, revoke) {
  const li = el("li", `token-row ${t.status}`);
  const what = el("span", "token-what");
  const day = (iso) => (iso ? iso.slice(0, 10) : "—");
  what.textContent = `${t.name || "Unnamed token"} · ${t.status} · made ${day(t.created_at)} · `
    + (t.status === "revoked" ? `revoked ${day(t.revoked_at)}` : `expires ${day(t.expires_at)}`);
  li.append(what);
  if (t.status === "active") {
    const b = button("Revoke", "danger revoke", revoke);
    b.setAttribute("aria-label", `Revoke ${t.name || "unnamed token"}`);
    li.append(b);
  }
  return li;
}
