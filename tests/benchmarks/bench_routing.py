"""Routing policies on four simulated replicas, in virtual time: the scheduler's own placement code
(``consumers/scheduler/replicas.py``) over four ``SimCore`` replicas (the simulated engine's scheduler, its
prefix cache and prefill model), fed multi-turn conversations. No broker, no clock: one run takes seconds and
gives the same figures every time for a seed, whatever else the machine is doing.

Per policy: the prefix-cache hit rate (cached / prompt tokens; and past the shared system prompt, which every
replica holds whatever the policy), TTFT p50/p99 (arrival -> first token, virtual),
max/mean of the replicas' mean queues (running + waiting, sampled each virtual second), on the steady load, on
a skewed one (a few very long conversations), with a replica leaving half way (its conversations re-homed) and
with a fourth replica joining half way (it should take about its share, a quarter, and nothing else should move).
Replicas announce their held prefixes each virtual second, as the workers do.

    python -m tests.benchmarks.bench_routing [--rate 1.2] [--seconds 600] [--seed 0]
"""
from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from consumers.generation.announce import ReplicaAnnounced
from consumers.generation.sim_core import SimCore
from consumers.scheduler.placement import ROUTINGS, Routing
from consumers.scheduler.replicas import Replicas
from infra.config.pools import SimConfig

TOPIC = "generate.large.paid"
REPLICAS = 4
# The seeds' traffic: "every request starts with the same 1,000-token system prompt" (every replica soon holds
# it), replies of 640 tokens on average within a 2,000-token cap; a user's message is ~200 tokens here.
SYSTEM = list(range(50_000, 51_000))
MESSAGE_TOKENS = 200
REPLY_TOKENS, REPLY_CAP = 640, 2_000
SIM = SimConfig(reply_tokens=REPLY_TOKENS)
SEQS = 64


@dataclass
class Conversation:
    cid: str
    turns: int
    message_tokens: int
    prompt: list[int] = field(default_factory=lambda: list(SYSTEM))
    done: int = 0


