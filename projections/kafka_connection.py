"""Connection options of Kafka clients (aiokafka keyword arguments) that must cross a
process boundary.

`toolexec.settings.kafka_client_options` builds the options every client passes; a TLS
context among them cannot be pickled, so what is sent to a rebuild worker process
(`projections.rebuild_workers`) carries the context's CA file instead and the worker
makes its own. Here, not in toolexec, because the projections never import toolexec.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ssl import SSLContext


def kafka_ssl_context(cafile: Path | str | None) -> SSLContext:
    """A verifying TLS context (hostname checked) trusting `cafile`, or the system CAs.
    It remembers `cafile`, so `portable_client_options` can send it to another process."""
    from aiokafka.helpers import create_ssl_context  # noqa: PLC0415 - only with TLS

    context = create_ssl_context(cafile=str(cafile) if cafile is not None else None)
    context.toolexec_cafile = None if cafile is None else str(cafile)  # type: ignore[attr-defined]
    return context


_PORTABLE_CAFILE = "toolexec_ssl_cafile"


def portable_client_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` in a form that pickles (for worker processes): a TLS context made by
    `kafka_ssl_context` becomes its CA file; `live_client_options` turns it back."""
    portable = dict(options)
    context = portable.pop("ssl_context", None)
    if context is not None:
        if not hasattr(context, "toolexec_cafile"):
            raise ValueError("an ssl_context not made by kafka_ssl_context cannot be "
                             "sent to a worker process")
        portable[_PORTABLE_CAFILE] = context.toolexec_cafile
    return portable


def live_client_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `portable_client_options` (options without a CA marker pass as
    they are)."""
    live = dict(options)
    if _PORTABLE_CAFILE in live:
        live["ssl_context"] = kafka_ssl_context(live.pop(_PORTABLE_CAFILE))
    return live
