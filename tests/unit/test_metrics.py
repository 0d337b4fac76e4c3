"""What the metrics count, without a server: the gateway's view of one reply, the worker's busy time and
cost, the consumer lag arithmetic, and the JSON log line."""
from __future__ import annotations

import io
import json
import logging

import pytest
from aiokafka import TopicPartition
from prometheus_client import REGISTRY

from consumers.generation.metrics import WorkerMetrics
from infra.config import logs
from producers.gateway.metrics import ReplyWatch
from schemas import GenerationFinished, GenerationQueued, RequestRefused, TokensAppended, Usage
from topics.metrics import catalogue_groups, lag_by_topic
from topics.runner import current_stage


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _tokens(text: str) -> TokensAppended:
    return TokensAppended(generation_id="g", conversation_id="c", user_id="u", seq=0, text=text, token_ids=[1])


def _finished(out: int) -> GenerationFinished:
    return GenerationFinished(generation_id="g", conversation_id="c", user_id="u", plan="paid", message_id="m",
                              status="complete", text="x", usage=Usage(prompt_tokens=5, completion_tokens=out),
                              model="m", pool="small", worker_id="w")


def test_a_reply_is_timed_from_acceptance_to_its_first_visible_delta_under_the_pool_that_answered() -> None:
    before = _sample("parley_gateway_ttft_seconds_count", plan="paid", pool="small")
    tokens_before = _sample("parley_gateway_completion_tokens_total", plan="paid", pool="small")
    replies_before = _sample("parley_gateway_replies_total", plan="paid", pool="small", stop_reason="end")
    watch = ReplyWatch("paid", "large", accepted_at=0.0)
    watch.seen(GenerationQueued(generation_id="g", conversation_id="c", user_id="u", pool="small", model="m",
                                lane="paid", position=0, estimated_wait_s=0.0, message_id="m"))
    watch.seen(_tokens(""))  # an end-of-sequence token: nothing shown yet
    assert watch.first_delta_at is None
    watch.seen(_tokens("Paris"))
    watch.seen(_tokens(" is"))
    watch.seen(_finished(12))
    watch.seen(_finished(12))  # a replayed end is not counted twice
    assert _sample("parley_gateway_ttft_seconds_count", plan="paid", pool="small") == before + 1
    assert _sample("parley_gateway_completion_tokens_total", plan="paid", pool="small") == tokens_before + 12
    assert _sample("parley_gateway_replies_total", plan="paid", pool="small", stop_reason="end") == replies_before + 1


def test_a_refusal_is_counted_by_status_and_never_as_a_reply() -> None:
    before = _sample("parley_gateway_refusals_total", plan="free", status="429")
    watch = ReplyWatch("free", "large")
    watch.seen(RequestRefused(generation_id="g", conversation_id="c", user_id="u", reason="quota",
                              message="no", status=429))
    assert _sample("parley_gateway_refusals_total", plan="free", status="429") == before + 1
    assert watch.first_delta_at is None and watch.done


def test_busy_time_runs_only_while_sequences_are_in_hand_and_is_priced_per_gpu_hour() -> None:
    m = WorkerMetrics("large", gpu_hour_usd=3.6, gpus=2)
    m.active(1, now=10.0)
    m.active(2, now=11.0)
    m.flush_busy(now=12.0)  # a scrape in the middle of a busy spell sees it so far
    m.active(0, now=14.0)
    m.active(0, now=20.0)  # idle time is free
    busy = m.registry.get_sample_value("parley_worker_busy_seconds_total", {"pool": "large"})
    cost = m.registry.get_sample_value("parley_worker_cost_usd_total", {"pool": "large"})
    assert busy == 4.0
    assert abs(cost - 4.0 * 3.6 * 2 / 3600) < 1e-12


def test_queue_time_and_prefix_cache_counters() -> None:
    m = WorkerMetrics("small")
    m.picked("free", enqueued_at=100.0, now=102.5)
    m.picked("free", enqueued_at=0.0, now=102.5)  # an unstamped request is not a 102-second wait
    m.prompt_seen(100, 60)
    m.prompt_seen(100, 0)
    r = m.registry
    assert r.get_sample_value("parley_worker_queue_seconds_count", {"pool": "small", "lane": "free"}) == 1
    assert r.get_sample_value("parley_worker_queue_seconds_sum", {"pool": "small", "lane": "free"}) == 2.5
    assert r.get_sample_value("parley_worker_prefix_cache_hit_ratio", {"pool": "small"}) == 0.3
    assert r.get_sample_value("parley_worker_cached_prompt_tokens_total", {"pool": "small"}) == 60


