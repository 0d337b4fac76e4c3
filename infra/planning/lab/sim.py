"""One model replica for a minute, under static, continuous or chunked-prefill batching.

Pure and seeded: `simulate(config, mode)` returns a `Run` (every request's timestamps and every step's
contents). No plotting and no I/O: plot.py draws a Run, metrics.py sums it up, cli.py prints it.
Illustrative, not a benchmark: step costs are the seed's round numbers, not measurements.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum


class Mode(StrEnum):
    STATIC = "static"  # a batch is admitted together; nobody joins until all of it has finished
    CONTINUOUS = "continuous"  # join and leave at every step; a joiner's whole prefill stalls its step
    CHUNKED = "chunked"  # continuous, with prefill cut into chunks that ride along with decode steps


@dataclass(frozen=True)
class LabConfig:
    seed: int = 7
    duration_s: float = 60.0
    arrival_rps: float = 1.5
    reply_tokens: tuple[int, int, int] = (20, 120, 600)  # min, median, max: a sentence to a page
    prompt_tokens: tuple[int, int, int] = (50, 400, 2000)
    step_ms: float = 30.0  # one decode step reads the weights once, whatever the batch...
    step_ms_per_seq: float = 0.5  # ...plus a little per sequence for its cache
    max_seqs: int = 16
    static_max_seqs: int = 8
    prefill_ms_per_token: float = 0.14
    chunk_tokens: int = 256


@dataclass(frozen=True)
class Request:
    id: int
    arrival_s: float
    prompt_tokens: int
    reply_tokens: int


@dataclass
class Progress:
    """A request's working state while the simulation runs."""

    request: Request
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    prefilled: int = 0
    generated: int = 0


@dataclass(frozen=True)
class Step:
    start_s: float
    end_s: float
    seqs: tuple[int, ...]  # request ids in memory during the step
    admitted: tuple[int, ...]  # ids that joined at its start
    prefill_tokens: int
    tokens: int  # tokens emitted at its end, first tokens included


@dataclass(frozen=True)
class Run:
    mode: Mode
    config: LabConfig
    requests: tuple[Progress, ...]
    steps: tuple[Step, ...] = field(repr=False)


def _lognormal_int(rng: random.Random, bounds: tuple[int, int, int], sigma: float) -> int:
    low, median, high = bounds
    return int(min(high, max(low, rng.lognormvariate(math.log(median), sigma))))


def workload(config: LabConfig) -> tuple[Request, ...]:
    """Poisson arrivals with long-tailed prompts and replies; the same for every mode of one seed."""
    rng = random.Random(config.seed)
    out: list[Request] = []
    t = rng.expovariate(config.arrival_rps)
    while t < config.duration_s:
        prompt = _lognormal_int(rng, config.prompt_tokens, 0.8)
        reply = _lognormal_int(rng, config.reply_tokens, 0.9)
        out.append(Request(len(out), t, prompt, reply))
        t += rng.expovariate(config.arrival_rps)
    return tuple(out)


def _admit(
    mode: Mode, config: LabConfig, waiting: deque[Progress], running: list[Progress]
) -> list[Progress]:
    if mode is Mode.STATIC:
        if running:  # the batch in flight must drain first: that is what makes it static
            return []
        cap = config.static_max_seqs
    else:
        cap = config.max_seqs
    joined: list[Progress] = []
    while waiting and len(running) + len(joined) < cap:
        joined.append(waiting.popleft())
    return joined


def _prefill_plan(mode: Mode, config: LabConfig, running: list[Progress]) -> dict[int, int]:
    """Prompt tokens each sequence prefills this step: all of it at once, or chunks from a shared budget."""
    plan: dict[int, int] = {}
    budget = config.chunk_tokens if mode is Mode.CHUNKED else math.inf
    for p in running:  # admission order, so the oldest prompt finishes first
        todo = p.request.prompt_tokens - p.prefilled
        if todo > 0 and budget > 0:
            plan[p.request.id] = int(min(todo, budget))
            budget -= plan[p.request.id]
    return plan


def _step_ms(config: LabConfig, running: list[Progress], prefill_tokens: int) -> float:
    decode = config.step_ms + config.step_ms_per_seq * len(running)
    return decode + config.prefill_ms_per_token * prefill_tokens


def _apply(running: list[Progress], plan: dict[int, int], end_s: float) -> int:
    """Advance every sequence by one step; return tokens emitted (prefill's last chunk emits the first)."""
    emitted = 0
    for p in running:
        p.prefilled += plan.get(p.request.id, 0)
        if p.prefilled < p.request.prompt_tokens:
            continue
        p.generated += 1
        emitted += 1
        if p.first_token_s is None:
            p.first_token_s = end_s
        if p.generated == p.request.reply_tokens:
            p.finished_s = end_s
    return emitted


def simulate(config: LabConfig, mode: Mode) -> Run:
    requests = [Progress(r) for r in workload(config)]
    waiting: deque[Progress] = deque()
    running: list[Progress] = []
    steps: list[Step] = []
    now, arrived = 0.0, 0
    while True:
        # 1. everyone who has arrived by now joins the queue
        while arrived < len(requests) and requests[arrived].request.arrival_s <= now:
            waiting.append(requests[arrived])
            arrived += 1
        # 2. admit into the batch, as the mode allows
        joined = _admit(mode, config, waiting, running)
        for p in joined:
            p.admitted_s = now
        running.extend(joined)
        # 3. idle: jump to the next arrival
        if not running:
            if arrived == len(requests) or requests[arrived].request.arrival_s >= config.duration_s:
                break
            now = requests[arrived].request.arrival_s
            continue
        # 4. one step; a step that would end after the window is never seen
        plan = _prefill_plan(mode, config, running)
        end = now + _step_ms(config, running, sum(plan.values())) / 1000
        if end > config.duration_s:
            break
        ids = tuple(p.request.id for p in running)
        tokens = _apply(running, plan, end)
        steps.append(Step(now, end, ids, tuple(p.request.id for p in joined), sum(plan.values()), tokens))
        running = [p for p in running if p.finished_s is None]
        now = end
    return Run(mode, config, tuple(requests), tuple(steps))
