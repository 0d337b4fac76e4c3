"""Make the broker match the catalogue: create missing topics, grow partitions,
correct retention and cleanup policy. Never deletes or shrinks anything."""
from __future__ import annotations

import asyncio
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from infra.settings import Settings
from topics.catalogue import Topic, Topics

log = logging.getLogger(__name__)


async def ensure_topics_async(bootstrap: str, prefix: str = "") -> dict[str, str]:
    """Return what was done per topic: created, grown, reconfigured or ok."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        wanted = dict(Topics(prefix).all())
        existing = await _partition_counts(admin, list(wanted))
        missing = [n for n in wanted if n not in existing]
        actions = {n: "ok" for n in wanted}
        if missing:
            await admin.create_topics(
                [NewTopic(n, wanted[n].partitions, 1, topic_configs=wanted[n].config) for n in missing]
            )
            actions.update({n: "created" for n in missing})
        grow = {n: NewPartitions(wanted[n].partitions) for n, c in existing.items() if c < wanted[n].partitions}
        if grow:
            await admin.create_partitions(grow)
            actions.update({n: "grown" for n in grow})
        for name in await _misconfigured(admin, {n: wanted[n] for n in existing}):
            actions[name] = "reconfigured" if actions[name] == "ok" else actions[name] + "+reconfigured"
        return actions
    finally:
        await admin.close()


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


async def _misconfigured(admin: AIOKafkaAdminClient, topics: dict[str, Topic]) -> list[str]:
    if not topics:
        return []
    current = await _current_configs(admin, list(topics))
    wrong = [n for n, t in topics.items() if any(current.get(n, {}).get(k) != v for k, v in t.config.items())]
    if wrong:
        # Non-incremental AlterConfigs replaces a topic's whole config set, so send all we manage.
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, n, topics[n].config) for n in wrong])
    return wrong


def ensure_topics(settings: Settings) -> dict[str, str]:
    actions = asyncio.run(ensure_topics_async(settings.kafka_bootstrap, settings.topic_prefix))
    changed = {n: a for n, a in actions.items() if a != "ok"}
    log.info("topics: %d in catalogue, changed %s", len(actions), changed or "none")
    return actions
