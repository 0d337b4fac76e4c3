"""``python -m infra.deploy.topics``: write the chart's topic list (helm/parley/files/topics.json) from
``topics/catalogue.py`` and the pools of ``infra/config/pools.toml``; the chart turns it into Strimzi
``KafkaTopic`` resources. A unit test fails when the file is stale, so the cluster's topics never drift
from the catalogue.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from infra.config.pools import load_pools
from infra.config.settings import Settings
from topics import Topic, Topics

CHART = Path(__file__).with_name("helm") / "parley"
TOPICS_FILE = CHART / "files" / "topics.json"


def deployed_topics() -> list[tuple[str, Topic]]:
    """Every topic of a deployment with the pools of infra/config/pools.toml, the stages' own included,
    unprefixed (one per cluster)."""
    topics = Topics("", load_pools(Settings()))
    return topics.all() + topics.internals()


def topics_document() -> str:
    topics = [{"name": name, "partitions": t.partitions, "retention_ms": t.retention_ms,
               "cleanup_policy": t.cleanup_policy, "key": t.key} for name, t in deployed_topics()]
    return json.dumps({"topics": topics}, indent=1) + "\n"


def main() -> int:
    TOPICS_FILE.parent.mkdir(parents=True, exist_ok=True)
    TOPICS_FILE.write_text(topics_document())
    print(f"{len(deployed_topics())} topics written to {TOPICS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
