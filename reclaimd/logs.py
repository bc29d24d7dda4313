"""Structured JSON logging: one object per line on stderr.

Callers pass facts as ``extra={"fields": {...}}`` (or use ``event()``), never pre-formatted
strings, so a log pipeline can index them. Nothing here logs payload bodies: a notice is
identified by its id and digest, never by its raw content.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from reclaimd.model import rfc3339, utcnow

_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": rfc3339(utcnow()),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return json.dumps(out, default=str, separators=(",", ":"))


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The libraries below are chatty at INFO about reconnects we already report ourselves.
    for noisy in ("aiokafka", "kafka", "botocore", "urllib3", "google", "kubernetes_asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def event(logger: logging.Logger, msg: str, level: int = logging.INFO, **fields: Any) -> None:
    logger.log(level, msg, extra={"fields": fields})
