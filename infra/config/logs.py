"""One logging set-up for every service process: INFO, plus DEBUG for the loggers named in
``PARLEY_DEBUG`` (comma-separated, e.g. ``consumers.stage,consumers.generation.worker``)."""
from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure() -> None:
    logging.basicConfig(level=logging.INFO, format=FORMAT)
    for name in filter(None, (n.strip() for n in os.environ.get("PARLEY_DEBUG", "").split(","))):
        logging.getLogger(name).setLevel(logging.DEBUG)
