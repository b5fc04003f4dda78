"""One request to the running `up`'s HTTP gateway, answered as (status, JSON body): an
unreachable gateway or a body that is not JSON become E3001 / E3000 error bodies, so a
command reports every outcome the same way."""

from __future__ import annotations

from typing import Any


def gateway_call(url: str, method: str, path: str, *, token: str | None,
                 body: dict[str, Any] | None = None,
                 params: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, f"{url.rstrip('/')}{path}", json=body, params=params,
                                 headers=headers, timeout=30)
    except httpx.HTTPError as error:
        return 503, {"error": {"code": "E3001", "message": f"gateway unreachable: {error}",
                               "details": {"gateway_url": url}}}
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, {"error": {"code": "E3000", "message": response.text[:300],
                                                "details": {}}}


def no_running_system() -> tuple[int, dict[str, Any]]:
    """The answer when neither a gateway nor a broker is known."""
    return 503, {"error": {
        "code": "E3001", "message": "no running toolexec found: start `toolexec up` first "
        "or set TOOLEXEC_KAFKA_BOOTSTRAP", "details": {}}}
