"""Tool search, the pure part: the text a tool is found by, query words, their
expansion for typos and partial words, and reciprocal rank fusion.

Both stores index the same four fields (name > tags > description > parameters) and
stem them themselves (SQLite FTS5 porter, PostgreSQL `english`); here query words are
checked against the index's vocabulary (its unstemmed words): a word the index knows,
or whose stem it knows, is kept as it is; another one is replaced by the indexed words
it begins (a partial word) and those within a small edit distance (a typo).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import Stemmer
from rapidfuzz import process
from rapidfuzz.distance import OSA

FIELDS = ("name", "tags", "description", "parameters")
"""Indexed fields, most telling first (their BM25 / ts_rank weights follow this order)."""

MIN_PREFIX = 3
"""A query word shorter than this is never taken for the start of a longer one."""
MAX_PREFIX_EXPANSIONS = 12
MAX_TYPO_EXPANSIONS = 4
RRF_K = 60
"""Reciprocal rank fusion constant (Cormack et al.; 60 is the usual choice)."""

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
STOPWORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "in", "into", "is", "it", "its", "of", "on", "or", "that", "the", "this", "to", "was", "were", "will", "with"])
"""Words a query drops: PostgreSQL's `english` configuration ignores them, so SQLite
must too for both stores to rank alike."""

_stemmer = Stemmer.Stemmer("english")


def words(text: str) -> list[str]:
    """Lower-case words of `text`: letters and digits, split at any other character
    and at camelCase humps (``wordCount`` -> ``word``, ``count``)."""
    return [w.lower() for w in _WORD.findall(_CAMEL.sub(" ", text))]


def query_words(query: str) -> list[str]:
    """The words of a query that count: no stopwords, no repeats, in order."""
    seen: dict[str, None] = {}
    for word in words(query):
        if word not in STOPWORDS:
            seen.setdefault(word)
    return list(seen)


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The English (Snowball) stem of a lower-case word."""
    return _stemmer.stemWord(word)


def field_texts(tool_id: str, manifest: Mapping[str, Any], tags: Sequence[str]) -> dict[str, str]:
    """The text of each indexed field but the description, as space-separated words:
    ``name`` (tool id and the manifest's `name`), ``tags``, ``parameters`` (names and
    descriptions of the parameters' JSON Schema properties, nested ones included)."""
    name = [tool_id, str(manifest.get("name") or "")]
    return {"name": " ".join(words(" ".join(name))),
            "tags": " ".join(words(" ".join(tags))),
            "parameters": " ".join(words(" ".join(_parameter_texts(manifest.get("parameters")))))}


def _parameter_texts(schema: Any, depth: int = 0) -> Iterable[str]:
    if not isinstance(schema, Mapping) or depth > 5:
        return
    for key in ("title", "description"):
        if isinstance(schema.get(key), str) and depth > 0:
            yield schema[key]
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for name, sub in properties.items():
            yield str(name)
            yield from _parameter_texts(sub, depth + 1)
    if isinstance(schema.get("items"), Mapping):
        yield from _parameter_texts(schema["items"], depth + 1)


@dataclass(frozen=True)
class Vocabulary:
    """The distinct words of the index, and their stems."""

    words: tuple[str, ...]
    stems: frozenset[str]
    known: frozenset[str]

    @classmethod
    def of(cls, texts: Iterable[str]) -> Vocabulary:
        distinct = sorted({w for text in texts for w in words(text)})
        return cls(tuple(distinct), frozenset(stem(w) for w in distinct), frozenset(distinct))


EMPTY_VOCABULARY = Vocabulary((), frozenset(), frozenset())


@dataclass(frozen=True)
class Term:
    """One query word and the indexed words it stands for (itself when known)."""

    word: str
    alternatives: tuple[str, ...]
    how: str
    """``exact`` (the index has the word or its stem), ``prefix``, ``typo``,
    ``prefix+typo`` or ``unknown`` (nothing close: kept, it matches nothing)."""


def typo_distance(word: str) -> int:
    """Edits (insert, delete, replace, swap of neighbours) a word of this length may be
    off by: 0 up to 3 letters, 1 up to 7, else 2."""
    return 0 if len(word) <= 3 else 1 if len(word) <= 7 else 2


def expand(word: str, vocabulary: Vocabulary) -> Term:
    """What `word` (lower-case) stands for in an index of `vocabulary`."""
    if word in vocabulary.known or stem(word) in vocabulary.stems:
        return Term(word, (word,), "exact")
    found: dict[str, None] = {}
    how = []
    if len(word) >= MIN_PREFIX:
        prefixed = _prefixed(vocabulary.words, word)
        for completion in sorted(prefixed, key=lambda w: (len(w), w))[:MAX_PREFIX_EXPANSIONS]:
            found.setdefault(completion)
        if prefixed:
            how.append("prefix")
    distance = typo_distance(word)
    if distance:
        close = process.extract(word, vocabulary.words, scorer=OSA.distance,
                                score_cutoff=distance, limit=MAX_TYPO_EXPANSIONS)
        for candidate, _score, _index in sorted(close, key=lambda c: (c[1], c[0])):
            found.setdefault(candidate)
        if close:
            how.append("typo")
    if not found:
        return Term(word, (word,), "unknown")
    return Term(word, tuple(found), "+".join(how))


def _prefixed(sorted_words: Sequence[str], prefix: str) -> list[str]:
    from bisect import bisect_left

    start = bisect_left(sorted_words, prefix)
    out = []
    for candidate in sorted_words[start:]:
        if not candidate.startswith(prefix):
            break
        out.append(candidate)
    return out


def expand_query(query: str, vocabulary: Vocabulary) -> list[Term]:
    """Every counting word of `query`, expanded against `vocabulary`."""
    return [expand(word, vocabulary) for word in query_words(query)]


def search_words(terms: Sequence[Term]) -> list[str]:
    """The distinct words a full-text query ORs together."""
    seen: dict[str, None] = {}
    for term in terms:
        for alternative in term.alternatives:
            seen.setdefault(alternative)
    return list(seen)


def matched_fields(fields: Mapping[str, str], terms: Sequence[Term]) -> list[str]:
    """The fields (in `FIELDS` order) holding a word of `terms`, compared by stem."""
    wanted = {stem(w) for term in terms for w in term.alternatives}
    return [name for name in FIELDS
            if wanted.intersection(stem(w) for w in words(fields.get(name) or ""))]


def reciprocal_rank_fusion(*rankings: Sequence[str], k: int = RRF_K) -> list[tuple[str, float]]:
    """Ids of every ranking ordered by the sum of 1 / (k + rank) (rank from 1) over the
    rankings holding them; ties by id, so the order is total."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def indexed_text(fields: Mapping[str, str]) -> str:
    """One text of every indexed field, most telling first: what is embedded."""
    return "\n".join(fields.get(name) or "" for name in FIELDS)


def content_hash(fields: Mapping[str, str]) -> str:
    """sha256 (hex) of `indexed_text(fields)`: equal texts share one embedding."""
    import hashlib

    return hashlib.sha256(indexed_text(fields).encode()).hexdigest()
