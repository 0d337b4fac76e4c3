from consumers.scheduler.queueing import PoolLoad, Queues, Refuse, Route


def _queues(large_cap: int = 2, small_cap: int = 2) -> Queues:
    return Queues({"large": PoolLoad(large_cap), "small": PoolLoad(small_cap)})


def test_free_slot_means_no_wait() -> None:
    q = _queues()
    assert q.route("large", "free", 10, "default", now=0) == Route("large", "free", 0, 0.0, "default")


def test_paid_waits_only_behind_paid() -> None:
    q = _queues(large_cap=1)
    for i in range(3):
        q.enqueued(f"f{i}", "large", "free")
    q.enqueued("p0", "large", "paid")
    load = q.pools["large"]
    assert load.ahead_of_new("paid") == 0  # the paid one runs in the single slot; free ones wait behind it
    assert load.ahead_of_new("free") == 3
    paid = q.route("large", "paid", 30, "default", now=0)
    free = q.route("large", "free", 30, "default", now=0)
    assert isinstance(paid, Route) and isinstance(free, Route) and paid.position < free.position


def test_wait_is_queue_length_over_measured_rate() -> None:
    q = _queues(large_cap=1)
    for i in range(10):  # ten completions over 9 s: about 1.1 per second
        q.enqueued(f"d{i}", "large", "free")
        q.finished(f"d{i}", now=100 + i)
    for i in range(6):
        q.enqueued(f"w{i}", "large", "free")
    position, wait = q.pools["large"].estimate_wait("free", now=109)
    assert position == 6
    assert abs(wait - 6 / (10 / 9)) < 1e-6


def test_overflow_to_small_then_refusal() -> None:
    q = _queues(large_cap=1, small_cap=1)
    q.pools["large"].prior_rate = q.pools["small"].prior_rate = 0.1
    q.enqueued("a", "large", "free")
    q.enqueued("b", "large", "free")  # large is busy with a queue: a newcomer waits 20 s at 0.1/s
    routed = q.route("large", "free", 10, "default", now=0)
    assert isinstance(routed, Route) and routed.pool == "small" and routed.reason == "overflow"
    q.enqueued("c", "small", "free")
    q.enqueued("d", "small", "free")
    refused = q.route("large", "free", 10, "default", now=0)
    assert isinstance(refused, Refuse) and refused.wait_s > 10 and "limit of 10 s" in refused.message


def test_unknown_finish_is_ignored_and_known_one_frees_the_slot() -> None:
    q = _queues(large_cap=1)
    q.enqueued("x", "large", "paid")
    q.finished("nope")
    assert q.pools["large"].busy()
    q.finished("x")
    assert not q.pools["large"].busy()
