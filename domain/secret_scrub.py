"""Removing credential values from what leaves a run, in the forms a tool prints them.

A tool that received credentials may print them, carelessly or not. Before any
event is made of a run, every string that leaves it — stdout, stderr, the error
message and details, an HTTP response's headers — is scrubbed of each credential
value the run was given (`Scrubber(values).text(s)` / `.value(v)`), in these forms:

- the value itself, and reversed;
- base64 (standard and URL-safe alphabets, with or without padding) of the value
  and of the reversed value, including where the value sits inside a longer base64
  text at any of the three byte alignments (only the characters that depend on the
  value alone are matched: up to two characters at each edge, which also carry
  bits of the neighbouring bytes, stay);
- hex (lower and upper case), and `\\xNN` escapes;
- URL encoding (`quote`, `quote_plus`, and every byte as `%XX`, either case);
- JSON string escaping (as `json.dumps` writes it, ASCII-only or not);
- split forms: any run of at least `FRAGMENT` (8) consecutive characters of the
  value or of its reverse, ignoring ASCII case — so a value printed in two halves,
  or upper-cased, is still caught when each piece has 8 characters or more.

Not caught (and not claimed): pieces shorter than 8 characters, a value spread out
with characters between its pieces, encodings of pieces, and any transformation
beyond those above (a tool can always encrypt what it prints). Scrubbing keeps
careless tools from leaking; what really keeps a credential from a tool is not
granting it (TOOLEXEC_CREDENTIAL_GRANTS).

Values shorter than `MIN_SECRET` (4) characters are not scrubbed: they would match
everywhere. Pure: no I/O.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

REDACTED = "[REDACTED]"
MIN_SECRET = 4
"""Shorter secrets are not scrubbed, here nor by domain.redaction: they would match
everywhere."""
FRAGMENT = 8
_B64_TO_URLSAFE = str.maketrans("+/", "-_")
# characters of base64 output that depend only on the value, per leading offset
_B64_SKIP = {0: 0, 1: 2, 2: 3}
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def encoded_forms(secret: str) -> frozenset[str]:
    """Every exact form of `secret` that is scrubbed (see the module docstring)."""
    forms: set[str] = set()
    for text in (secret, secret[::-1]):
        data = text.encode("utf-8")
        forms.add(text)
        forms.update(_base64_cores(data))
        forms.update({data.hex(), data.hex().upper(),
                      "".join(f"\\x{b:02x}" for b in data)})
        every = "".join(f"%{b:02X}" for b in data)
        forms.update({quote(text, safe=""), quote_plus(text, safe=""), every, every.lower()})
        forms.update(json_forms(text))
    return frozenset(form for form in forms if len(form) >= MIN_SECRET)


def json_forms(secret: str) -> tuple[str, ...]:
    """`secret` as JSON writes it inside a string (ASCII-only or not): a tool printing
    JSON escapes quotes, backslashes, control and often non-ASCII characters."""
    return json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]


def _base64_cores(data: bytes) -> set[str]:
    cores: set[str] = set()
    for offset, skip in _B64_SKIP.items():
        padded = b"\0" * offset + data
        encoded = base64.b64encode(padded).decode("ascii")
        whole = (len(padded) * 8) // 6  # characters made of these bytes' bits only
        core = encoded[skip:whole]
        if offset == 0:
            cores.add(encoded)  # with its padding, as printed on its own
            cores.add(encoded.translate(_B64_TO_URLSAFE))
        if len(core) >= MIN_SECRET:
            cores.update({core, core.translate(_B64_TO_URLSAFE)})
    return cores


class Scrubber:
    """Scrubs the credential values of one run from strings and JSON-like values."""

    def __init__(self, secrets: Iterable[str]) -> None:
        values = sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET},
                        key=len, reverse=True)
        forms: set[str] = set()
        grams: set[str] = set()
        for value in values:
            forms |= encoded_forms(value)
            for text in (value.translate(_ASCII_LOWER), value[::-1].translate(_ASCII_LOWER)):
                grams.update(text[i:i + FRAGMENT] for i in range(len(text) - FRAGMENT + 1))
        self._active = bool(values)
        # longest first, so a form that contains another is replaced whole
        ordered = sorted(forms, key=len, reverse=True)
        self._exact = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._grams = frozenset(grams)

    def __bool__(self) -> bool:
        return self._active

    def text(self, text: str) -> str:
        """`text` with every form of every secret replaced by [REDACTED]."""
        if not self._active or not text:
            return text
        if self._exact is not None:
            text = self._exact.sub(REDACTED, text)
        return self._without_fragments(text) if self._grams else text

    def value(self, value: Any) -> Any:
        """A JSON-like value with every string (keys too) scrubbed."""
        if not self._active:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(item) for item in value]
        return value

    def _without_fragments(self, text: str) -> str:
        """Replace every stretch covered by FRAGMENT-long pieces of a secret."""
        if len(text) < FRAGMENT:
            return text
        lowered = text.translate(_ASCII_LOWER)
        starts = sorted(_gram_starts(lowered, self._grams))
        if not starts:
            return text
        spans: list[list[int]] = []
        for start in starts:
            end = start + FRAGMENT
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], end)
            else:
                spans.append([start, end])
        pieces: list[str] = []
        last = 0
        for start, end in spans:
            pieces += [text[last:start], REDACTED]
            last = end
        pieces.append(text[last:])
        return "".join(pieces)


_FIND_LIMIT = 256
"""Up to this many pieces, each is searched with str.find (C speed, ~8 ms for 512 KiB
and a 24-character secret); beyond it one pass over the text is cheaper."""


def _gram_starts(lowered: str, grams: frozenset[str]) -> set[int]:
    starts: set[int] = set()
    if len(grams) <= _FIND_LIMIT:
        for gram in grams:
            index = lowered.find(gram)
            while index >= 0:
                starts.add(index)
                index = lowered.find(gram, index + 1)
        return starts
    for index in range(len(lowered) - FRAGMENT + 1):
        if lowered[index:index + FRAGMENT] in grams:
            starts.add(index)
    return starts
