"""The simulated engine's scheduler: one GPU replica's steps in virtual time, pure and deterministic.

``SimCore`` is what vLLM's v1 ``EngineCore`` is to its process wrapper: it decides each step (which
sequences decode, which prompt chunks ride along, what is preempted), prices it with the capacity model and
advances every sequence by what the step computed. It never sleeps and never reads a clock: ``step()``
returns the step's duration and ``sim_engine.SimEngine`` sleeps it. Unit tests drive it alone.

The model, in the seeds' terms (``infra.planning.capacity``):
- a decode step reads the weights once plus the KV cache of every scheduled sequence, at the memory
  bandwidth: 140 GB / 8 TB/s = 17.5 ms alone, 36 ms at 183 sequences of 2,500 tokens;
- a prompt chunk adds ``prefill_s_per_1k`` per 1,000 tokens to the step it rides in (0.14 s per 1,000);
- the KV cache is ``cache_tokens`` in blocks of ``block_size``; a sequence holds ceil(tokens / block) blocks;
  a full block is cached by the hash of its tokens and everything before it, so a shared system prompt or a
  conversation's earlier turns are not computed again; freed blocks stay cached until reused (LRU);
- when a running sequence needs a block and none is free, the lowest-priority, latest sequence is preempted
  and recomputed later (vLLM's recompute preemption);
- priority: lower first, then arrival; at most ``max_num_seqs`` sequences run, within a token budget a step;
- disaggregated: a prefill replica computes the prompt (one at a time, its own timeline) and hands the KV over
  at ``transfer_gb_per_s`` before the sequence joins the decode batch, so decode steps carry no prefill.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from infra.config.pools import SimConfig

GB = 1e9
KIB = 1024
# The prefixes a replica announces (``held_prefixes``): the chain hash of every CHECKPOINT_BLOCKS-th full block
# and of the last one of each finished sequence, the RECENT_PREFIXES most recent, those still cached. A router
# matching a prompt against them finds the replica holding the longest start of it, to a checkpoint.
CHECKPOINT_BLOCKS = 8
RECENT_PREFIXES = 4096


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """The chain hash of each full block of ``tokens``: the same values the replica caches blocks by (a tuple
    of ints hashes alike in every process, whatever PYTHONHASHSEED)."""
    out, parent = [], 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, *tokens[start:start + block_size]))
        out.append(parent)
    return out


@dataclass(eq=False)
class SimSequence:
    """One request's working state inside the simulated replica."""

    request_id: str
    prompt: list[int]
    reply: Sequence[int]  # the tokens it will produce, in order (its length is the reply's length)
    finish_reason: str  # when the reply runs out: "stop" or "length"
    priority: int
    arrival: int
    output: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV is computed (prompt, then output)
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chain hash of each full block of prompt + output
    cached_prompt_tokens: int = -1  # prefix-cache hit at first admission; -1 before
    ready_at: float = 0.0  # disaggregated: when its handed-over KV lands on the decode replica
    aborted: bool = False
    landed: bool = False  # disaggregated: its prompt's KV arrived from the prefill replica, not yet placed
    handed_over: bool = False  # disaggregated: its prompt was computed by the prefill replica
    preemptions: int = 0

    @property
    def tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    def token_at(self, i: int) -> int:
        n = len(self.prompt)
        return self.prompt[i] if i < n else self.output[i - n]


@dataclass(frozen=True)
class SeqOutput:
    seq: SimSequence
    token_ids: tuple[int, ...]
    finish_reason: str | None  # None while running


@dataclass(frozen=True)
class StepResult:
    duration_s: float
    outputs: tuple[SeqOutput, ...]
    decode_seqs: int
    prefill_tokens: int


