// Talking to the gateway: JSON calls, starting a reply, and following it with EventSource.
//
// Everything rides on the HttpOnly session cookie set at sign-in (same origin only), because
// the browser's EventSource cannot send an Authorization header.

export class ApiError extends Error {
  constructor(status, code, message, retryAfterS = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfterS = retryAfterS;
  }
}

// Called with every 401, so the page can go back to the sign-in screen.
let onSignedOut = () => {};
export function whenSignedOut(handler) { onSignedOut = handler; }

export async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: { accept: "application/json" } };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError(0, "offline", "Can't reach Parley. Check your connection; nothing was sent twice.");
  }
  if (!response.ok) throw await errorOf(response);
  return response.status === 204 ? null : response.json();
}

async function errorOf(response) {
  let error = null;
  try {
    error = (await response.json()).error;
  } catch { /* not JSON: described below */ }
  const retry = error?.retry_after_s ?? (Number(response.headers.get("retry-after")) || null);
  const message = error?.message || `Parley answered ${response.status} ${response.statusText}. Try again.`;
  const err = new ApiError(response.status, error?.code || "http_error", message, retry);
  if (response.status === 401) onSignedOut(err);
  return err;
}

// POST a message (or a regenerate): the response is itself an SSE stream. Read it only as far
// as `message_start`, then let go: the caller follows the reply with `follow()`, which replays
// from the start of the generation and survives dropped connections.
export async function startReply(path, body) {
  const abort = new AbortController();
  let response;
  try {
    response = await fetch(path, {
      method: "POST", credentials: "same-origin", signal: abort.signal,
      headers: { "content-type": "application/json", accept: "text/event-stream" },
      body: JSON.stringify(body),
    });
  } catch {
    throw new ApiError(0, "offline", "Can't reach Parley, so the message was not sent. Try again.");
  }
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = parseFrame(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (frame?.event === "message_start") return frame.data;
        if (frame?.event === "error") throw new ApiError(frame.data.status || 0, frame.data.code || "refused",
          frame.data.message, frame.data.retry_after_s ?? null);
      }
    }
  } catch (err) {
    if (err instanceof ApiError) throw err;
    throw new ApiError(0, "offline", "The connection dropped before the reply started. Try again.");
  } finally {
    abort.abort();
  }
  throw new ApiError(0, "no_start", "The reply ended before it started. Try again.");
}

function parseFrame(text) {
  let event = "message";
  const data = [];
  for (const line of text.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  return data.length ? { event, data: JSON.parse(data.join("\n")) } : null;
}

// Follow one generation with the browser's EventSource. After a drop the browser reconnects by
// itself with Last-Event-ID (the Kafka offset of the last event), and the gateway replays only
// what came after it. If the browser gives up (EventSource CLOSED), reopen with ?after=<id>.
// Deltas at or below the last id seen are skipped, so nothing is ever shown twice.
//
// handlers: start(data), queued(data), recovering(data), delta(text), snapshot(text), retracted(notice), end(data),
//           error(data),
//           state("live" | "reconnecting" | "lost")
export function follow(generationId, handlers) {
  const base = `/v1/generations/${encodeURIComponent(generationId)}/stream`;
  let source = null;
  let lastId = null;
  let finished = false;
  let failures = 0;
  let timer = null;

  const on = (name, fn) => source.addEventListener(name, (e) => {
    if (finished) return;
    const id = e.lastEventId ? Number(e.lastEventId) : null;
    if (name === "delta" && id !== null && lastId !== null && id <= lastId) return;
    if (id !== null) lastId = id;
    fn(JSON.parse(e.data));
  });

  const finish = () => {
    finished = true;
    clearTimeout(timer);
    source?.close(); // else the browser would reconnect after the stream ends
  };

  const open = () => {
    source = new EventSource(lastId === null ? base : `${base}?after=${lastId}`);
    source.onopen = () => { failures = 0; handlers.state("live"); };
    on("message_start", handlers.start);
    on("queued", handlers.queued);
    on("recovering", (d) => handlers.recovering?.(d));
    on("delta", (d) => handlers.delta(d.text));
    on("snapshot", (d) => handlers.snapshot(d.text));
    on("retracted", (d) => handlers.retracted(d.notice));
    on("message_end", (d) => { finish(); handlers.end(d); });
    source.addEventListener("error", (e) => {
      if (finished) return;
      if (e instanceof MessageEvent) { // the server's own `event: error`: the reply failed or was refused
        const data = JSON.parse(e.data);
        if (e.lastEventId) lastId = Number(e.lastEventId);
        if (data.status) { finish(); handlers.end({ stop_reason: "error" }); }
        handlers.error(data);
        return;
      }
      failures += 1;
      handlers.state(failures >= 5 ? "lost" : "reconnecting");
      if (source.readyState === EventSource.CLOSED) { // the browser gave up: try again ourselves
        const wait = Math.min(8000, 500 * 2 ** Math.min(failures, 4));
        timer = setTimeout(() => { if (!finished) open(); }, wait);
      }
    });
  };

  open();
  return { close: finish, get lastId() { return lastId; } };
}

// Every message of a conversation (all pages of them), and its title.
export async function loadConversation(conversationId) {
  const items = [];
  let cursor = null;
  let title = null;
  do {
    const query = new URLSearchParams({ limit: "500", ...(cursor ? { cursor } : {}) });
    const page = await api("GET", `/v1/conversations/${encodeURIComponent(conversationId)}/messages?${query}`);
    items.push(...page.items);
    ({ title } = page);
    cursor = page.next_cursor;
  } while (cursor);
  return { title, items };
}
