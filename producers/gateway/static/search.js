// Search over the signed-in user's conversation titles and messages (GET /v1/search): results
// replace the conversation list while there is a query; each opens its conversation at the match.

import { api } from "./api.js";
import { el } from "./view.js";

const WAIT_MS = 250;

export class SearchBox {
  // ui: {input, results, list, sentinel}; picked() when a result is opened
  constructor(ui, picked) {
    this.ui = ui;
    this.ticket = 0;
    this.timer = 0;
    ui.input.addEventListener("input", () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.run(), WAIT_MS);
    });
    ui.input.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && ui.input.value) {
        e.preventDefault(); // this Escape clears the search; it stops nothing else
        ui.input.value = "";
        this.run();
      }
    });
    ui.results.addEventListener("click", (e) => { if (e.target.closest("a")) picked(); });
  }

  async run() {
    const q = this.ui.input.value.trim();
    const ticket = ++this.ticket;
    const searching = q.length >= 2;
    this.ui.list.hidden = searching;
    this.ui.sentinel.classList.toggle("searching", searching);
    this.ui.results.hidden = !searching;
    if (!searching) return;
    let items;
    try {
      ({ items } = await api("GET", `/v1/search?${new URLSearchParams({ q, limit: "20" })}`));
    } catch (err) {
      items = null;
      this.show([], err.status === 422 ? "Type a longer word." : err.message);
    }
    if (ticket !== this.ticket || !items) return;
    this.show(items, items.length ? "" : `Nothing found for “${q}”.`);
  }

  show(items, message) {
    const words = this.ui.input.value.trim().toLowerCase().split(/\s+/).filter((w) => w.length >= 2);
    const rows = items.map((hit) => {
      const link = el("a", "hit");
      link.href = `#/c/${encodeURIComponent(hit.conversation_id)}`
        + (hit.message_id ? `/m/${encodeURIComponent(hit.message_id)}` : "");
      const title = el("span", "hit-title");
      title.textContent = hit.title || "New conversation";
      const snippet = el("span", "hit-snippet");
      if (hit.message_id) snippet.append(...marked(hit.snippet, words));
      link.append(title, snippet);
      const li = el("li");
      li.append(link);
      return li;
    });
    if (message) {
      const li = el("li", "hit-none");
      li.textContent = message;
      rows.push(li);
    }
    this.ui.results.replaceChildren(...rows);
  }
}

// The snippet as text nodes, with the words that start with a query word in <mark>.
function marked(text, words) {
  return text.split(/(\s+)/).map((part) => {
    const bare = part.toLowerCase().normalize("NFKD").replace(/[\u0300-\u036f]/g, "").replace(/^\W+/, "");
    if (!part.trim() || !words.some((w) => bare.startsWith(w))) return document.createTextNode(part);
    const mark = el("mark");
    mark.textContent = part;
    return mark;
  });
}
