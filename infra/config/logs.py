"""One logging set-up for every service process: INFO, plus DEBUG for the loggers named in
``Settings.debug`` (comma-separated in the environment, e.g. ``consumers.stage,consumers.generation.worker``)."""
from __future__ import annotations

import logging
from collections.abc import Iterable

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(debug: Iterable[str] = ()) -> None:
    logging.basicConfig(level=logging.INFO, format=FORMAT)
    for name in debug:
        logging.getLogger(name).setLevel(logging.DEBUG)
