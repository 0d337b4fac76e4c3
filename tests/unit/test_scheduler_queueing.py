from consumers.scheduler.estimate import Completion
from consumers.scheduler.queueing import PoolLoad, Queues, Refuse, Route


def _queues(large_cap: int = 2, small_cap: int = 2, prior_s: float = 20.0) -> Queues:
    return Queues({"large": PoolLoad.of(large_cap, prior_s=prior_s), "small": PoolLoad.of(small_cap, prior_s=prior_s)})


def _ended(q: Queues, generation_id: str, at: float, held_s: float, first_token_s: float = 0.0) -> None:
    q.finished(generation_id, Completion(at, held_s, first_token_s), "large")


def test_free_slot_means_no_wait() -> None:
    q = _queues()
    assert q.route("large", "free", 10, "default", now=0) == Route("large", "free", 0, 0.0, "default")


def test_paid_waits_only_behind_paid() -> None:
    q = _queues(large_cap=1)
    for i in range(3):
        q.enqueued(f"f{i}", "large", "free", now=0)
    q.enqueued("p0", "large", "paid", now=0)
    load = q.pools["large"]
    assert list(load.running) == ["f0"]  # the worker took the first one; the rest wait, paid first
    assert list(load.positions(1)) == [("p0", "paid", 1), ("f1", "free", 2), ("f2", "free", 3)]
    assert load.position_of_new("paid", 1) == 2 and load.position_of_new("free", 1) == 4
    paid = q.route("large", "paid", 300, "default", now=0)
    free = q.route("large", "free", 300, "default", now=0)
    assert isinstance(paid, Route) and isinstance(free, Route) and paid.position < free.position


def test_wait_is_position_over_the_slots_rate_plus_the_first_token() -> None:
    q = _queues(large_cap=2)
    for i in range(5):  # five replies that each held a slot 10 s, their first token 1 s after being taken
        q.enqueued(f"d{i}", "large", "free", now=i)
        _ended(q, f"d{i}", at=10 + i, held_s=10, first_token_s=1)
    for i in range(5):
        q.enqueued(f"w{i}", "large", "free", now=20)
    position, wait = q.pools["large"].estimate_wait("free", now=20)
    assert position == 4  # two running, three waiting ahead
    assert abs(wait - (4 / (2 / 10) + 1)) < 1e-9


def test_a_free_request_moves_at_what_the_paid_lane_leaves_but_no_slower_than_two_thirds() -> None:
    q = _queues(large_cap=1)
    for i in range(6):  # 0.1 paid requests a second over the last minute, each 2 s: 0.5 replies a second
        q.enqueued(f"p{i}", "large", "paid", now=i * 10)
        _ended(q, f"p{i}", at=i * 10 + 2, held_s=2)
    q.enqueued("busy", "large", "free", now=58)
    _, wait = q.pools["large"].estimate_wait("free", now=59)
    assert abs(wait - (2 - 1) * 0.5 / (0.5 - 0.1)) < 1e-9  # the running reply has 1 s left; paid slows the rest
    for i in range(6, 15):  # 0.25 a second: the free lane would move at half the rate; it is taken at 2/3
        q.enqueued(f"p{i}", "large", "paid", now=59)
        q.finished(f"p{i}")
    _, wait = q.pools["large"].estimate_wait("free", now=59)
    assert abs(wait - (2 - 1) * 1.5) < 1e-9


def test_before_three_replies_end_a_reply_lasts_at_least_as_long_as_the_oldest_running() -> None:
    q = _queues(large_cap=1, prior_s=5.0)
    q.enqueued("old", "large", "free", now=0)
    q.enqueued("next", "large", "free", now=0)
    assert q.pools["large"].estimate_wait("free", now=1)[1] == (5.0 - 1) + 5.0  # old's 4 s left, then next's 5
    # Not done after 40 s: the prior was wrong; old is given a tenth more, then next runs as long.
    assert q.pools["large"].estimate_wait("free", now=40)[1] == 4.0 + 40.0


def test_until_as_many_replies_end_as_run_a_reply_lasts_at_least_twice_the_running_ones_mean_age() -> None:
    q = _queues(large_cap=4)
    for i in range(3):  # three short replies ended (5 s): the long ones that started with them still run
        q.enqueued(f"short{i}", "large", "free", now=0)
        _ended(q, f"short{i}", at=5, held_s=5)
    for i in range(4):
        q.enqueued(f"long{i}", "large", "free", now=0)
    assert q.pools["large"].pace(now=12).service_s == 24.0  # 2 x 12 s, not the 5 s of the three that ended


def test_more_replies_than_one_replica_can_end_mean_more_replicas() -> None:
    q = _queues(large_cap=4)
    for i in range(48):  # 48 replies in the last minute, 10 s each: 8 held at once, two replicas of 4 slots
        q.enqueued(f"d{i}", "large", "free", now=i * 1.25)
        _ended(q, f"d{i}", at=10 + i * 1.25, held_s=10)
    pace = q.pools["large"].pace(now=70)
    assert (pace.replicas, pace.seqs) == (2, 8) and abs(pace.rate - 0.8) < 1e-9