class BlockPool:
    """Fixed KV blocks; free ones kept in LRU order and still findable by hash until they are reused."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.by_hash: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def used(self) -> int:
        return self.num_blocks - len(self.free)

    def take(self) -> int:
        block, _ = self.free.popitem(last=False)  # least recently freed first
        old = self.hash_of[block]
        if old is not None:
            del self.by_hash[old]
            self.hash_of[block] = None
        self.refs[block] = 1
        return block

    def share(self, block: int) -> None:
        if self.refs[block] == 0:
            del self.free[block]
        self.refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        for block in reversed(blocks):  # a sequence's tail blocks are evicted before its head
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free[block] = None

    def register(self, block: int, block_hash: int) -> None:
        if block_hash not in self.by_hash:
            self.by_hash[block_hash] = block
            self.hash_of[block] = block_hash


class SimCore:
    def __init__(self, sim: SimConfig, *, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_prefix_caching: bool = True) -> None:
        self.sim = sim
        self.max_num_seqs = max_num_seqs
        self.token_budget = max(max_num_batched_tokens, max_num_seqs)
        self.prefix_caching = enable_prefix_caching
        self.blocks = BlockPool(sim.cache_tokens // sim.block_size)
        self.waiting: list[tuple[int, int, SimSequence]] = []  # heap by (priority, arrival)
        self.handing_over: list[SimSequence] = []  # disaggregated: prefilled elsewhere, KV in transit
        self.running: list[SimSequence] = []
        self.by_id: dict[str, SimSequence] = {}
        self.now = 0.0  # virtual time: the sum of the steps' durations
        self._prefill_free_at = 0.0
        self._arrivals = itertools.count()
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.preemptions = 0
        self.recent: OrderedDict[int, None] = OrderedDict()  # checkpoint hashes of finished sequences, newest last

    # -- requests ------------------------------------------------------------------------------------------
    def add(self, request_id: str, prompt: Sequence[int], reply: Sequence[int], finish_reason: str,
            priority: int = 0) -> SimSequence:
        seq = SimSequence(request_id, list(prompt), reply, finish_reason, priority, next(self._arrivals))
        self.by_id[request_id] = seq
        if self.sim.prefill == "disaggregated":
            self._prefill_elsewhere(seq)
        else:
            heapq.heappush(self.waiting, (priority, seq.arrival, seq))
        return seq

    def abort(self, request_id: str) -> None:
        seq = self.by_id.get(request_id)
        if seq is not None:
            seq.aborted = True

    @property
    def idle(self) -> bool:
        return not self.by_id

    def next_event_s(self) -> float | None:
        """Disaggregated hand-overs still in transit with nothing else to run: when the first lands."""
        if self.running or self.waiting or not self.handing_over:
            return None
        return min(s.ready_at for s in self.handing_over)

    # -- one step ------------------------------------------------------------------------------------------
    def step(self) -> StepResult:
        # 1. aborted sequences leave first: a cancel takes effect within one step
        done = [SeqOutput(s, (), "abort") for s in list(self.by_id.values()) if s.aborted]
        for out in done:
            self._finish(out.seq)
        # 2. hand-overs that have landed join the queue, already prefilled
        self._land_handovers()
        # 3. the running batch first (each needs its next chunk or one decode token), then new admissions
        plan: dict[int, int] = {}
        budget = self._schedule_running(plan, self.token_budget)
        self._admit(plan, budget)
        if not plan:
            return StepResult(0.0, tuple(done), 0, 0)
        # 4. price the step, then advance every scheduled sequence by what it computed
        scheduled = [s for s in self.running if id(s) in plan]
        # prefill: every token computed beyond the one a decode computes (the last one, which makes the next)
        prefill = sum(n for s in scheduled if not ((n := plan[id(s)]) == 1 and s.computed == s.tokens - 1))
        duration = self._step_s(scheduled, plan, prefill)
        self.now += duration
        outputs = list(done)
        for seq in scheduled:
            advanced = self._advance(seq, plan[id(seq)])
            if advanced is not None:
                outputs.append(advanced)
        return StepResult(duration, tuple(outputs), len(scheduled), prefill)

    def _schedule_running(self, plan: dict[int, int], budget: int) -> int:
        for seq in sorted(self.running, key=lambda s: (s.priority, s.arrival)):
            if seq not in self.running:  # preempted by a sequence before it in this loop
                continue
            want = min(self._chunk(seq), budget)
            if want <= 0:
                continue
            while not self._allocate(seq, want):
                victim = max(self.running, key=lambda s: (s.priority, s.arrival))
                self._preempt(victim, plan)
                if victim is seq:
                    break
            else:
                plan[id(seq)] = want
                budget -= want
        return budget

    def _admit(self, plan: dict[int, int], budget: int) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            _, _, seq = self.waiting[0]
            if seq.landed:  # the KV came over the network: place it whole; its first decode step makes a token
                if not self._allocate(seq, len(seq.prompt)):
                    break
                seq.computed, seq.landed = len(seq.prompt) - 1, False
                self._register_full_blocks(seq)
            elif seq.computed == 0:
                self._use_cached_prefix(seq)
            full = self._chunk(seq)
            want = min(full, budget)
            if self.sim.prefill_chunk == 0 and want < full:
                if plan:
                    self._unshare(seq)
                    break  # unchunked: a prompt is prefilled whole, in a step of its own if need be
                want = full
            if not self._allocate(seq, want):
                self._unshare(seq)
                break
            heapq.heappop(self.waiting)
            self.running.append(seq)
            plan[id(seq)] = want
            budget -= want

    def _unshare(self, seq: SimSequence) -> None:
        """A sequence that stays waiting gives back what it took (cached blocks are found again next time)."""
        self.blocks.release(seq.blocks)
        seq.blocks, seq.hashes, seq.computed = [], [], 0
        seq.landed = seq.handed_over and not seq.output

    def _chunk(self, seq: SimSequence) -> int:
        """Tokens this sequence computes next step: one decode token, or its next prompt chunk."""
        todo = seq.tokens - seq.computed
        if todo <= 1:
            return 1 if len(seq.output) < len(seq.reply) else 0
        return todo if self.sim.prefill_chunk == 0 else min(todo, self.sim.prefill_chunk)

    def _step_s(self, scheduled: list[SimSequence], plan: dict[int, int], prefill_tokens: int) -> float:
        sim = self.sim
        kv_tokens = sum(s.computed + plan[id(s)] for s in scheduled)
        read = sim.weights_gb * GB + kv_tokens * sim.kv_kb_per_token * KIB
        return read / (sim.hbm_tb_per_s * 1e12) + prefill_tokens * sim.prefill_s_per_1k / 1000

    def _advance(self, seq: SimSequence, computed: int) -> SeqOutput | None:
        seq.computed += computed
        self._register_full_blocks(seq)
        if seq.computed < seq.tokens:
            return None  # a prompt chunk that did not reach the end of the prompt
        token = seq.reply[len(seq.output)]
        seq.output.append(token)
        if len(seq.output) < len(seq.reply):
            return SeqOutput(seq, (token,), None)
        self._finish(seq)
        return SeqOutput(seq, (token,), seq.finish_reason)

    # -- KV cache ------------------------------------------------------------------------------------------
    def _use_cached_prefix(self, seq: SimSequence) -> None:
        """Share the cached blocks that start this sequence; at least one token is always computed."""
        hit = 0
        if self.prefix_caching:
            bs = self.sim.block_size
            parent = 0
            for start in range(0, seq.tokens - 1 - (bs - 1), bs):  # whole blocks before the last token
                block_hash = hash((parent, *(seq.token_at(i) for i in range(start, start + bs))))
                block = self.blocks.by_hash.get(block_hash)
                if block is None:
                    break
                self.blocks.share(block)
                seq.blocks.append(block)
                seq.hashes.append(block_hash)
                parent = block_hash
            hit = len(seq.blocks) * bs
        seq.computed = hit
        if seq.cached_prompt_tokens < 0:
            seq.cached_prompt_tokens = min(hit, len(seq.prompt))
            self.queried_tokens += len(seq.prompt)
            self.hit_tokens += seq.cached_prompt_tokens

    def _allocate(self, seq: SimSequence, new_tokens: int) -> bool:
        need = math.ceil((seq.computed + new_tokens) / self.sim.block_size) - len(seq.blocks)
        if need > len(self.blocks.free):
            return False
        seq.blocks.extend(self.blocks.take() for _ in range(need))
        return True

    def _register_full_blocks(self, seq: SimSequence) -> None:
        if not self.prefix_caching:
            return
        bs = self.sim.block_size
        while len(seq.hashes) < seq.computed // bs:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else 0
            block_hash = hash((parent, *(seq.token_at(j) for j in range(i * bs, (i + 1) * bs))))
            seq.hashes.append(block_hash)
            self.blocks.register(seq.blocks[i], block_hash)

    def _preempt(self, seq: SimSequence, plan: dict[int, int]) -> None:
        self.running.remove(seq)
        plan.pop(id(seq), None)
        self.blocks.release(seq.blocks)
        seq.blocks, seq.hashes, seq.computed = [], [], 0
        seq.preemptions += 1
        self.preemptions += 1
        heapq.heappush(self.waiting, (seq.priority, seq.arrival, seq))

    def _finish(self, seq: SimSequence) -> None:
        self.by_id.pop(seq.request_id, None)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.handing_over:
            self.handing_over.remove(seq)
        else:
            self.waiting = [w for w in self.waiting if w[2] is not seq]
            heapq.heapify(self.waiting)
        self.blocks.release(seq.blocks)
        seq.blocks = []
        self._remember(seq.hashes)

    def _remember(self, hashes: list[int]) -> None:
        marks = hashes[CHECKPOINT_BLOCKS - 1::CHECKPOINT_BLOCKS] + hashes[-1:]
        for h in marks:
            self.recent[h] = None
            self.recent.move_to_end(h)
        while len(self.recent) > RECENT_PREFIXES:
            self.recent.popitem(last=False)

    def held_prefixes(self) -> list[int]:
        """The remembered checkpoints whose block is still cached (an evicted block's hash is forgotten)."""
        return [h for h in self.recent if h in self.blocks.by_hash]

    # -- disaggregated prefill -----------------------------------------------------------------------------
    def _prefill_elsewhere(self, seq: SimSequence) -> None:
        """The prefill replica computes the prompt in turn, then the KV crosses the network."""
        sim = self.sim
        start = max(self.now, self._prefill_free_at)
        self._prefill_free_at = start + len(seq.prompt) * sim.prefill_s_per_1k / 1000
        transfer = len(seq.prompt) * sim.kv_kb_per_token * KIB / (sim.transfer_gb_per_s * GB)
        seq.ready_at = self._prefill_free_at + transfer
        self.handing_over.append(seq)

    def _land_handovers(self) -> None:
        for seq in [s for s in self.handing_over if s.ready_at <= self.now]:
            self.handing_over.remove(seq)
            seq.cached_prompt_tokens = 0  # hits are the prefill replica's business
            self.queried_tokens += len(seq.prompt)
            seq.landed = seq.handed_over = True
            heapq.heappush(self.waiting, (seq.priority, seq.arrival, seq))

    def advance_idle(self, seconds: float) -> None:
        """Time passes with nothing scheduled (the transport slept until the next hand-over)."""
        self.now += seconds

    @property
    def kv_usage(self) -> float:
        return self.blocks.used / self.blocks.num_blocks if self.blocks.num_blocks else 0.0

    @property
    def prefix_hit_rate(self) -> float | None:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else None
