import asyncio

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from infra.config.pools import load_pools
from infra.config.settings import Settings
from topics.admin import _current_configs, ensure_topics_async
from topics.catalogue import MINUTE_MS


async def test_ensure_topics_is_idempotent_and_corrects_drift(settings: Settings) -> None:
    prefix = settings.topic_prefix  # the fixture already created every topic
    again = await ensure_topics_async(settings.kafka_bootstrap, prefix, load_pools(settings))
    assert set(again.values()) == {"ok"}

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        tokens = f"{prefix}chat.tokens"
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, tokens, {"retention.ms": "1234"})])
        for _ in range(50):  # the broker applies config changes through its metadata log, a moment later
            if (await _current_configs(admin, [tokens]))[tokens]["retention.ms"] == "1234":
                break
            await asyncio.sleep(0.1)
        fixed = await ensure_topics_async(settings.kafka_bootstrap, prefix, load_pools(settings))
        assert fixed[tokens] == "reconfigured"
        assert {n: a for n, a in fixed.items() if a != "ok"} == {tokens: "reconfigured"}
        current = await _current_configs(admin, [tokens])
        for _ in range(50):
            current = await _current_configs(admin, [tokens])
            if current[tokens]["retention.ms"] == str(10 * MINUTE_MS):
                break
            await asyncio.sleep(0.1)
        assert current[tokens]["retention.ms"] == str(10 * MINUTE_MS)
    finally:
        await admin.close()
