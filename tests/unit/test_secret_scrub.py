"""Scrubbing credential values, and their common encodings, from run output."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote, quote_plus

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.secret_scrub import FRAGMENT, REDACTED, Scrubber, encoded_forms

SECRET = "sk-live-7f3a9c2e1b4d/+=x"

secrets = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF),
                  min_size=FRAGMENT, max_size=48).filter(
    # a secret made of pieces of the marker itself would be "found" in the marker
    lambda s: not any(s[i:i + 3].lower() in REDACTED.lower() for i in range(len(s) - 2)))
context = st.text(alphabet=" \n:;,", max_size=12)


def _encodings(secret: str) -> list[str]:
    raw = secret.encode()
    return [secret, secret[::-1], base64.b64encode(raw).decode(),
            base64.urlsafe_b64encode(raw).decode().rstrip("="), raw.hex(), raw.hex().upper(),
            quote(secret, safe=""), quote_plus(secret), json.dumps(secret)[1:-1],
            "".join(f"%{b:02X}" for b in raw)]


@settings(max_examples=60, deadline=None)
@given(secret=secrets, before=context, after=context)
def test_every_common_encoding_of_a_secret_is_removed(secret: str, before: str,
                                                      after: str) -> None:
    scrub = Scrubber([secret])
    for form in _encodings(secret):
        cleaned = scrub.text(f"{before}{form}{after}")
        assert form not in cleaned
        assert REDACTED in cleaned


@settings(max_examples=60, deadline=None)
@given(secret=secrets, prefix=st.binary(max_size=7), suffix=st.binary(max_size=7))
def test_a_secret_inside_a_longer_base64_text_is_removed_at_any_alignment(
        secret: str, prefix: bytes, suffix: bytes) -> None:
    encoded = base64.b64encode(prefix + secret.encode() + suffix).decode()
    cleaned = Scrubber([secret]).text(encoded)
    assert REDACTED in cleaned
    # what is left around it cannot hold more than a couple of characters of the core
    assert len(cleaned) - len(REDACTED) <= len(encoded) - (len(secret.encode()) * 4 // 3 - 3)


def test_split_and_upper_cased_pieces_of_eight_characters_are_removed() -> None:
    scrub = Scrubber([SECRET])
    text = f"first {SECRET[:12]} then {SECRET[12:]} and {SECRET.upper()}"
    cleaned = scrub.text(text)
    for piece in (SECRET[:12], SECRET[12:], SECRET.upper()):
        assert piece not in cleaned


def test_pieces_shorter_than_eight_characters_are_not_claimed() -> None:
    assert Scrubber([SECRET]).text(f"a {SECRET[:5]} b") == f"a {SECRET[:5]} b"


def test_text_without_the_secret_is_unchanged() -> None:
    text = json.dumps({"result": [1, 2, 3], "note": "nothing to see"})
    assert Scrubber([SECRET]).text(text) == text


def test_values_are_walked_keys_included() -> None:
    scrubbed = Scrubber([SECRET]).value({SECRET: [SECRET[::-1], 3], "n": None})
    assert scrubbed == {REDACTED: [REDACTED, 3], "n": None}


def test_values_too_short_to_scrub_are_ignored() -> None:
    assert not Scrubber(["abc", ""])
    assert Scrubber(["abc"]).text("abcabc") == "abcabc"


def test_encoded_forms_include_reversed_encodings() -> None:
    raw = SECRET[::-1].encode()
    assert {base64.b64encode(raw).decode(), raw.hex()} <= encoded_forms(SECRET)


@settings(max_examples=60, deadline=None)
@given(before=st.text(max_size=20), after=st.text(max_size=20))
def test_any_text_around_a_piece_keeps_everything_but_the_piece(before: str, after: str) -> None:
    piece = SECRET[2:14]
    cleaned = Scrubber([SECRET]).text(f"{before}\x00{piece}\x00{after}")
    assert piece not in cleaned
    assert cleaned.startswith(before[:1]) and cleaned.endswith(after[-1:])
