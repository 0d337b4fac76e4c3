"""A chat client as the fault tests see the service: send, follow the SSE stream, and when the connection
drops (a gateway killed) resume with Last-Event-ID, as the page's EventSource does."""
from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.faults.invariants import Send


async def _events(response: httpx.Response, send: Send, last_id: list[int | None]) -> None:
    event, data, ident = "", "", None
    seen = time.monotonic()
    async for line in response.aiter_lines():
        if line.startswith(":"):
            continue  # keep-alive: not an event
        if line.startswith("id: "):
            ident = int(line[4:])
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and event:
            now = time.monotonic()
            send.longest_gap_s, seen = max(send.longest_gap_s, now - seen), now
            body = json.loads(data) if data else {}
            if event == "message_start":
                send.generation_id = body.get("generation_id") or send.generation_id
            elif event == "delta":
                send.deltas.append((ident if ident is not None else -1, body["text"]))
            elif event == "snapshot":
                send.snapshot = body["text"]
            elif event == "recovering":
                send.recovering += 1
                store = body.get("store")  # which store, for store_unavailable: "store_unavailable:Kafka"
                send.reasons.append(body.get("reason", "") + (f":{store}" if store else ""))
            elif event == "message_end":
                send.ended = body["stop_reason"]
                return
            if ident is not None:
                last_id[0] = ident
            event, data, ident = "", "", None


async def chat(url: str, token: str, user_id: str, conversation_id: str, content: str,
               give_up_s: float = 240, seen: list[Send] | None = None) -> Send:
    """One send followed to its end; ``seen`` gets the send at once, so a test can read its generation
    id (and what has streamed so far) while it runs."""
    headers = {"Authorization": f"Bearer {token}"}
    send = Send(user_id, conversation_id, 0)
    if seen is not None:
        seen.append(send)
    last_id: list[int | None] = [None]
    deadline = time.monotonic() + give_up_s
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60, connect=5)) as http:
        try:
            async with http.stream("POST", f"/v1/conversations/{conversation_id}/messages", headers=headers,
                                   json={"content": content, "client_message_id": f"{conversation_id}-1"}) as r:
                send.status = r.status_code
                send.generation_id = r.headers.get("x-generation-id", "")
                if r.status_code == 200:
                    await _events(r, send, last_id)
        except httpx.HTTPError:
            pass  # the gateway went away mid-stream: resume below
        while send.status == 200 and not send.ended and time.monotonic() < deadline:
            try:
                resume = headers | ({"Last-Event-ID": str(last_id[0])} if last_id[0] is not None else {})
                async with http.stream("GET", f"/v1/generations/{send.generation_id}/stream",
                                       headers=resume) as r:
                    if r.status_code == 200:
                        await _events(r, send, last_id)
                    else:
                        await asyncio.sleep(1)
            except httpx.HTTPError:
                await asyncio.sleep(1)
    return send


async def new_conversation(url: str, token: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for _ in range(60):
            r = await http.post("/v1/conversations", headers={"Authorization": f"Bearer {token}"})
            if r.status_code == 201:
                return r.json()["conversation_id"]  # type: ignore[no-any-return]
            await asyncio.sleep(1)
    raise RuntimeError("could not make a conversation")
