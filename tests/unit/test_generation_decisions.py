from consumers.generation.decisions import Finish, Generate, Limits, decide, status_for
from consumers.generation.recovery import Saved
from schemas import GenerationFinished, GenerationRequested, TokensAppended, Usage
from schemas.scheduler import LANE_PRIORITY

LIMITS = Limits(pool="large", model="SmolLM2-135M-Instruct", max_model_len=100)


def _req(**kw: object) -> GenerationRequested:
    base = dict(generation_id="g", conversation_id="c", user_id="u", plan="paid", pool="large", lane="paid",
                prompt_token_ids=[1, 2, 3], max_tokens=20)
    base.update(kw)
    return GenerationRequested(**base)  # type: ignore[arg-type]


def _saved(*chunks: list[int]) -> Saved:
    s = Saved()
    for i, ids in enumerate(chunks):
        s.chunks[i] = TokensAppended(generation_id="g", conversation_id="c", user_id="u", seq=i,
                                     text=f"t{i}", token_ids=ids)
    return s


def test_fresh_request_generates_at_the_priority_its_producer_gave() -> None:
    assert decide(_req(), LIMITS, False, Saved()) == Generate([1, 2, 3], 20, 0, False, 0)
    free = decide(_req(lane="free", priority=LANE_PRIORITY["free"]), LIMITS, False, Saved())
    assert free.priority == LANE_PRIORITY["free"] > LANE_PRIORITY["paid"]  # type: ignore[union-attr]


def test_recovery_appends_saved_tokens_and_continues_the_sequence() -> None:
    decision = decide(_req(), LIMITS, False, _saved([7, 8], [9]))
    assert decision == Generate([1, 2, 3, 7, 8, 9], 17, 2, True, 0)


def test_already_finished_generation_is_not_generated_again() -> None:
    s = _saved([7])
    s.finished = GenerationFinished(generation_id="g", conversation_id="c", user_id="u", plan="paid",
                                    message_id="m", status="complete", text="t0", usage=Usage(), model="m",
                                    pool="large", worker_id="w0")
    assert decide(_req(), LIMITS, False, s) == Finish("complete", "already finished")


def test_bad_requests_fail_with_a_reason() -> None:
    too_long = decide(_req(prompt_token_ids=list(range(100))), LIMITS, False, Saved())
    assert isinstance(too_long, Finish) and too_long.status == "failed" and "context of 100" in too_long.reason
    wrong_pool = decide(_req(pool="tiny"), LIMITS, False, Saved())
    assert isinstance(wrong_pool, Finish) and "pool 'tiny'" in wrong_pool.reason
    assert decide(_req(prompt_token_ids=[]), LIMITS, False, Saved()) == Finish("failed", "empty prompt")


def test_cancel_before_start_stops_without_generating() -> None:
    assert decide(_req(), LIMITS, True, Saved()).status == "stopped"  # type: ignore[union-attr]


def test_max_tokens_clamped_to_context() -> None:
    decision = decide(_req(prompt_token_ids=list(range(90)), max_tokens=50), LIMITS, False, Saved())
    assert isinstance(decision, Generate) and decision.max_tokens == 10


def test_status_mapping() -> None:
    assert status_for("stop", False) == "complete"
    assert status_for("length", False) == "length"
    assert status_for("abort", False) == "stopped"
    assert status_for("stop", True) == "stopped"
    assert status_for(None, False) == "failed"


def test_a_request_older_than_the_token_buffer_is_stale() -> None:
    from consumers.generation.decisions import STALE_REQUEST_S, is_stale

    req = _req()
    assert not is_stale(req, req.at + 5)
    assert is_stale(req, req.at + STALE_REQUEST_S + 1)
