"""The simulated replica against the capacity model: the seeds' step times, prefill cost, cache and preemption."""
from __future__ import annotations

import pytest

from consumers.generation.sim_core import SimCore
from infra.config.pools import SimConfig
from infra.planning.capacity import Inputs, figures

SEEDS = figures(Inputs())


def core(sim: SimConfig | None = None, *, seqs: int = 256, budget: int = 8192, caching: bool = True) -> SimCore:
    return SimCore(sim or SimConfig(), max_num_seqs=seqs, max_num_batched_tokens=budget,
                   enable_prefix_caching=caching)


def prompt(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def run_until_idle(c: SimCore, limit: int = 100_000) -> list:
    steps = []
    while not c.idle and len(steps) < limit:
        steps.append(c.step())
    assert c.idle, "the replica never finished its sequences"
    return steps


def test_one_sequence_decodes_in_the_seeds_18_ms_step() -> None:
    c = core()
    c.add("a", prompt(100), reply=[1] * 50, finish_reason="stop")
    steps = run_until_idle(c)
    decode = steps[-1].duration_s * 1000
    assert decode == pytest.approx(SEEDS.step_alone_ms, rel=0.02)
    assert 17 < decode < 19


def test_183_sequences_of_2500_tokens_step_in_36_ms_and_make_5000_tokens_a_second() -> None:
    c = core()
    n = SEEDS.fit_paged
    assert n == 183
    for i in range(n):  # up to 2,500 tokens held each (the seeds' average): the whole cache, no preemption
        c.add(f"s{i}", prompt(2440, start=i * 10_000), reply=[7] * 60, finish_reason="stop")
    steps = run_until_idle(c)
    full = [s for s in steps if s.decode_seqs == n and s.prefill_tokens == 0]
    assert full, "the batch never ran all 183 sequences at once"
    step_ms = sum(s.duration_s for s in full) / len(full) * 1000
    assert step_ms == pytest.approx(SEEDS.step_batch_ms, rel=0.02)
    tokens_per_s = n / (step_ms / 1000)
    assert tokens_per_s == pytest.approx(SEEDS.tokens_per_replica, rel=0.03)
    assert 4800 < tokens_per_s < 5300
    assert c.preemptions == 0


def test_a_1000_token_prompt_costs_the_seeds_014_s_in_256_token_chunks() -> None:
    c = core()
    c.add("a", prompt(1000), reply=[1, 2], finish_reason="stop")
    steps = run_until_idle(c)
    chunks = [s.prefill_tokens for s in steps if s.prefill_tokens]
    assert chunks == [256, 256, 256, 232]
    prefill_s = sum(s.duration_s for s in steps[:4]) - sum(
        (SimConfig().weights_gb * 1e9 + kv * 320 * 1024) / 8e12 for kv in (256, 512, 768, 1000))
    assert prefill_s == pytest.approx(SEEDS.prefill_s, rel=0.01)
    assert prefill_s == pytest.approx(0.14, rel=0.01)


def test_unchunked_prefill_stalls_running_streams_for_the_whole_prompt_and_chunking_cuts_it_to_a_chunk() -> None:
    def longest_step_while_prefilling(chunk: int) -> float:
        c = core(SimConfig(prefill_chunk=chunk))
        c.add("running", prompt(50), reply=[1] * 40, finish_reason="stop")
        for _ in range(5):
            c.step()
        c.add("long", prompt(1000, start=10_000), reply=[2] * 3, finish_reason="stop")
        return max(s.duration_s for s in run_until_idle(c))

    unchunked, chunked = longest_step_while_prefilling(0), longest_step_while_prefilling(256)
    assert unchunked * 1000 == pytest.approx(17.5 + 140, abs=2)  # the seeds' 140 ms stutter
    assert chunked * 1000 == pytest.approx(17.5 + 256 * 0.14, abs=2)


def test_disaggregated_prefill_keeps_decode_steps_clean_and_hands_over_in_about_7_ms() -> None:
    c = core(SimConfig(prefill="disaggregated"))
    seq = c.add("a", prompt(1000), reply=[1, 2, 3], finish_reason="stop")
    assert seq.ready_at == pytest.approx(0.14 + 1000 * 320 * 1024 / 50e9, rel=1e-6)
    assert (seq.ready_at - 0.14) * 1000 == pytest.approx(SEEDS.transfer_ms * 1000 / 1000, rel=0.05)
    first = c.step()
    assert first.duration_s == 0 and c.next_event_s() == pytest.approx(seq.ready_at)
    c.advance_idle(seq.ready_at)
    steps = run_until_idle(c)
    assert all(s.prefill_tokens == 0 for s in steps)
    assert max(s.duration_s for s in steps) < 0.019


def test_disaggregated_sequences_of_any_length_decode_whole_beside_each_other() -> None:
    c = core(SimConfig(prefill="disaggregated"))
    for n in (15, 16, 17, 31, 32, 47, 100):  # prompts ending on, before and after a block boundary
        c.add(f"p{n}", prompt(n, start=n * 1000), reply=list(range(40)), finish_reason="stop")
    produced: dict[str, int] = {}
    while not c.idle:
        if (landing := c.next_event_s()) is not None:
            c.advance_idle(landing - c.now)
        for out in c.step().outputs:
            produced[out.seq.request_id] = produced.get(out.seq.request_id, 0) + len(out.token_ids)
    assert produced == {f"p{n}": 40 for n in (15, 16, 17, 31, 32, 47, 100)} and c.blocks.used == 0


def test_a_second_turn_reuses_the_first_turns_blocks() -> None:
    c = core()
    first = prompt(300)
    c.add("t1", first, reply=list(range(5000, 5100)), finish_reason="stop")
    run_until_idle(c)
    second = first + list(range(5000, 5100)) + prompt(40, start=9000)
    seq = c.add("t2", second, reply=[1], finish_reason="stop")
    run_until_idle(c)
    assert seq.cached_prompt_tokens == (300 + 100 - 1) // 16 * 16  # every whole block of turn one
    assert c.prefix_hit_rate == pytest.approx(seq.cached_prompt_tokens / (300 + 440))


def test_a_shared_system_prompt_is_cached_across_conversations_but_not_without_caching() -> None:
    system = prompt(512, start=100_000)
    for caching, expected in ((True, 512), (False, 0)):
        c = core(caching=caching)
        c.add("a", system + prompt(30), reply=[1], finish_reason="stop")
        run_until_idle(c)
        other = c.add("b", system + prompt(30, start=777), reply=[1], finish_reason="stop")
        run_until_idle(c)
        assert other.cached_prompt_tokens == expected


def test_a_full_cache_preempts_and_every_sequence_still_finishes_whole() -> None:
    # 64 blocks of 16 tokens: 8 sequences of 100-token prompts + 60-token replies need 88 blocks
    c = core(SimConfig(free_gb=64 * 16 * 320 * 1024 / 1e9))
    assert c.blocks.num_blocks == 64
    for i in range(8):
        c.add(f"s{i}", prompt(100, start=i * 1000), reply=list(range(i * 100, i * 100 + 60)), finish_reason="stop")
    produced: dict[str, list[int]] = {}
    for step in run_until_idle(c):
        for out in step.outputs:
            produced.setdefault(out.seq.request_id, []).extend(out.token_ids)
    assert c.preemptions > 0
    assert produced == {f"s{i}": list(range(i * 100, i * 100 + 60)) for i in range(8)}
    assert c.blocks.used == 0


def test_at_most_max_num_seqs_run_and_lower_priority_values_go_first() -> None:
    c = core(seqs=2)
    c.add("free1", prompt(20), reply=[1] * 5, finish_reason="stop", priority=1)
    c.add("free2", prompt(20, start=100), reply=[1] * 5, finish_reason="stop", priority=1)
    c.add("paid", prompt(20, start=200), reply=[1] * 5, finish_reason="stop", priority=0)
    c.step()
    assert sorted(s.request_id for s in c.running) == ["free1", "paid"]
    assert max(len(c.running) for _ in range(3) if c.step()) <= 2


def test_an_abort_ends_the_sequence_at_the_next_step_and_frees_its_blocks() -> None:
    c = core()
    c.add("a", prompt(40), reply=[1] * 100, finish_reason="stop")
    c.step()
    c.step()
    c.abort("a")
    step = c.step()
    assert [(o.seq.request_id, o.finish_reason, o.token_ids) for o in step.outputs] == [("a", "abort", ())]
    assert c.idle and c.blocks.used == 0


def test_the_reply_ends_with_its_reason_on_its_last_token() -> None:
    c = core()
    c.add("a", prompt(10), reply=[4, 5, 6], finish_reason="length")
    outs = [o for s in run_until_idle(c) for o in s.outputs]
    assert [(o.token_ids, o.finish_reason) for o in outs] == [((4,), None), ((5,), None), ((6,), "length")]
