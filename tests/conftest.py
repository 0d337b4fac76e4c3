"""Session-scoped real services, isolated per test by topic prefix and per run by keyspace."""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack

import pytest

from infra.config.settings import Settings


@pytest.fixture(scope="session")
def stack_settings() -> Iterator[Settings]:
    """The running stack (started by the project's infra code if needed), with a keyspace for this run."""
    from infra.stores.cql.migrate import apply
    from tests.services import provide

    with ExitStack() as stack:
        base = provide(stack)
        chosen = os.environ.get("PARLEY_TEST_KEYSPACE")
        # A keyspace of its own per run (its schema is this checkout's), dropped at the end unless one was named.
        keyspace = chosen or f"{TEST_KEYSPACE_PREFIX}{int(time.time())}_{uuid.uuid4().hex[:6]}"
        settings = base.with_(keyspace=keyspace)
        _drop_test_keyspaces(settings, older_than_s=STALE_KEYSPACE_S)  # ones a killed run left behind
        apply(settings)
        yield settings
        if not chosen:
            _drop_test_keyspaces(settings, only=keyspace)


TEST_KEYSPACE_PREFIX = "parley_test_"
STALE_KEYSPACE_S = 12 * 3600  # longer than any run, so a run beside this one keeps its keyspace


def _drop_test_keyspaces(settings: Settings, *, older_than_s: float = 0, only: str | None = None) -> None:
    from infra.stores.session import connect

    cluster, session = connect(settings, keyspace=None)
    try:
        names = [row.keyspace_name for row in session.execute("SELECT keyspace_name FROM system_schema.keyspaces")]
        for name in names:
            if not name.startswith(TEST_KEYSPACE_PREFIX):
                continue
            started = name[len(TEST_KEYSPACE_PREFIX):].split("_")[0]
            stale = started.isdigit() and time.time() - int(started) > older_than_s
            if name == only or (only is None and stale):
                session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=120)
    finally:
        cluster.shutdown()


@pytest.fixture
async def topic_prefix(stack_settings: Settings) -> AsyncIterator[str]:
    """Every catalogue topic, created fresh under a prefix unique to this test, and deleted after it."""
    from infra.config.pools import load_pools
    from topics.admin import delete_prefixed_async, ensure_topics_async

    prefix = f"t{uuid.uuid4().hex[:10]}."
    await ensure_topics_async(stack_settings.kafka_bootstrap, prefix, load_pools(stack_settings))
    yield prefix
    await delete_prefixed_async(stack_settings.kafka_bootstrap, prefix)


@pytest.fixture
def settings(stack_settings: Settings, topic_prefix: str) -> Settings:
    return stack_settings.with_(topic_prefix=topic_prefix)


@pytest.fixture(scope="session")
def cassandra_session(stack_settings: Settings) -> Iterator[object]:
    from infra.stores.session import connect

    cluster, session = connect(stack_settings)
    yield session
    cluster.shutdown()


@pytest.fixture
def db(cassandra_session: object) -> object:
    from infra.stores.session import AsyncSession

    return AsyncSession(cassandra_session)  # type: ignore[arg-type]


@pytest.fixture
async def redis_client(stack_settings: Settings) -> AsyncIterator[object]:
    import redis.asyncio as redis

    client = redis.Redis.from_url(stack_settings.redis_url)
    yield client
    await client.aclose()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath) or "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
