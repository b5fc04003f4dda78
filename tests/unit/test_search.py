"""Tool search, the pure part: words, query expansion, matched fields, rank fusion."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from domain.search import (
    Vocabulary,
    content_hash,
    expand,
    expand_query,
    field_texts,
    matched_fields,
    query_words,
    reciprocal_rank_fusion,
    search_words,
    words,
)

VOCABULARY = Vocabulary.of(["word count", "frequency statistics text", "json schema validate",
                            "statement statistic status", "http fetch url"])


def test_words_split_ids_camel_case_and_punctuation() -> None:
    assert words("text.word_count wordCount HTTPGet-2") == [
        "text", "word", "count", "word", "count", "httpget", "2"]


def test_query_words_drop_stopwords_and_repeats() -> None:
    assert query_words("Count the words in a word") == ["count", "words", "word"]


def test_a_known_word_or_stem_stays_as_it_is() -> None:
    assert expand("statistics", VOCABULARY).how == "exact"
    counting = expand("counting", VOCABULARY)  # its stem, count, is indexed
    assert (counting.how, counting.alternatives) == ("exact", ("counting",))


def test_a_partial_word_becomes_the_indexed_words_it_begins() -> None:
    term = expand("stat", VOCABULARY)
    assert term.how == "prefix"
    assert set(term.alternatives) == {"statement", "statistic", "statistics", "status"}


def test_a_typo_becomes_the_indexed_words_close_to_it() -> None:
    assert expand("frequncy", VOCABULARY).alternatives == ("frequency",)
    assert expand("shcema", VOCABULARY).alternatives == ("schema",)  # a swap is one edit
    assert expand("xyzzy", VOCABULARY).how == "unknown"


def test_short_words_are_never_fuzzy() -> None:
    assert expand("urk", VOCABULARY).how == "unknown"


def test_field_texts_hold_parameter_names_and_descriptions() -> None:
    manifest = {"name": "Word Counter", "parameters": {"type": "object", "properties": {
        "text": {"type": "string", "description": "The input document"},
        "options": {"type": "object", "properties": {"caseSensitive": {"type": "boolean"}}}}}}
    fields = field_texts("word_count", manifest, ["text", "nlp"])
    assert fields == {"name": "word count word counter", "tags": "text nlp",
                      "parameters": "text the input document options case sensitive"}


def test_matched_fields_compare_stems() -> None:
    fields = {"name": "word count", "tags": "text", "description": "Counts words",
              "parameters": "document"}
    assert matched_fields(fields, expand_query("counting", VOCABULARY)) == [
        "name", "description"]


def test_content_hash_changes_with_any_field() -> None:
    base = {"name": "a", "tags": "b", "description": "c", "parameters": "d"}
    assert content_hash(base) == content_hash(dict(base))
    assert all(content_hash({**base, key: "x"}) != content_hash(base) for key in base)


def test_rrf_prefers_ids_ranked_high_in_both() -> None:
    fused = reciprocal_rank_fusion(["a", "b", "c"], ["b", "c", "a"])
    assert [key for key, _ in fused] == ["b", "a", "c"]


ids = st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8)


@given(st.lists(ids, max_size=4))
def test_rrf_holds_every_id_once_best_first(rankings: list[list[str]]) -> None:
    fused = reciprocal_rank_fusion(*rankings)
    keys = [key for key, _ in fused]
    assert sorted(keys) == sorted({k for r in rankings for k in r})
    assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)


@given(ids)
def test_rrf_of_one_ranking_keeps_its_order(ranking: list[str]) -> None:
    assert [key for key, _ in reciprocal_rank_fusion(ranking)] == ranking


@given(st.text(max_size=40))
def test_expansion_searches_only_plain_words(query: str) -> None:
    searched = search_words(expand_query(query, VOCABULARY))
    assert all(w.isalnum() and w == w.lower() for w in searched)
    assert len(searched) == len(set(searched))


@given(st.sampled_from(VOCABULARY.words), st.integers(min_value=3, max_value=12))
def test_any_prefix_of_an_indexed_word_finds_it(word: str, cut: int) -> None:
    prefix = word[:cut]
    term = expand(prefix, VOCABULARY)
    assert term.how == "exact" or word in term.alternatives or len(
        [w for w in VOCABULARY.words if w.startswith(prefix)]) > 12
