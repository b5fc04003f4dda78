"""Structured logging set-up: structlog to stderr, JSON lines in production."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import structlog

from domain.redaction import redact
from toolexec.settings import Settings

_LOG_FIELDS_KEPT = frozenset({"event", "level", "timestamp", "logger"})


def redact_pii(logger: object, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: every logged value redacted as the audit trail is (secret
    fields, tokens, e-mail, card, SSN, phone and IP values)."""
    return {key: value if key in _LOG_FIELDS_KEPT or value is None
            or isinstance(value, bool | int | float) else redact(value).value
            for key, value in event_dict.items()} if event_dict else event_dict


def configure_logging(settings: Settings, *, default_level: str | None = None) -> None:
    """Route structlog and stdlib logging to stderr at the configured level.

    stdout stays clean for command output (`--json`). `default_level` lets the CLI
    stay quiet (WARNING) unless TOOLEXEC_LOG_LEVEL asks for more.
    """
    level_name = default_level if default_level and "log_level" not in settings.model_fields_set \
        else settings.log_level
    level = getattr(logging, level_name)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if settings.log_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_pii,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # aiokafka reports routine rebalances as warnings; keep them out of quiet runs.
    logging.getLogger("aiokafka").setLevel(max(level, logging.ERROR))
    for handler in logging.getLogger().handlers:
        handler.addFilter(_REPEATED)


class RepeatedErrors(logging.Filter):
    """Kafka clients log the same error on every retry while a broker is away (tens
    of KB a second): let the first of each message through, drop its repeats until
    `reset()` (the broker is back), with one count line per `summary_seconds`."""

    def __init__(self, prefixes: tuple[str, ...] = ("aiokafka",),
                 summary_seconds: float = 300.0) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.summary_seconds = summary_seconds
        self._seen: dict[tuple[str, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes):
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = [0, now]
            return True
        seen[0] += 1
        if now - seen[1] < self.summary_seconds:
            return False
        record.msg = f"{record.msg} (and {int(seen[0])} times more in {now - seen[1]:.0f} s)"
        self._seen[key] = [0, now]
        return True

    def reset(self) -> None:
        self._seen.clear()


_REPEATED = RepeatedErrors()


def reset_repeated_errors() -> None:
    """A new state (the broker is back): the next error of each kind is logged again."""
    _REPEATED.reset()