@dataclass
class Run:
    ttft: list[float] = field(default_factory=list)
    prompt: int = 0
    cached: int = 0
    history: int = 0  # prompt tokens past the shared system prompt: what only a conversation's replica can hold
    history_cached: int = 0
    queues: dict[str, list[int]] = field(default_factory=dict)
    moved: int = 0  # turns after the leave of conversations last served by the replica that left
    kept: int = 0  # turns after the leave of the others that stayed on their replica
    others: int = 0  # turns after the leave of the others
    to_joiner: int = 0  # turns after the join of conversations that had a home, placed on the joiner
    stayed: int = 0  # ... kept on their home
    between: int = 0  # ... moved between two replicas that were there before the join (spills)

    def figures(self) -> dict[str, float | None]:
        means = [statistics.fmean(q) for q in self.queues.values() if q]
        ttft = sorted(self.ttft)
        return {"hit_rate": round(self.cached / self.prompt, 3) if self.prompt else None,
                "history_hit_rate": round(self.history_cached / self.history, 3) if self.history else None,
                "ttft_p50_s": round(ttft[len(ttft) // 2], 3), "ttft_p99_s": round(ttft[int(len(ttft) * 0.99)], 3),
                "queue_max_over_mean": round(max(means) / statistics.fmean(means), 2) if any(means) else None,
                "replies": len(ttft)}


def simulate(routing: Routing, rate: float, seconds: float, seed: int, skew: bool = False,
             leave_at: float | None = None, join_at: float | None = None) -> Run:
    rng = random.Random(seed)
    cores = {f"w{i}": SimCore(SIM, max_num_seqs=SEQS, max_num_batched_tokens=8192) for i in range(REPLICAS)}
    live = set(cores) - ({"w3"} if join_at is not None else set())  # a joiner is not there before join_at
    replicas = Replicas(routing, SIM.block_size, random.Random(seed + 1), floor=SEQS // 4)
    run = Run()
    events: list[tuple[float, int, str, Conversation]] = []  # (time, order, kind, conversation)
    arrived: dict[str, tuple[float, Conversation, str]] = {}  # request -> (arrival, conversation, replica)
    first: set[str] = set()
    homes: dict[str, str] = {}
    n = 0
    t = rng.expovariate(rate)
    while t < seconds:
        long_one = skew and rng.random() < 0.05
        conv = Conversation(f"c{n}", 12 if long_one else rng.randint(3, 8), 1500 if long_one else MESSAGE_TOKENS)
        heapq.heappush(events, (t, n, "turn", conv))
        n += 1
        t += rng.expovariate(rate)
    ticks = 0.0

    def announce(now: float) -> None:
        replicas.update(ReplicaAnnounced(worker_id=w, partitions={TOPIC: [i]}, active=0,
                                         prefixes=cores[w].held_prefixes())
                        for i, w in enumerate(sorted(live)))

    announce(0.0)
    while events or any(c.by_id for c in cores.values()):
        busy = [(c.now, w) for w, c in cores.items() if c.by_id]
        next_step = min(busy) if busy else (float("inf"), "")
        if events and events[0][0] <= next_step[0]:
            now, _, kind, conv = heapq.heappop(events)
            while ticks <= now:
                announce(ticks)
                for w in live:
                    run.queues.setdefault(w, []).append(len(cores[w].running) + len(cores[w].waiting))
                ticks += 1.0
            if leave_at is not None and now >= leave_at and "w3" in live:
                live.discard("w3")
                announce(now)
            if join_at is not None and now >= join_at and "w3" not in live:
                live.add("w3")
                announce(now)
            rid = f"{conv.cid}.{conv.done}"
            message = conv.message_tokens if conv.message_tokens > MESSAGE_TOKENS else \
                max(8, int(rng.expovariate(1 / conv.message_tokens)))
            conv.prompt += [rng.randrange(40_000) for _ in range(message)]
            placed = replicas.place(TOPIC, conv.cid, rid, list(conv.prompt))
            assert placed is not None
            w = placed.placement.replica
            if leave_at is not None and now >= leave_at and homes.get(conv.cid) == "w3":
                run.moved += 1
            elif leave_at is not None and now >= leave_at and conv.cid in homes:
                run.others += 1
                run.kept += homes[conv.cid] == w
            if join_at is not None and now >= join_at and conv.cid in homes:
                run.to_joiner += w == "w3" != homes[conv.cid]
                run.stayed += w == homes[conv.cid]
                run.between += w not in ("w3", homes[conv.cid])
            homes[conv.cid] = w
            core = cores[w]
            if not core.by_id and core.now < now:
                core.advance_idle(now - core.now)
            length = min(REPLY_CAP, max(8, int(rng.expovariate(1 / REPLY_TOKENS))))
            reply = [rng.randrange(40_000) for _ in range(length)]
            core.add(rid, list(conv.prompt), reply, "stop")
            arrived[rid] = (now, conv, w)
            conv.prompt += reply
            continue
        core = cores[next_step[1]]
        result = core.step()
        for out in result.outputs:
            rid = out.seq.request_id
            if rid not in first and out.token_ids:
                first.add(rid)
                run.ttft.append(core.now - arrived[rid][0])
            if out.finish_reason is not None:
                _, conv, _ = arrived.pop(rid)
                replicas.finished(rid)
                run.prompt += len(out.seq.prompt)
                run.cached += max(0, out.seq.cached_prompt_tokens)
                run.history += len(out.seq.prompt) - len(SYSTEM)
                run.history_cached += max(0, out.seq.cached_prompt_tokens - len(SYSTEM))
                conv.done += 1
                if conv.done < conv.turns:
                    heapq.heappush(events, (core.now + rng.expovariate(1 / 5.0), n, "turn", conv))  # ~5 s to read
                    n += 1
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1.2, help="new conversations a second")
    parser.add_argument("--seconds", type=float, default=600.0, help="virtual seconds of arrivals")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows: dict[str, dict[str, Any]] = {}
    for routing in ROUTINGS:
        steady = simulate(routing, args.rate, args.seconds, args.seed)
        skewed = simulate(routing, args.rate, args.seconds, args.seed, skew=True)
        leave = simulate(routing, args.rate, args.seconds, args.seed, leave_at=args.seconds / 2)
        join = simulate(routing, args.rate, args.seconds, args.seed, join_at=args.seconds / 2)
        turns = join.to_joiner + join.stayed + join.between
        rows[routing] = {"steady": steady.figures(), "skewed": skewed.figures(),
                         "a replica leaves": {**leave.figures(), "others_kept": f"{leave.kept}/{leave.others}",
                                              "turns_moved_from_leaver": leave.moved},
                         "a replica joins": {**join.figures(), "to_joiner": f"{join.to_joiner}/{turns}",
                                             "kept": f"{join.stayed}/{turns}",
                                             "moved_between_others": f"{join.between}/{turns}"}}
        print(routing, json.dumps(rows[routing]), flush=True)
    base = rows["random"]["steady"]
    for routing in ROUTINGS:
        r = rows[routing]["steady"]
        print(f"{routing:>13}: hit {r['hit_rate']:.0%} ({(r['hit_rate'] - base['hit_rate']) * 100:+.0f} points), "
              f"past the system prompt {r['history_hit_rate']:.0%} "
              f"({(r['history_hit_rate'] - base['history_hit_rate']) * 100:+.0f} points), "
              f"TTFT p50 {r['ttft_p50_s']:.3f} s ({base['ttft_p50_s'] / r['ttft_p50_s']:.1f}x random's), "
              f"skewed max/mean queue {rows[routing]['skewed']['queue_max_over_mean']}")


if __name__ == "__main__":
    main()
