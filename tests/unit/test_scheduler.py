from consumers.generation.announce import ReplicaAnnounced
from consumers.scheduler.canned import CANNED_POOL, CannedReplies
from consumers.scheduler.queueing import PoolLoad, Queues, Shown
from consumers.scheduler.replicas import Replicas
from consumers.scheduler.stage import Scheduler
from infra.config.plans import load_plans
from schemas import (
    GenerationFinished,
    GenerationQueued,
    GenerationRequested,
    PoolPrompt,
    PromptBuilt,
    RequestRefused,
    Usage,
)
from topics import Topics


def _prompt(question: str = "hello", pool: str = "large", plan: str = "free",
            alternates: list[PoolPrompt] | None = None) -> PromptBuilt:
    return PromptBuilt(generation_id="g", conversation_id="c", user_id="u", plan=plan, pool=pool,  # type: ignore[arg-type]
                       user_message_id="um", assistant_message_id="g", turn=0, prompt_token_ids=[1, 2],
                       max_tokens=10, reserved_tokens=12, question=question, alternates=alternates or [])


class FakeReplies:
    def __init__(self) -> None:
        self.put_: list[GenerationFinished] = []

    async def put(self, event: GenerationFinished) -> None:
        self.put_.append(event)


class FakeQuota:
    def __init__(self) -> None:
        self.released: list[tuple[str, str]] = []

    async def release(self, generation_id: str, reason: str) -> int:
        self.released.append((generation_id, reason))
        return 12


def _scheduler(busy: bool, busy_pools: tuple[str, ...] = ("large", "small"),
               quota: FakeQuota | None = None) -> Scheduler:
    queues = Queues({"large": PoolLoad.of(1, prior_s=100), "small": PoolLoad.of(1, prior_s=100)})
    if busy:
        for pool in busy_pools:
            for i in range(3):
                queues.enqueued(f"{pool}{i}", pool, "free")
    return Scheduler(Topics("t."), queues, load_plans(), {"large": "L", "small": "S"},
                     CannedReplies({"hello": "prepared hi"}), quota, FakeReplies())


async def test_free_slot_routes_to_the_requested_pool_by_conversation() -> None:
    outs = await _scheduler(busy=False).handle(_prompt())
    queued, request = outs[0].event, outs[1].event
    assert isinstance(queued, GenerationQueued) and queued.model == "L" and queued.position == 0
    assert isinstance(request, GenerationRequested) and outs[1].topic == "t.generate.large.free"
    assert outs[1].partition is not None and request.parent_id == "um"


async def test_every_pool_past_its_limit_gets_a_prepared_reply_or_a_refusal() -> None:
    outs = await _scheduler(busy=True).handle(_prompt("Hello!"))
    finished = [o.event for o in outs if isinstance(o.event, GenerationFinished)]
    assert len(finished) == 2 and finished[0].pool == CANNED_POOL and finished[0].text == "prepared hi"
    assert {o.topic for o in outs} == {"t.chat.tokens", "t.chat.replies"}
    refused = await _scheduler(busy=True).handle(_prompt("tell me a story"))
    assert [type(o.event) for o in refused] == [RequestRefused, GenerationFinished]
    assert refused[0].event.status == 503 and refused[0].event.retry_after_s and refused[0].event.retry_after_s >= 1
    ended = refused[1].event  # closes the generating placeholder; charged nothing
    assert refused[1].topic == "t.chat.replies" and ended.status == "failed" and ended.usage == Usage()


async def test_a_pool_whose_replicas_all_left_overflows_or_is_refused_at_once() -> None:
    scheduler = _scheduler(busy=False)
    scheduler.replicas = {"large": Replicas("conversation"), "small": Replicas("conversation")}
    for pool, replicas in scheduler.replicas.items():
        replicas.update([ReplicaAnnounced(worker_id=f"{pool}-w", partitions={f"t.generate.{pool}.free": [0]},
                                          active=0)])
    scheduler.replicas["large"].update([])  # large's only worker has gone
    small = PoolPrompt(pool="small", prompt_token_ids=[1], max_tokens=5)
    outs = await scheduler.handle(_prompt(alternates=[small]))
    assert isinstance(outs[0].event, GenerationQueued) and outs[0].event.pool == "small"
    assert outs[0].event.route_reason == "overflow" and outs[1].topic == "t.generate.small.free"
    refused = await scheduler.handle(_prompt("tell me a story"))  # no prompt fitted for small
    assert isinstance(refused[0].event, RequestRefused) and refused[0].event.status == 503
    assert "No replica of large" in refused[0].event.message and (refused[0].event.retry_after_s or 0) >= 10


