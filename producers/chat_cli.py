"""``parley chat``: a terminal client. Streams each reply as it is generated; Ctrl-C stops the reply
(a real cancel through the pipeline), Ctrl-C at the prompt quits. Prints TTFT and tokens/s per reply."""
from __future__ import annotations

import argparse
import asyncio
import sys
import time

import httpx
import orjson

from infra.config.settings import Settings, env_var


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
    return asyncio.run(_chat(url, token, args))


def _demo_token(settings: Settings) -> str | None:
    from infra.local.stack import demo_file, load_demo_user

    demo = load_demo_user(demo_file(settings))
    return demo.token if demo else None


async def _chat(url: str, token: str, args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=httpx.Timeout(300, connect=5)) as http:
        cid = args.conversation or (await http.post("/v1/conversations", json={})).json()["conversation_id"]
        print(f"conversation {cid}  (Ctrl-C stops a reply; Ctrl-D quits)", file=sys.stderr)
        if args.message:
            return await _turn(http, cid, " ".join(args.message), args.model)
        while True:
            try:
                line = await asyncio.to_thread(input, "you> ")
            except (EOFError, KeyboardInterrupt, asyncio.CancelledError):
                return 0
            if line.strip():
                await _turn(http, cid, line, args.model)


async def _turn(http: httpx.AsyncClient, cid: str, content: str, model: str | None) -> int:
    state: dict[str, object] = {}
    task = asyncio.create_task(_stream(http, cid, content, model, state))
    try:
        return await asyncio.shield(task)
    except (KeyboardInterrupt, asyncio.CancelledError):
        if "generation_id" in state:
            await http.post(f"/v1/generations/{state['generation_id']}/cancel")
        return await task


async def _stream(http: httpx.AsyncClient, cid: str, content: str, model: str | None, state: dict[str, object]) -> int:
    sent = time.perf_counter()
    first, deltas, event = None, 0, ""
    async with http.stream("POST", f"/v1/conversations/{cid}/messages",
                           json={"content": content, **({"model": model} if model else {})}) as r:
        if r.status_code != 200:
            print(f"error {r.status_code}: {orjson.loads(await r.aread())['error']['message']}", file=sys.stderr)
            return 1
        async for line in r.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = orjson.loads(line[5:])
                if event == "message_start":
                    state["generation_id"] = data["generation_id"]
                    print(f"[{data['model']} via {data.get('pool')}] ", end="", flush=True)
                elif event == "queued":
                    print(f"(queued: position {data['position']}, ~{data['estimated_wait_s']} s) ", end="", flush=True)
                elif event == "delta":
                    first = first or time.perf_counter()
                    deltas += 1
                    print(data["text"], end="", flush=True)
                elif event == "error":
                    print(f"\n[error] {data.get('message')}", file=sys.stderr)
                elif event == "message_end":
                    took = time.perf_counter() - (first or sent)
                    out = data["usage"]["out"]
                    print(f"\n[{data['stop_reason']}; {data['usage']['in']} in / {out} out; TTFT "
                          f"{((first or sent) - sent) * 1000:.0f} ms; {out / took if took > 0 else 0:.1f} tok/s]",
                          file=sys.stderr)
    return 0
