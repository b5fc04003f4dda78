"""A request's callback URL, checked where the request is made (CLI, HTTP, MCP) against
the operator's callback hosts, so a caller hears at once what the deliverer would
refuse later (it checks again: a request may come from any Kafka producer)."""

from __future__ import annotations

from domain.callbacks import check_callback_url
from toolexec.settings import Settings


def checked_callback_url(url: str | None, settings: Settings) -> str | None:
    """`url` when the operator allows it (None stays None); InvalidRequest (E3004) for
    a malformed URL, NetworkPolicyViolation (E3406) for a host not allowed."""
    if url is None:
        return None
    check_callback_url(url, settings.callback_hosts)
    return url
