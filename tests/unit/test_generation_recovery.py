from consumers.generation.recovery import collect
from schemas import GenerationFinished, GenerationStarted, TokensAppended, Usage
from topics.partitioning import partition_for


def _tok(gen: str, seq: int, text: str) -> TokensAppended:
    return TokensAppended(generation_id=gen, conversation_id="c", user_id="u", seq=seq, text=text,
                          token_ids=[seq * 10, seq * 10 + 1])


def test_collect_orders_by_seq_ignores_duplicates_and_others() -> None:
    events = [
        GenerationStarted(generation_id="g", conversation_id="c", user_id="u", message_id="m", model="x",
                          pool="large", worker_id="w1", first_token_at=1.0, prompt_tokens=5),
        _tok("g", 1, "lo"), _tok("other", 0, "zz"), _tok("g", 0, "hel"), _tok("g", 1, "DUP"),
    ]
    saved = collect(events, "g")
    assert saved.text == "hello" and saved.next_seq == 2 and saved.contiguous
    assert saved.token_ids == [0, 1, 10, 11]
    assert saved.started is not None and saved.finished is None


def test_collect_sees_a_finished_generation() -> None:
    done = GenerationFinished(generation_id="g", conversation_id="c", user_id="u", plan="free", message_id="m",
                              status="complete", text="x", usage=Usage(), model="x", pool="large", worker_id="w")
    assert collect([_tok("g", 0, "x"), done], "g").finished == done


def test_gap_is_detected() -> None:
    assert not collect([_tok("g", 0, "a"), _tok("g", 2, "c")], "g").contiguous


def test_partition_for_agrees_with_the_producers_partitioner() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    parts = list(range(6))
    keys = [f"gen-{i}" for i in range(200)]
    assert [partition_for(k, 6) for k in keys] == [DefaultPartitioner()(k.encode(), parts, parts) for k in keys]
    assert len({partition_for(k, 6) for k in keys}) == 6  # spreads over every partition
