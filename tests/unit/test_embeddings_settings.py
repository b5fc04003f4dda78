"""The embeddings adapter from the settings: off without a URL, the key from its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolexec.embeddings import EmbeddingError, OpenAIEmbeddings, embedder_from_settings
from toolexec.settings import Settings


def test_no_url_means_full_text_search_alone(tmp_path: Path) -> None:
    assert embedder_from_settings(Settings(state_dir=tmp_path, embeddings_url="")) is None


def test_the_endpoint_path_model_dimensions_and_key_come_from_the_settings(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    embedder = embedder_from_settings(Settings(
        state_dir=tmp_path, embeddings_url="http://127.0.0.1:9/v1/", embeddings_model="m",
        embeddings_dimensions=64, embeddings_key_file=key))
    assert isinstance(embedder, OpenAIEmbeddings)
    assert (embedder.url, embedder.model, embedder.dimensions) == (
        "http://127.0.0.1:9/v1/embeddings", "m", 64)
    assert embedder._headers == {"Authorization": "Bearer sk-test"}


def test_an_unreadable_key_file_is_E3106(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingError) as raised:
        embedder_from_settings(Settings(state_dir=tmp_path, embeddings_url="http://x/v1",
                                        embeddings_key_file=tmp_path / "missing"))
    assert raised.value.code == "E3106"


async def test_an_unreachable_endpoint_is_E3106() -> None:
    with pytest.raises(EmbeddingError) as raised:
        await OpenAIEmbeddings("http://127.0.0.1:9/v1", "m", timeout=2).embed(["text"])
    assert raised.value.code == "E3106" and raised.value.details["url"].endswith("/embeddings")
