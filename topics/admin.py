"""Make the broker match the catalogue: create missing topics, grow partitions,
correct retention and cleanup policy. Never deletes or shrinks anything, except ``delete_prefixed_async``,
which removes a test run's own prefixed topics (each holds ~70 partitions; left behind, a few hundred test
runs exhaust a small broker's heap).

Takes the bootstrap address, prefix and pools as arguments (``infra/local/topology.py`` passes the configured
ones), so the transport layer reads no configuration."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from topics.catalogue import Topics

log = logging.getLogger(__name__)


async def ensure_topics_async(bootstrap: str, prefix: str, pools: Iterable[str], replication: int = 1,
                              min_insync: int = 1) -> dict[str, str]:
    """Return what was done per topic: created, grown, reconfigured or ok. New topics get ``replication``
    replicas; every topic gets ``min.insync.replicas`` = ``min_insync`` (with acks=all, a write is
    acknowledged once that many replicas have it). A topic made with fewer replicas is reported, not moved."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = Topics(prefix, pools)
        wanted = dict(topics.all() + topics.internals())
        configs = {n: {**t.config, "min.insync.replicas": str(min_insync)} for n, t in wanted.items()}
        existing = await _partition_counts(admin, list(wanted))
        missing = [n for n in wanted if n not in existing]
        actions = {n: "ok" for n in wanted}
        if missing:
            response = await admin.create_topics(
                [NewTopic(n, wanted[n].partitions, replication, topic_configs=configs[n]) for n in missing]
            )
            _raise_for_errors(response)
            actions.update({n: "created" for n in missing})
        grow = {n: NewPartitions(wanted[n].partitions) for n, c in existing.items() if c < wanted[n].partitions}
        if grow:
            await admin.create_partitions(grow)
            actions.update({n: "grown" for n in grow})
        for name in await _misconfigured(admin, {n: configs[n] for n in existing}):
            actions[name] = "reconfigured" if actions[name] == "ok" else actions[name] + "+reconfigured"
        if missing or grow:
            await _await_leaders(admin, {n: wanted[n].partitions for n in wanted})
        return actions
    finally:
        await admin.close()


async def delete_prefixed_async(bootstrap: str, prefix: str) -> int:
    """Delete every topic whose name starts with ``prefix`` (a non-empty, dotted test prefix); how many."""
    if not prefix or not prefix.endswith("."):
        raise ValueError(f"refusing to delete topics under prefix {prefix!r}: not a dotted test prefix")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [n for n in await admin.list_topics() if n.startswith(prefix)]
        if names:
            await admin.delete_topics(names)
        return len(names)
    finally:
        await admin.close()


class _CreateTopicsResponse(Protocol):
    topic_errors: Sequence[tuple[Any, ...]]  # each: (topic, error_code[, error_message])


def _raise_for_errors(response: _CreateTopicsResponse) -> None:
    # 36 = TOPIC_ALREADY_EXISTS, a race with another caller
    failed = [(e[0], e[1], e[2] if len(e) > 2 else "") for e in response.topic_errors if e[1] not in (0, 36)]
    if failed:
        raise RuntimeError("creating topics failed: " + "; ".join(f"{t}: error {c} {m}" for t, c, m in failed))


async def _await_leaders(admin: AIOKafkaAdminClient, wanted: dict[str, int], timeout_s: float = 60.0) -> None:
    """Return once every partition of every topic in ``wanted`` has a leader in the broker's metadata:
    a topic the controller accepted can take a moment (longer on a busy, just-started broker) before any
    client sees it, and a consumer started in that gap would find no partitions."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        described = await admin.describe_topics(sorted(wanted))
        ready = {d["topic"] for d in described if d["error_code"] == 0
                 and len(d["partitions"]) >= wanted.get(d["topic"], 1)
                 and all(p["leader"] >= 0 for p in d["partitions"])}
        pending = sorted(set(wanted) - ready)
        if not pending:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"topics have no leader after {timeout_s:.0f}s: {', '.join(pending)}")
        await asyncio.sleep(0.2)


async def _partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    present = set(await admin.list_topics()) & set(names)
    if not present:
        return {}
    described = await admin.describe_topics(sorted(present))
    return {d["topic"]: len(d["partitions"]) for d in described}


async def _current_configs(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
    current: dict[str, dict[str, str]] = {}
    for response in responses:
        # each resource: (error_code, error_message, resource_type, resource_name, config_entries)
        for resource in response.resources:
            current[resource[3]] = {entry[0]: entry[1] for entry in resource[4]}
    return current


async def _misconfigured(admin: AIOKafkaAdminClient, configs: dict[str, dict[str, str]]) -> list[str]:
    if not configs:
        return []
    current = await _current_configs(admin, list(configs))
    wrong = [n for n, c in configs.items() if any(current.get(n, {}).get(k) != v for k, v in c.items())]
    if wrong:
        # Non-incremental AlterConfigs replaces a topic's whole config set, so send all we manage.
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, n, configs[n]) for n in wrong])
    return wrong
