"""One logging set-up for every service process.

``Settings.log_format`` ``json`` writes one JSON object per line (``time``, ``level``, ``process``, ``stage``,
``logger``, ``msg`` and, where the call passed them as ``extra``, ids and token counts) for a log
shipper; ``text`` is the plain line for a terminal; ``auto`` (the default) picks text when stderr is a
terminal and JSON otherwise, so the logs `parley up` writes to files are JSON. ``Settings.debug`` names
loggers to run at DEBUG (comma-separated in the environment, e.g. ``consumers.stage,consumers.generation.worker``).

The stage a line belongs to comes from ``topics.runner.current_stage``, a context variable each stage sets
when it starts, so every task it spawns (and every library line logged inside them) carries it.
"""
from __future__ import annotations

import logging
import sys
import time

import orjson

from infra.config.settings import Settings
from topics.runner import current_stage

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# ``extra`` keys copied into the JSON object: ids and counts only, never message text.
FIELDS = ("generation_id", "conversation_id", "user_id", "message_id", "worker_id", "gateway_id", "plan", "pool",
          "lane", "status", "prompt_tokens", "completion_tokens", "cached_prompt_tokens", "reserved_tokens",
          "offset", "partition", "topic")


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "process": self.process,
            "stage": getattr(record, "stage", None) or current_stage.get() or None,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                data[name] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(data, default=str).decode()


class Repeats(logging.Filter):
    """A client library's same warning (same logger and message template) at most once per ``every_s``; the
    next one that passes says how many were held back. While Kafka is down, aiokafka logs an error for every
    reconnect attempt of every client (about 10 a second each); one process logged 147,000 in a minute."""

    def __init__(self, prefixes: tuple[str, ...] = ("aiokafka", "cassandra"), every_s: float = 10.0) -> None:
        super().__init__()
        self.prefixes, self.every_s = prefixes, every_s
        self.seen: dict[tuple[str, object], tuple[float, int]] = {}  # key -> (when last let through, held since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(self.prefixes):
            return True
        key, now = (record.name, record.msg), time.monotonic()
        passed, held = self.seen.get(key, (-self.every_s, 0))
        if now - passed < self.every_s:
            self.seen[key] = (passed, held + 1)
            return False
        self.seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} [{held} more like this in the last {now - passed:.0f} s]"
        return True


def use_json(fmt: str, stream: object = None) -> bool:
    if fmt == "auto":
        isatty = getattr(stream if stream is not None else sys.stderr, "isatty", None)
        return not (isatty is not None and isatty())
    return fmt == "json"


def configure(process: str = "parley", settings: Settings | None = None) -> None:
    settings = settings or Settings.from_env()
    handler = logging.StreamHandler()
    if use_json(settings.log_format, handler.stream):
        handler.setFormatter(JsonFormatter(process))
    else:
        handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(Repeats())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    for name in settings.debug:
        logging.getLogger(name).setLevel(logging.DEBUG)
