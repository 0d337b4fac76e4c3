from consumers.generation.offsets import OffsetTracker


def test_finished_request_behind_unfinished_one_is_not_committed_past_it() -> None:
    t = OffsetTracker()
    for offset in (10, 11, 12):
        t.started("p0", offset)
    t.finished("p0", 11)
    t.finished("p0", 12)
    assert t.committable() == {"p0": 10}  # 10 still running: commit stays at 10
    t.mark_committed({"p0": 10})
    assert t.committable() == {}
    t.finished("p0", 10)
    assert t.committable() == {"p0": 13}


def test_partitions_are_independent() -> None:
    t = OffsetTracker()
    t.started("a", 0)
    t.started("b", 5)
    t.finished("b", 5)
    assert t.committable() == {"a": 0, "b": 6}
    assert t.in_flight() == 1 and t.in_flight("a") == 1 and t.in_flight("b") == 0


def test_revoked_partitions_are_forgotten() -> None:
    t = OffsetTracker()
    t.started("a", 3)
    t.forget({"a"})
    assert t.committable() == {} and t.in_flight() == 0