def test_lag_is_end_minus_committed_and_counts_an_uncommitted_partition_from_its_start() -> None:
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    lag = lag_by_topic({a0: 7, b0: 3}, {a0: 10, a1: 5, b0: 3}, start={a1: 2})
    assert lag == {"a": 3 + 3, "b": 0}


def test_every_stage_group_and_one_per_pool_under_a_prefix() -> None:
    groups = catalogue_groups("t.", ["large", "small"])
    assert {"t.admission", "t.prompt", "t.scheduler", "t.settlement", "t.persistence"} <= set(groups)
    assert {"t.generation.large", "t.generation.small"} <= set(groups)
    assert "t.gateway" not in groups  # the gateway reads without a group: it has no lag


def test_json_log_line_carries_process_stage_ids_and_counts_but_not_other_extras() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter("worker-large"))
    log = logging.getLogger("test.json")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    token = current_stage.set("worker")
    try:
        log.info("generation %s complete", "g1", extra={"generation_id": "g1", "completion_tokens": 12,
                                                         "content": "never logged"})
    finally:
        current_stage.reset(token)
        log.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert {k: line[k] for k in ("level", "process", "stage", "msg", "generation_id", "completion_tokens")} == {
        "level": "INFO", "process": "worker-large", "stage": "worker", "msg": "generation g1 complete",
        "generation_id": "g1", "completion_tokens": 12}
    assert "content" not in line and line["time"].endswith("Z")


def test_log_format_auto_is_text_on_a_terminal_and_json_in_a_file() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert logs.use_json("auto", io.StringIO()) and not logs.use_json("auto", Tty())
    assert logs.use_json("json", Tty()) and not logs.use_json("text", io.StringIO())


def test_a_queued_reply_records_its_real_wait_less_the_wait_it_was_shown() -> None:
    before = _sample("parley_gateway_queued_wait_error_seconds_count", plan="free", pool="large")
    under = _sample("parley_gateway_queued_wait_error_seconds_bucket", plan="free", pool="large", le="-4.0")
    watch = ReplyWatch("free", "large")
    watch.seen(GenerationQueued(generation_id="g", conversation_id="c", user_id="u", pool="large", model="m",
                                lane="free", position=3, estimated_wait_s=30.0, message_id="m"))
    watch.seen(GenerationQueued(generation_id="g", conversation_id="c", user_id="u", pool="large", model="m",
                                lane="free", position=1, estimated_wait_s=5.0, message_id="m", revision=1))
    watch.seen(_tokens("Hi"))  # at once: 30 s shorter than first shown
    assert _sample("parley_gateway_queued_wait_error_seconds_count", plan="free", pool="large") == before + 1
    assert _sample("parley_gateway_queued_wait_error_seconds_bucket", plan="free", pool="large", le="-4.0") == under + 1


async def test_lag_asks_each_coordinator_once_and_every_groups_ends_in_one_request() -> None:
    from types import SimpleNamespace

    from topics.metrics import measure_lag

    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)

    class Admin:
        lookups: list[str] = []
        fail: set[str] = set()

        async def find_coordinator(self, group: str) -> int:
            self.lookups.append(group)
            return 1

        async def list_consumer_group_offsets(self, group: str, coordinator: int):  # type: ignore[no-untyped-def]
            assert coordinator == 1
            if group in self.fail:
                raise RuntimeError("not coordinator")
            return {"g1": {a0: SimpleNamespace(offset=7)}, "g2": {b0: SimpleNamespace(offset=1)}}.get(group, {})

    class Reader:
        asked: list[list[TopicPartition]] = []

        def partitions_for_topic(self, topic: str) -> set[int]:
            return {0, 1} if topic == "a" else {0}

        async def end_offsets(self, parts):  # type: ignore[no-untyped-def]
            self.asked.append(parts)
            return {a0: 10, a1: 5, b0: 4}

        async def beginning_offsets(self, parts):  # type: ignore[no-untyped-def]
            return {a0: 0, a1: 2, b0: 0}

    admin, reader, known = Admin(), Reader(), {}  # type: ignore[var-annotated]
    groups = ["g1", "g2", "never-ran"]
    assert await measure_lag(admin, reader, groups, known) == {("g1", "a"): 3 + 3, ("g2", "b"): 3}
    assert await measure_lag(admin, reader, groups, known) == {("g1", "a"): 6, ("g2", "b"): 3}
    assert admin.lookups == groups  # looked up on the first poll only
    assert [sorted(p) for p in reader.asked] == [[a0, a1, b0]] * 2  # one request a poll, not one a group
    admin.fail = {"g2"}
    with pytest.raises(RuntimeError):
        await measure_lag(admin, reader, groups, known)
    assert "g2" not in known and "g1" in known  # a failed group is looked up again next time
