"""``parley chat``: a terminal client. Streams each reply as it is generated; Ctrl-C during a reply stops
it (a real cancel through the pipeline) and a second Ctrl-C quits; Ctrl-C or Ctrl-D at the prompt quits.
Prints TTFT and tokens/s per reply. Every failure is one line on stderr and a non-zero exit, no traceback.

Exit codes: 0 done, 1 the service refused or failed, 2 no token, 3 the service cannot be reached,
130 interrupted while stopping a reply.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import httpx
import orjson

from infra.config.settings import Settings, env_var
from schemas.errors import ParleyError

UNREACHABLE, INTERRUPTED = 3, 130


class ChatError(ParleyError):
    """Ends the client with one line and an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--url", default=None, help="gateway URL (default: http://127.0.0.1:<gateway port>)")
    parser.add_argument("--token", default=None, help=f"bearer token (default: {env_var('TOKEN')}, else the demo user)")
    parser.add_argument("--model", default=None, help="model pool")
    parser.add_argument("--conversation", default=None, help="continue this conversation")
    parser.add_argument("message", nargs="*", help="send this one message and exit")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    token = args.token or settings.token or _demo_token(settings)
    if not token:
        print(f"No token: pass --token, set {env_var('TOKEN')}, or run `parley up` to make a demo user.",
              file=sys.stderr)
        return 2
    url = args.url or f"http://127.0.0.1:{settings.ports.gateway}"
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                          timeout=httpx.Timeout(300, connect=5)) as http:
            return _chat(http, args)
    except ChatError as err:
        print(f"\nparley chat: {err}", file=sys.stderr)
        return err.code
    except httpx.TransportError as err:
        print(f"\nparley chat: cannot reach Parley at {url} ({type(err).__name__}: {err or 'no answer'}). "
              "Is it running? `parley status` says.", file=sys.stderr)
        return UNREACHABLE
    except KeyboardInterrupt:
        print("\nparley chat: interrupted.", file=sys.stderr)
        return INTERRUPTED


def _demo_token(settings: Settings) -> str | None:
    from infra.local.stack import demo_file, load_demo_user

    demo = load_demo_user(demo_file(settings))
    return demo.token if demo else None


def _chat(http: httpx.Client, args: argparse.Namespace) -> int:
    cid = args.conversation or _json(http.post("/v1/conversations", json={}), 201)["conversation_id"]
    if args.message:
        return _turn(http, cid, " ".join(args.message), args.model)
    print(f"conversation {cid}  (Ctrl-C stops a reply; Ctrl-C or Ctrl-D at the prompt quits)", file=sys.stderr)
    while True:
        try:
            line = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if line.strip():
            _turn(http, cid, line, args.model)


def _turn(http: httpx.Client, cid: str, content: str, model: str | None) -> int:
    """One message and its streamed reply; Ctrl-C while it streams cancels it and shows it to its end."""
    state: dict[str, Any] = {"sent": time.perf_counter()}
    body = {"content": content, **({"model": model} if model else {})}
    try:
        with http.stream("POST", f"/v1/conversations/{cid}/messages", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise ChatError(_error_line(r))
            _follow(r, state)
    except KeyboardInterrupt:
        _cancel(http, state)
        try:  # the stop arrives as the reply's own end: follow it there, after the last event shown
            after = {"after": state["last_id"]} if "last_id" in state else {}
            with http.stream("GET", f"/v1/generations/{state['generation_id']}/stream", params=after) as r:
                _follow(r, state)
        except KeyboardInterrupt:
            raise ChatError("interrupted again while stopping the reply; quitting.", INTERRUPTED) from None
    return 1 if state.get("failed") else 0


def _cancel(http: httpx.Client, state: dict[str, Any]) -> None:
    generation_id = state.get("generation_id")
    if generation_id is None:
        raise ChatError("interrupted before the reply started; quitting.", INTERRUPTED)
    print("\n[stopping…]", file=sys.stderr)
    r = http.post(f"/v1/generations/{generation_id}/cancel")
    if r.status_code != 202:
        raise ChatError(f"could not stop the reply: {_error_line(r)}")


def _follow(r: httpx.Response, state: dict[str, Any]) -> None:
    event = ""
    for line in r.iter_lines():
        if line.startswith("id:"):
            state["next_id"] = line[3:].strip()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            _show(event, orjson.loads(line[5:]), state)
            if "next_id" in state:
                state["last_id"] = state.pop("next_id")  # shown: a resume starts after it
            if event == "message_end":
                return


def _show(event: str, data: dict[str, Any], state: dict[str, Any]) -> None:
    """Only the reply's text goes to stdout (so `parley chat "…" > file` holds just the reply, ending in a
    newline); who answered, waits, errors and figures go to stderr."""
    if event == "message_start" and "generation_id" not in state:
        state["generation_id"] = data["generation_id"]
        _note(f"[{data['model']} via {data.get('pool')}{_fallback(data)}] ")
    elif event == "queued":
        _note(f"(queued: position {data['position']}, ~{data['estimated_wait_s']} s) ")
    elif event in ("delta", "snapshot"):
        state.setdefault("first", time.perf_counter())
        print(data["text"], end="", flush=True)
        state["mid_line"] = not data["text"].endswith("\n") if data["text"] else state.get("mid_line", False)
    elif event == "error":
        state["failed"] = True
        _end_line(state)
        print(f"[error] {data.get('message')}", file=sys.stderr)
    elif event == "message_end":
        _end_line(state)
        first = state.get("first") or state["sent"]
        took, out = time.perf_counter() - first, data["usage"]["out"]
        state["failed"] = state.get("failed") or data["stop_reason"] == "error"
        print(f"[{data['stop_reason']}; {data['usage']['in']} in / {out} out; TTFT "
              f"{(first - state['sent']) * 1000:.0f} ms; {out / took if took > 0 else 0:.1f} tok/s]", file=sys.stderr)


def _fallback(start: dict[str, Any]) -> str:
    """Said at the start when the reply is not from the model asked for."""
    if start.get("route_reason") == "canned":
        return ": every model was busy, a prepared reply"
    if start.get("route_reason") == "overflow":
        return f": {start.get('requested_pool') or 'the model asked for'} was busy"
    return ""


def _note(text: str) -> None:
    print(text, end="", file=sys.stderr, flush=True)


def _end_line(state: dict[str, Any]) -> None:
    """The reply's text ends with a newline on stdout, whatever the model's last token was."""
    if state.pop("mid_line", False):
        print(flush=True)


def _json(r: httpx.Response, status: int) -> dict[str, Any]:
    if r.status_code != status:
        raise ChatError(_error_line(r))
    return dict(r.json())


def _error_line(r: httpx.Response) -> str:
    try:
        message = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = r.text.strip()[:200] or r.reason_phrase
    return f"error {r.status_code}: {message}"
