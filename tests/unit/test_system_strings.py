"""What the OS and HTTP can carry (pure): a string is refused exactly when the OS or an
HTTP client would refuse it, with an E3401 naming where, never the value."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.errors import ToolexecError
from domain.system_strings import check_headers, check_http_request, check_process, text_problem


@given(st.text())
def test_text_is_refused_exactly_when_the_os_cannot_take_it(value: str) -> None:
    try:
        taken = b"\x00" not in os.fsencode(value)
    except UnicodeEncodeError:
        taken = False
    assert (text_problem(value) is None) == taken


@given(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E)), st.sampled_from(
    ["\r", "\n", "\x00", "\x7f", "é", "\x1b"]), st.integers(0, 40))
def test_a_header_value_takes_visible_ascii_only(value: str, bad: str, at: int) -> None:
    check_headers({"X-Name": value + "\tend"})
    spoiled = value[:at] + bad + value[at:]
    with pytest.raises(ToolexecError) as refused:
        check_headers({"X-Name": spoiled})
    assert refused.value.code == "E3401" and spoiled not in str(refused.value.to_dict())


@pytest.mark.parametrize("name", ["", "X A", "X:A", "X\nA", "é"])
def test_a_header_name_must_be_a_token(name: str) -> None:
    with pytest.raises(ToolexecError, match="header name"):
        check_headers([(name, "v")])


def test_a_request_line_cannot_be_smuggled_through_the_method_or_the_url() -> None:
    check_http_request("GET", "http://h/p?q=%00", {})
    for method, url in (("GET /x HTTP/1.1\r\n", "http://h/"), ("GET", "http://h/a b"),
                        ("GET", "http://h/\r\nX: 1"), ("GET", "http://h/\x00")):
        with pytest.raises(ToolexecError) as refused:
            check_http_request(method, url, {})
        assert refused.value.code == "E3401"


def test_a_secret_in_a_refused_variable_is_named_never_shown() -> None:
    with pytest.raises(ToolexecError) as refused:
        check_process(["prog"], {"API_KEY": "hunter2\x00"})
    assert refused.value.details == {"reason": "environment variable API_KEY holds a NUL "
                                     "character", "variable": "API_KEY"}
    check_process(["prog", "a\nb", "\udc80"], {"A": "multi\nline", "B": ""})  # the OS takes these
