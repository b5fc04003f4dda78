"""Strings handed to the operating system (a process's argv and environment) or put on
the wire (an HTTP request's method, URL and headers), checked before they are used.

The OS refuses a NUL byte in argv or the environment, an environment variable name
holding `=`, and text it cannot encode (a lone surrogate); HTTP clients refuse a
newline in a header value (it would split the header) and, for some, any non-ASCII
header. A manifest, a parameter or a secret can hold any of these, so each is refused
here with a clear error naming where it was, never its value (it may be a secret),
before a sandbox is chosen or a connection opened: E3401, the process or request
cannot be built (a parameter that cannot be encoded into a URL is the HTTP
primitive's E3301).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from domain.errors import ExecutionError

_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
_URL_TEXT = re.compile(r"[^\x00-\x20\x7f]+")


def text_problem(value: str) -> str | None:
    """Why the OS cannot take `value` as an argument or environment string, or None."""
    if "\x00" in value:
        return "holds a NUL character"
    try:
        value.encode("utf-8", "surrogateescape")  # how Python hands text to the OS
    except UnicodeEncodeError:
        return "holds text that cannot be encoded (a lone surrogate)"
    return None


def check_process(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Raise E3401 naming the first argument or variable the OS would refuse."""
    for index, argument in enumerate(argv):
        _refuse(text_problem(argument), f"argument {index} of the command",
                {"argument": index})
    for name, value in env.items():
        shown = name if text_problem(name) is None else repr(name)
        if not name or "=" in name:
            _refuse("is not a valid name (empty, or holding '=')",
                    f"environment variable {shown}", {"variable": shown})
        _refuse(text_problem(name), f"the name of environment variable {shown}",
                {"variable": shown})
        _refuse(text_problem(value), f"environment variable {shown}", {"variable": shown})


def check_http_request(method: str, url: str, headers: Mapping[str, str]) -> None:
    """Raise E3401 when the method is not an HTTP token, the URL holds whitespace,
    control characters or unencodable text, or a header's name is not a token or its
    value holds anything but visible ASCII, space and tab (a newline would split it)."""
    if not _HTTP_TOKEN.fullmatch(method):
        _refuse("is not an HTTP method token", "the method", {"method": repr(method)})
    if not _URL_TEXT.fullmatch(url):
        _refuse("holds whitespace or control characters once built", "the URL", {})
    _refuse(text_problem(url), "the URL", {})
    check_headers(headers)


def check_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
    """Raise E3401 for the first header whose name or value HTTP cannot carry."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in pairs:
        if not _HTTP_TOKEN.fullmatch(name):
            _refuse("is not an HTTP token", f"header name {name!r}", {"header": repr(name)})
        if not _HEADER_VALUE.fullmatch(value):
            _refuse("holds a newline, a control or a non-ASCII character",
                    f"the value of header {name}", {"header": name})


def _refuse(problem: str | None, where: str, details: dict[str, object]) -> None:
    if problem is not None:
        message = f"{where} {problem}"
        raise ExecutionError(message, details={"reason": message, **details})
