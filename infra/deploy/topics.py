"""``python -m infra.deploy.topics``: write the chart's topic list (helm/parley/files/topics.json) from
``topics/catalogue.py``, which the chart turns into Strimzi ``KafkaTopic`` resources. A unit test fails
when the file is stale, so the cluster's topics never drift from the catalogue.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from topics import CATALOGUE

CHART = Path(__file__).with_name("helm") / "parley"
TOPICS_FILE = CHART / "files" / "topics.json"


def topics_document() -> str:
    topics = [{"name": t.name, "partitions": t.partitions, "retention_ms": t.retention_ms,
               "cleanup_policy": t.cleanup_policy, "key": t.key} for t in CATALOGUE]
    return json.dumps({"topics": topics}, indent=1) + "\n"


def main() -> int:
    TOPICS_FILE.parent.mkdir(parents=True, exist_ok=True)
    TOPICS_FILE.write_text(topics_document())
    print(f"{len(CATALOGUE)} topics written to {TOPICS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
