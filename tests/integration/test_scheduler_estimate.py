"""The wait a queued reply is shown against the wait it really had, through the whole pipeline under a bounded load.

A private service on sim engines (gateway, stages, one worker, as `parley up` starts them) gets one pool of 4
sequences whose replies take several seconds. After three warm-up rounds (the scheduler learns the pool's times from
replies that ended), 30 messages arrive faster than the pool serves them, so a queue builds. For each reply that
was queued the client measures its real wait, from the first ``queued`` event to its first ``delta``, beside the
wait that event showed. The bar: within 30% at the median. The gateway's metric of the same error
(``parley_gateway_queued_wait_error_seconds``) must count every queued reply. Bounded: 42 messages, about a
minute and a half. The figures are printed (``-s``).
"""
from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from infra.config.settings import Settings
from infra.local.loadtest_service import PrivateService, ServiceSpec, SimPool, launch
from tests.e2e.client import frames

pytestmark = pytest.mark.integration

SEQS = 4
# 40 ms a step (the weights read at 8 TB/s): a reply of ~150 tokens holds its sequence about 6 s.
SIM = {"reply_tokens": 150, "weights_gb": 320.0}
# Warm-up replies, four at a time. The simulated engine draws a reply's length from its prompt, so the same
# prompts always give the same lengths: the first four warm-up prompts' replies are 81-122 tokens (99 on average,
# two-thirds of the pool's 150), and a pace learned from them alone showed every early wait a third short.
WARM_UP = 3 * SEQS
MESSAGES = 30
GAP_S = 0.8  # arrivals at 1.25 a second against a pool serving about 0.7: a queue of up to ~15
WITHIN = 0.30
METRIC = "parley_gateway_queued_wait_error_seconds_count"


@dataclass
class Waited:
    position: int
    shown_s: float
    real_s: float

    @property
    def error(self) -> float:
        return abs(self.real_s - self.shown_s) / self.real_s


@pytest.fixture(scope="module")
def service(stack_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateService]:
    spec = ServiceSpec({"large": SimPool(workers=1, max_num_seqs=SEQS, sim=SIM),
                        "small": SimPool(workers=1, max_num_seqs=8, sim={"reply_tokens": 24})})
    svc = launch(spec, tmp_path_factory.mktemp("waits"), stack_settings.keyspace)
    yield svc
    svc.stop()


async def _tokens(settings: Settings, n: int) -> list[str]:
    """``n`` paid users (a user holds at most 8 open streams on one gateway)."""
    from infra.stores.accounts import Accounts
    from infra.stores.session import AsyncSession, connect

    cluster, session = connect(settings)
    try:
        return [(await Accounts(AsyncSession(session)).create_user("paid"))[1] for _ in range(n)]
    finally:
        cluster.shutdown()


async def _ask(http: httpx.AsyncClient, token: str, n: int) -> Waited | None:
    """One message in a conversation of its own, read to its end as a person would (a stream closed early is
    an abandoned reply, cancelled); its shown and real wait if it was queued behind others."""
    auth = {"Authorization": f"Bearer {token}"}
    r = await http.post("/v1/conversations", json={}, headers=auth)
    assert r.status_code == 201, r.text
    cid = r.json()["conversation_id"]
    body = {"content": f"Tell me about harbour number {n}.", "model": "large"}
    queued: tuple[float, int, float] | None = None
    first: float | None = None
    async with http.stream("POST", f"/v1/conversations/{cid}/messages", json=body, headers=auth) as response:
        assert response.status_code == 200, await response.aread()
        async for frame in frames(response):
            if frame.event == "queued" and queued is None and frame.data["position"] > 0:
                queued = (time.monotonic(), frame.data["position"], frame.data["estimated_wait_s"])
            elif frame.event == "delta" and first is None:
                first = time.monotonic()
            elif frame.event == "error" or (frame.event == "message_end" and first is None):
                raise AssertionError(f"message {n} ended before any text: {frame.data}")
            elif frame.event == "message_end":
                break
    assert first is not None, f"message {n}: the stream closed early"
    return None if queued is None else Waited(queued[1], queued[2], first - queued[0])


def _metric(text: str) -> float:
    pattern = rf'^{METRIC}{{[^}}]*plan="paid"[^}}]*pool="large"[^}}]*}} ([0-9.e+]+)$'
    return sum(float(m) for m in re.findall(pattern, text, flags=re.M))


@pytest.fixture(scope="module")
async def waits(service: PrivateService) -> tuple[list[Waited], float]:
    """The load, once for the module: (each queued reply's shown and real wait, the gateway metric's count)."""
    tokens = await _tokens(service.settings, 6)
    async with httpx.AsyncClient(base_url=service.url, timeout=180) as http:
        for start in range(1, WARM_UP + 1, SEQS):  # the pool's times, learned
            await asyncio.gather(*(_ask(http, tokens[0], -i) for i in range(start, start + SEQS)))
        counted = _metric((await http.get("/metrics")).text)

        async def later(n: int) -> Waited | None:
            await asyncio.sleep(n * GAP_S)
            return await _ask(http, tokens[n % len(tokens)], n)
        results = await asyncio.gather(*(later(n) for n in range(MESSAGES)))
        metric = _metric((await http.get("/metrics")).text) - counted
    waited = [w for w in results if w is not None]
    for w in waited:
        print(f"position {w.position:2d}: shown {w.shown_s:5.1f} s, real {w.real_s:5.1f} s, off {w.error:4.0%}")
    print(f"{len(waited)} of {MESSAGES} queued; error p50 {statistics.median([w.error for w in waited]):.0%}; "
          f"metric counted {metric:.0f}")
    return waited, metric


def test_a_queue_forms_and_the_gateway_metric_counts_each_queued_reply(waits: tuple[list[Waited], float]) -> None:
    waited, metric = waits
    assert len(waited) >= MESSAGES // 3  # a real queue formed
    assert max(w.real_s for w in waited) > 5  # waits of several seconds, not noise
    assert metric == len(waited)  # parley_gateway_queued_wait_error_seconds: one observation per queued reply


def test_the_shown_wait_is_within_30_percent_of_the_real_one_at_the_median(waits: tuple[list[Waited], float]) -> None:
    waited, _ = waits
    assert statistics.median(w.error for w in waited) <= WITHIN
