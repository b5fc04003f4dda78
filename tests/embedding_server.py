"""A small local OpenAI-compatible embeddings server for the tests (and the bench).

`POST /v1/embeddings` answers `{"data": [{"index", "embedding"}], "model"}` like the
real API. The vectors are a feature-hashing embedder, not a language model: each
word's stem and the letter trigrams of the word are hashed into `dimensions` signed
buckets and the vector is L2-normalised — texts sharing stems or spellings are close.
Run it alone with ``python -m tests.embedding_server [port]``.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from domain.search import stem, words

DIMENSIONS = 256


def embed(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    vector = [0.0] * dimensions
    for word in words(text):
        features = [f"s:{stem(word)}"] + [f"t:{g}" for g in _trigrams(word)]
        for feature, weight in zip(features, [2.0] + [0.5] * (len(features) - 1),
                                   strict=True):
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % dimensions
            vector[bucket] += weight if digest[4] & 1 else -weight
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def _trigrams(word: str) -> list[str]:
    padded = f"^{word}$"
    return [padded[i:i + 3] for i in range(len(padded) - 2)]


class _Handler(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path.rstrip("/") != "/v1/embeddings" or not isinstance(body.get("input"), list):
            self.send_response(404 if self.path.rstrip("/") != "/v1/embeddings" else 400)
            self.end_headers()
            return
        type(self).requests.append(body)
        dimensions = int(body.get("dimensions") or DIMENSIONS)
        answer = {"object": "list", "model": body.get("model"),
                  "data": [{"object": "embedding", "index": i, "embedding": embed(t, dimensions)}
                           for i, t in enumerate(body["input"])]}
        payload = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        return


class EmbeddingServer:
    """The server on 127.0.0.1 in a thread: `url` is its `/v1` base."""

    def __init__(self, port: int = 0) -> None:
        handler = type("Handler", (_Handler,), {"requests": []})  # requests per server
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self.requests: list[dict] = handler.requests

    def __enter__(self) -> EmbeddingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


if __name__ == "__main__":
    with EmbeddingServer(int(sys.argv[1]) if len(sys.argv) > 1 else 8089) as server:
        print(server.url, flush=True)
        threading.Event().wait()
