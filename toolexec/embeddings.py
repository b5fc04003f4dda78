"""The embeddings adapter: an OpenAI-compatible `/v1/embeddings` endpoint over httpx.

Implements `projections.search_vectors.EmbeddingPort`. Any failure (unreachable,
an error status, an answer of the wrong shape) is `EmbeddingError` (E3106): search
then ranks by full text alone and says so; the registry's vectors wait for the next try.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from domain.errors import ToolexecError
from toolexec.settings import Settings

TIMEOUT_S = 30.0


class EmbeddingError(ToolexecError):
    """The embeddings endpoint did not give one vector per text."""

    code = "E3106"


class OpenAIEmbeddings:
    """Vectors from an OpenAI-compatible endpoint (`POST {url}/embeddings`)."""

    def __init__(self, url: str, model: str, *, dimensions: int | None = None,
                 api_key: str | None = None, timeout: float = TIMEOUT_S) -> None:
        base = url.rstrip("/")
        self.url = base if base.endswith("/embeddings") else base + "/embeddings"
        self.model = model
        self.dimensions = dimensions
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        if not texts:
            return []
        body: dict[str, Any] = {"model": self.model, "input": list(texts)}
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        try:
            async with httpx.AsyncClient(timeout=self._timeout) as client:
                response = await client.post(self.url, json=body, headers=self._headers)
            response.raise_for_status()
            items = sorted(response.json()["data"], key=lambda item: item["index"])
            vectors = [[float(x) for x in item["embedding"]] for item in items]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
            raise EmbeddingError(f"embeddings endpoint {self.url}: {error}",
                                 details={"url": self.url}) from None
        if len(vectors) != len(texts) or len({len(v) for v in vectors}) > 1:
            raise EmbeddingError(f"embeddings endpoint {self.url} answered {len(vectors)} "
                                 f"vectors for {len(texts)} texts", details={"url": self.url})
        return vectors


def embedder_from_settings(settings: Settings) -> OpenAIEmbeddings | None:
    """The configured embeddings endpoint, or None when `embeddings_url` is not set."""
    if not settings.embeddings_url:
        return None
    key = None
    if settings.embeddings_key_file is not None:
        try:
            key = settings.embeddings_key_file.read_text().strip() or None
        except OSError as error:
            raise EmbeddingError(f"cannot read embeddings_key_file "
                                 f"{settings.embeddings_key_file}: {error.strerror}") from None
    return OpenAIEmbeddings(settings.embeddings_url, settings.embeddings_model,
                            dimensions=settings.embeddings_dimensions, api_key=key)