async def test_unknown_pool_is_refused_with_the_valid_names() -> None:
    outs = await _scheduler(busy=False).handle(_prompt(pool="huge"))
    assert isinstance(outs[0].event, RequestRefused) and "large" in outs[0].event.message


async def test_overflow_sends_the_prompt_fitted_for_the_small_pool() -> None:
    fitted = PoolPrompt(pool="small", max_tokens=7, prompt_token_ids=[9, 9, 9])
    outs = await _scheduler(busy=True, busy_pools=("large",)).handle(_prompt("story", alternates=[fitted]))
    request = outs[1].event
    assert outs[1].topic == "t.generate.small.free" and request.route_reason == "overflow"
    assert (request.prompt_token_ids, request.max_tokens) == ([9, 9, 9], 7)
    same = PoolPrompt(pool="small", max_tokens=5)  # the same ids are valid there: only the reply cap differs
    outs = await _scheduler(busy=True, busy_pools=("large",)).handle(_prompt("story", alternates=[same]))
    assert (outs[1].event.prompt_token_ids, outs[1].event.max_tokens) == ([1, 2], 5)


async def test_no_prompt_for_the_small_pool_means_no_overflow_and_the_refusal_frees_the_slot() -> None:
    quota = FakeQuota()
    outs = await _scheduler(busy=True, busy_pools=("large",), quota=quota).handle(_prompt("story"))
    assert isinstance(outs[0].event, RequestRefused) and outs[0].event.status == 503
    assert quota.released == [("g", "scheduler")]  # in the same step as the refusal
    outs = await _scheduler(busy=False, quota=quota).handle(_prompt(pool="huge"))
    assert isinstance(outs[0].event, RequestRefused) and quota.released[-1] == ("g", "scheduler")


async def test_a_finished_reply_frees_its_place_in_the_queue() -> None:
    scheduler = _scheduler(busy=False)
    await scheduler.handle(_prompt("story"))
    assert list(scheduler.queues.pools["large"].running) == ["g"]
    scheduler.finished("g")  # what the follower of chat.replies calls for every GenerationFinished
    assert scheduler.queues.pools["large"].running == {}
    refused = await _scheduler(busy=True, busy_pools=("large",)).handle(_prompt("story"))
    assert refused[1].event.status == "failed"


async def test_a_queued_client_is_told_again_when_its_countdown_is_off() -> None:
    queues = Queues({"large": PoolLoad.of(1, prior_s=20), "small": PoolLoad.of(1, prior_s=20)})
    queues.enqueued("running", "large", "free")  # the one slot is taken: a paid newcomer waits about 20 s
    scheduler = Scheduler(Topics("t."), queues, load_plans(), {"large": "L", "small": "S"}, None, None, FakeReplies())
    outs = await scheduler.handle(_prompt("story", plan="paid"))
    first = outs[0].event
    assert isinstance(first, GenerationQueued) and first.position == 1 and first.revision == 0
    told_at = scheduler.queues.told["g"].at
    assert scheduler.revisions(now=told_at + 2) == []  # never sooner than REVISE_GAP_S
    assert scheduler.revisions(now=told_at + 10) == []  # 10 s left, as the client's countdown shows
    scheduler.queues.told["g"] = Shown(told_at, 40.0)  # as if it had been shown 40 s: its countdown says 30
    [again] = scheduler.revisions(now=told_at + 10)
    revised = again.event
    assert again.topic == "t.chat.tokens" and again.key == "g" and isinstance(revised, GenerationQueued)
    assert revised.revision == 1 and revised.position == 1 and revised.estimated_wait_s == 10.0
    assert (revised.model, revised.message_id, revised.lane) == (first.model, first.message_id, "paid")
    scheduler.finished("g")
    assert scheduler.revisions(now=told_at + 60) == [] and "g" not in scheduler.queued
