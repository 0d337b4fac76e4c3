"""Stop latency: ``POST /v1/generations/{id}/cancel`` -> the last token event of that generation.

The whole service (stages, one gateway, the large worker) on a private topic prefix. Each sample sends a
message asking for a long reply (paid user), reads its SSE stream until a few deltas have arrived, then
cancels it. A tap on ``chat.tokens`` gives every ``TokensAppended.at`` of the generation and its
``GenerationFinished``. Reported, from the moment the cancel request was sent: the last token event
(``at``), in ms and in engine steps (divided by that generation's own median inter-token time before the
cancel), tokens appended after the cancel, the ``GenerationFinished(status=stopped)`` and the client's
``message_end``. A generation whose last token was made before the cancel was sent stopped at once: 0 ms
(the raw, negative difference is kept as ``stop_raw_ms``). ``--background`` keeps other replies streaming
meanwhile, so the engine is batching.

    python -m tests.benchmarks.bench_stop [--quick] [--samples 20] [--background 2]
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from typing import Any

import httpx

from schemas import GenerationFinished, TokensAppended
from tests.benchmarks import common
from tests.benchmarks.sse_client import SseStream

POOL_ENV = {"PARLEY_POOL_LARGE_KV_CACHE_GIB": "1"}
REPLY_CAP = 256  # long enough that no reply ends by itself before the cancel


async def converse(port: int, http: httpx.AsyncClient, user: common.User, i: int,
                   cancel_after: int | None) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {user.token}"}
    conv = (await http.post("/v1/conversations", headers=auth)).json()["conversation_id"]
    stream = SseStream(port, "POST", f"/v1/conversations/{conv}/messages", user.token,
                       body={"content": common.story_request(i)})
    out: dict[str, Any] = {"deltas": 0}

    async def cancel() -> None:  # beside the reader, so frames keep their true arrival times
        r = await http.post(f"/v1/generations/{out['gid']}/cancel", headers=auth)
        out["cancel_http_s"] = time.time() - out["cancel_at"]
        r.raise_for_status()

    cancelling: asyncio.Task[None] | None = None
    try:
        await stream.open()
        async for f in stream.frames():
            if f.event == "message_start":
                out["gid"] = f.data["generation_id"]
            elif f.event == "delta":
                out["deltas"] += 1
                if out["deltas"] == cancel_after:
                    out["cancel_at"] = time.time()
                    cancelling = asyncio.create_task(cancel())
            elif f.event in ("message_end", "error"):
                out["end_at"], out["stop_reason"] = f.received, f.data.get("stop_reason", f.event)
                break
        if cancelling is not None:
            await cancelling
    finally:
        await stream.close()
    return out


def measure(sample: dict[str, Any], events: list[tuple[float, int, Any]]) -> dict[str, Any]:
    t = sample["cancel_at"]
    tokens = sorted((e for _, _, e in events if isinstance(e, TokensAppended)), key=lambda e: e.seq)
    finished = next(e for _, _, e in events if isinstance(e, GenerationFinished))
    before = [e.at for e in tokens if e.at <= t]
    itl = statistics.median([b - a for a, b in itertools.pairwise(before)]) if len(before) > 2 else float("nan")
    last = tokens[-1].at
    # A last token made before the cancel was sent means nothing came after it: a stop of 0.
    return {"stop_s": max(0.0, last - t), "stop_raw_s": last - t, "steps": max(0.0, last - t) / itl, "itl_s": itl,
            "tokens_after": sum(len(e.token_ids) for e in tokens if e.at > t),
            "finished_s": finished.at - t, "client_end_s": sample["end_at"] - t,
            "cancel_http_s": sample["cancel_http_s"], "status": finished.status}


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    settings = await common.bench_settings("s")
    env = dict(POOL_ENV, PARLEY_PLANS_FILE=str(common.plans_file(REPLY_CAP)))
    svc = common.service(settings, "bench_stop", **env)
    tap = common.TokenTap(settings)
    stopping = asyncio.Event()
    try:
        common.start_pipeline(svc)
        port = svc.procs["gateway-a"].port or 0
        users = await common.make_users(settings, "paid", 2)
        await tap.start()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            async def background(k: int) -> None:
                while not stopping.is_set():
                    await converse(port, http, users[1], 100 + k, cancel_after=None)

            await converse(port, http, users[0], 0, cancel_after=None)  # warm-up, not counted
            load = [asyncio.create_task(background(k)) for k in range(ns.background)]
            await asyncio.sleep(2 if ns.background else 0)
            rows = []
            for i in range(ns.samples):
                sample = await asyncio.wait_for(converse(port, http, users[0], i, cancel_after=ns.after), 180)
                rows.append(measure(sample, await tap.finished(sample["gid"], 60)))
            stopping.set()
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
        return {"samples": len(rows), "background": ns.background, "cancel_after_deltas": ns.after,
                "statuses": sorted({r["status"] for r in rows}),
                "stop_ms": common.summary([r["stop_s"] for r in rows], 1000),
                "stop_raw_ms": common.summary([r["stop_raw_s"] for r in rows], 1000),
                "stop_steps": common.summary([r["steps"] for r in rows]),
                "itl_ms": common.summary([r["itl_s"] for r in rows], 1000),
                "tokens_after_cancel": common.summary([r["tokens_after"] for r in rows]),
                "finished_ms": common.summary([r["finished_s"] for r in rows], 1000),
                "client_end_ms": common.summary([r["client_end_s"] for r in rows], 1000),
                "cancel_http_ms": common.summary([r["cancel_http_s"] for r in rows], 1000)}
    finally:
        stopping.set()
        await tap.stop()
        common.stop_service(svc)
        await common.delete_topics(settings)


async def main(ns: argparse.Namespace) -> None:
    from infra.config.settings import Settings
    from infra.local.model import ready_pool as load_pool

    pool = load_pool("large", Settings.from_env())
    common.header("bench_stop: cancel request -> last token event", engine="eager" if pool.enforce_eager
                  else "compiled", model=pool.served_model_name, concurrency=f"1 measured + {ns.background} "
                  "background", samples=ns.samples, cancel_after_deltas=ns.after)
    out = await run(ns)
    print(f"   stop (cancel sent -> last TokensAppended.at): p50 {out['stop_ms']['p50']:.1f} ms, p95 "
          f"{out['stop_ms']['p95']:.1f} ms = p50 {out['stop_steps']['p50']:.2f}, p95 {out['stop_steps']['p95']:.2f} "
          f"engine steps (inter-token p50 {out['itl_ms']['p50']:.1f} ms)")
    print(f"   tokens after the cancel p50 {out['tokens_after_cancel']['p50']:.0f} p95 "
          f"{out['tokens_after_cancel']['p95']:.0f}; GenerationFinished p50 {out['finished_ms']['p50']:.1f} ms; "
          f"client message_end p50 {out['client_end_ms']['p50']:.1f} ms; cancel POST p50 "
          f"{out['cancel_http_ms']['p50']:.1f} ms; statuses {out['statuses']}")
    common.write_result("bench_stop", {"engine": "eager" if pool.enforce_eager else "compiled",
                                       "model": pool.served_model_name, **out})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized: 5 samples, 1 background reply")
    parser.add_argument("--samples", type=int, default=None, help="cancelled replies (default 20, quick 5)")
    parser.add_argument("--background", type=int, default=None, help="replies streaming meanwhile (default 2)")
    parser.add_argument("--after", type=int, default=5, help="deltas received before the cancel")
    ns = parser.parse_args()
    ns.samples = ns.samples or (5 if ns.quick else 20)
    ns.background = ns.background if ns.background is not None else (1 if ns.quick else 2)
    return ns


if __name__ == "__main__":
    asyncio.run(main(parse()))
