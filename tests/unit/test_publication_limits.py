from __future__ import annotations

import gzip
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.publication_limits import (
    PublicationLimits,
    PublicationTooLarge,
    inflate,
    packed_content,
)


@given(st.binary(max_size=4096))
def test_inflate_gives_back_what_was_compressed(content: bytes) -> None:
    inflated = inflate(gzip.compress(content), limit=len(content))
    assert inflated.content == content and inflated.size == len(content)
    assert inflated.sha256 == hashlib.sha256(content).hexdigest()


def test_inflate_stops_past_the_limit() -> None:
    with pytest.raises(PublicationTooLarge, match="more than 1000 bytes"):
        inflate(gzip.compress(bytes(10_000_000)), limit=1000)


def test_measuring_keeps_no_bytes() -> None:
    inflated = inflate(gzip.compress(b"abc"), limit=10, keep=False)
    assert inflated.content is None and inflated.size == 3


@pytest.mark.parametrize("packed", [b"not gzip", gzip.compress(b"abc")[:-4],
                                    gzip.compress(b"a") + gzip.compress(b"b")])
def test_anything_but_one_complete_gzip_member_is_refused(packed: bytes) -> None:
    with pytest.raises(PublicationTooLarge):
        inflate(packed, limit=100)


def test_packed_content_checks_size_and_sha256() -> None:
    sha = hashlib.sha256(b"abc").hexdigest()
    assert packed_content(gzip.compress(b"abc"), sha256=sha, size=3) == b"abc"
    with pytest.raises(PublicationTooLarge, match="more than 2 bytes"):
        packed_content(gzip.compress(b"abc"), sha256=sha, size=2)
    with pytest.raises(PublicationTooLarge, match="declares 4 bytes"):
        packed_content(gzip.compress(b"abc"), sha256=sha, size=4)
    with pytest.raises(Exception, match="sha256"):
        packed_content(gzip.compress(b"abd"), sha256=sha, size=3)


def test_declared_limits_count_files_and_add_up_sizes() -> None:
    limits = PublicationLimits(max_files=2, max_bytes=10)
    limits.check_declared([("a", 5), ("b", 5)])
    with pytest.raises(PublicationTooLarge, match="2-file limit"):
        limits.check_declared([("a", 0), ("b", 0), ("c", 0)])
    with pytest.raises(PublicationTooLarge, match="reached at 'b'"):
        limits.check_declared([("a", 6), ("b", 5)])
    with pytest.raises(PublicationTooLarge, match="negative"):
        limits.check_declared([("a", -1)])