def test_overflow_to_small_then_refusal() -> None:
    q = _queues(large_cap=1, small_cap=1, prior_s=10.0)  # 0.1 replies a second
    q.enqueued("a", "large", "free", now=0)
    q.enqueued("b", "large", "free", now=0)  # large is busy with a queue: a newcomer waits 20 s at 0.1/s
    routed = q.route("large", "free", 10, "default", now=0)
    assert isinstance(routed, Route) and routed.pool == "small" and routed.reason == "overflow"
    q.enqueued("c", "small", "free", now=0)
    q.enqueued("d", "small", "free", now=0)
    refused = q.route("large", "free", 10, "default", now=0)
    assert isinstance(refused, Refuse) and refused.wait_s > 10 and "limit of 10 s" in refused.message


def test_a_pool_with_no_replica_is_past_every_limit() -> None:
    q = _queues()  # both pools idle: large would start a request at once
    routed = q.route("large", "free", 10, "default", now=0, down=["large"])
    assert isinstance(routed, Route) and routed.pool == "small" and routed.reason == "overflow"
    refused = q.route("large", "free", 10, "default", now=0, can_overflow=False, down=["large"])
    assert isinstance(refused, Refuse) and refused.down and "No replica of large" in refused.message
    assert refused.wait_s > 10  # told to come back later, never "busy for 0 s"
    # small has no replica either: nothing overflows onto it, whatever its estimate says
    both = q.route("large", "free", 10, "default", now=0, down=["large", "small"])
    assert isinstance(both, Refuse) and both.down
    # only the overflow pool is down: large takes its own requests as before, and refuses past its limit
    assert q.route("large", "free", 10, "default", now=0, down=["small"]) == Route("large", "free", 0, 0.0, "default")
    q.enqueued("a", "large", "free", now=0)
    q.enqueued("b", "large", "free", now=0)
    q.enqueued("c", "large", "free", now=0)
    busy = q.route("large", "free", 10, "default", now=0, down=["small"])
    assert isinstance(busy, Refuse) and not busy.down and "busy" in busy.message


def test_unknown_finish_is_ignored_and_known_one_frees_the_slot() -> None:
    q = _queues(large_cap=1)
    q.enqueued("x", "large", "paid", now=0)
    q.finished("nope")
    assert list(q.pools["large"].running) == ["x"]
    q.finished("x")
    assert q.pools["large"].running == {}


def test_a_redelivered_request_keeps_its_one_place() -> None:
    q = _queues(large_cap=1)
    for generation_id in ("a", "b", "b"):
        q.enqueued(generation_id, "large", "free", now=0)
    assert list(q.pools["large"].positions(1)) == [("b", "free", 1)]


def test_a_reply_queued_elsewhere_teaches_its_times_but_not_the_rate() -> None:
    q = _queues(large_cap=1)
    for i in range(3):
        q.finished(f"other{i}", Completion(at=10, held_s=4, first_token_s=1), "large")
    q.finished("refused", Completion(at=10, held_s=0, first_token_s=0), "large")  # never taken: nothing to learn
    history = q.pools["large"].history
    assert [c.ours for c in history.completions] == [False] * 3
    assert history.prefill_s() == 1 and history.service_s(history.prefill_s(), []) == 4


def test_requests_waiting_inside_the_engine_count_and_paid_goes_before_free_ones_there() -> None:
    q = Queues({"large": PoolLoad.of(2, held=3)})  # the engine runs 2; the worker holds a third, waiting in it
    for generation_id in ("f0", "f1", "f2"):
        q.enqueued(generation_id, "large", "free", now=0)
    load = q.pools["large"]
    assert len(load.running) == 3 and load.position_of_new("free", 2) == 2  # f2 waits in the engine, then it
    assert load.position_of_new("paid", 2) == 1  # the engine starts a paid request before f2
    q.enqueued("p0", "large", "paid", now=0)
    q.enqueued("f3", "large", "free", now=0)
    assert list(load.positions(2)) == [("p0", "paid", 1), ("f3", "free", 3)]


def test_arrivals_are_kept_for_one_window_only() -> None:
    q = _queues(large_cap=1000)
    for i in range(600):
        q.enqueued(f"f{i}", "large", "free", now=float(i))
    assert len(q.pools["large"].arrivals["free"]) <= 61  # the last minute's, not every request since the start


def test_a_request_never_heard_to_end_is_forgotten_after_a_while() -> None:
    q = _queues(large_cap=1)
    q.enqueued("lost", "large", "free", now=0)  # its finish never arrives
    q.enqueued("behind", "large", "free", now=0)
    q.enqueued("fresh", "large", "free", now=1000)
    assert q.revised(now=1000) == []
    load = q.pools["large"]
    assert list(load.running) == ["fresh"] and list(load.positions(1)) == []
