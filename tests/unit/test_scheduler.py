from consumers.scheduler.canned import CANNED_POOL, CannedReplies
from consumers.scheduler.queueing import PoolLoad, Queues
from consumers.scheduler.stage import Scheduler
from infra.config.plans import load_plans
from schemas import GenerationFinished, GenerationQueued, GenerationRequested, PromptBuilt, RequestRefused
from topics import Topics


def _prompt(question: str = "hello", pool: str = "large", plan: str = "free") -> PromptBuilt:
    return PromptBuilt(generation_id="g", conversation_id="c", user_id="u", plan=plan, pool=pool,  # type: ignore[arg-type]
                       user_message_id="um", assistant_message_id="g", turn=0, prompt_token_ids=[1, 2],
                       max_tokens=10, reserved_tokens=12, question=question)


def _scheduler(busy: bool) -> Scheduler:
    queues = Queues({"large": PoolLoad(1, prior_rate=0.01), "small": PoolLoad(1, prior_rate=0.01)})
    if busy:
        for pool in ("large", "small"):
            for i in range(3):
                queues.enqueued(f"{pool}{i}", pool, "free")
    return Scheduler(Topics("t."), queues, load_plans(), {"large": "L", "small": "S"},
                     CannedReplies({"hello": "prepared hi"}))


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
    assert len(refused) == 1 and isinstance(refused[0].event, RequestRefused)
    assert refused[0].event.status == 503 and refused[0].event.retry_after_s and refused[0].event.retry_after_s >= 1


async def test_unknown_pool_is_refused_with_the_valid_names() -> None:
    outs = await _scheduler(busy=False).handle(_prompt(pool="huge"))
    assert isinstance(outs[0].event, RequestRefused) and "large" in outs[0].event.message
