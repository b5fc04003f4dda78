"""A small S3-compatible object store for tests (standard library only).

Tansu's `s3://` storage engine keeps topics, records, offsets and group state as
objects; with this server running outside the broker, a broker restart keeps its
log. It implements the subset of the S3 API Tansu's object store client uses:
PUT (with `If-None-Match: *` / `If-Match: <etag>` conditional writes and
`x-amz-copy-source` copies), GET (with `Range`), HEAD, DELETE, multi-object delete
and ListObjectsV2. Objects live in memory; no signature is checked.

What Tansu 0.6 does with it (measured): every produced batch is one object written
with `If-None-Match: *`, and each partition's `watermark.json` is updated with
`If-Match: <etag>`; ListOffsets(latest) lists a partition's records and takes the
newest object by LastModified (hence the distinct, ordered times below); a fetch
answers empty when its object reads outlast the fetch's max wait, so clients of an
s3 broker need a fetch wait of ~100 ms rather than 5 ms. The endpoint and
credentials come from AWS_* variables (`tansu_s3_env`).
"""

from __future__ import annotations

import hashlib
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


@dataclass
class StoredObject:
    body: bytes
    etag: str
    modified: datetime


@dataclass
class ObjectStore:
    """Buckets of objects shared by every request handler thread."""

    objects: dict[tuple[str, str], StoredObject] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: list[str] = field(default_factory=list)
    record_requests: bool = False

    last_modified: datetime = datetime.min.replace(tzinfo=UTC)

    def put(self, bucket: str, key: str, body: bytes) -> StoredObject:
        # Tansu takes the newest object of a partition as its end (ListOffsets latest),
        # so modification times are distinct and ordered like the writes.
        self.last_modified = max(datetime.now(UTC),
                                 self.last_modified + timedelta(milliseconds=1))
        stored = StoredObject(body, f'"{hashlib.md5(body).hexdigest()}"',  # noqa: S324 - S3 ETag
                              self.last_modified)
        self.objects[(bucket, key)] = stored
        return stored


class S3Handler(BaseHTTPRequestHandler):
    server: S3Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        return

    # -- request parsing --------------------------------------------------------------

    def _target(self) -> tuple[str, str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        path = unquote(parts.path).lstrip("/")
        bucket, _, key = path.partition("/")
        return bucket, key, parse_qs(parts.query, keep_blank_values=True)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("x-amz-content-sha256", "").startswith("STREAMING-"):
            body = _dechunk(body)
        return body

    def _note(self, bucket: str, key: str, query: dict[str, list[str]]) -> None:
        store = self.server.store
        if store.record_requests:
            conditions = {h: self.headers[h] for h in ("If-Match", "If-None-Match", "Range",
                                                       "x-amz-copy-source") if self.headers[h]}
            store.requests.append(f"{self.command} {bucket}/{key} {query} {conditions}")

    # -- responses --------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              *, content_type: str = "application/xml") -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if body or self.command != "HEAD":
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
        self._send(status, body if self.command != "HEAD" else b"")

    @staticmethod
    def _object_headers(stored: StoredObject) -> dict[str, str]:
        return {"ETag": stored.etag, "Last-Modified": format_datetime(stored.modified, usegmt=True)}

    # -- methods ----------------------------------------------------------------------

    def do_PUT(self) -> None:  # noqa: N802 - http.server naming
        bucket, key, query = self._target()
        self._note(bucket, key, query)
        body = self._body()
        store = self.server.store
        if not key:  # create bucket
            self._send(200)
            return
        with store.lock:
            current = store.objects.get((bucket, key))
            if_none = self.headers.get("If-None-Match")
            if_match = self.headers.get("If-Match")
            if if_none == "*" and current is not None:
                self._error(412, "PreconditionFailed")
                return
            if if_match is not None and (current is None or current.etag != if_match):
                self._error(412 if current is not None else 404,
                            "PreconditionFailed" if current is not None else "NoSuchKey")
                return
            source = self.headers.get("x-amz-copy-source")
            if source is not None:
                src_bucket, _, src_key = unquote(source).lstrip("/").partition("/")
                found = store.objects.get((src_bucket, src_key))
                if found is None:
                    self._error(404, "NoSuchKey")
                    return
                stored = store.put(bucket, key, found.body)
                result = (f'<CopyObjectResult xmlns="{S3_NS}"><ETag>{escape(stored.etag)}</ETag>'
                          f"<LastModified>{_iso(stored.modified)}</LastModified>"
                          "</CopyObjectResult>").encode()
                self._send(200, result, self._object_headers(stored))
                return
            stored = store.put(bucket, key, body)
        self._send(200, b"", self._object_headers(stored))

    def do_GET(self) -> None:  # noqa: N802
        bucket, key, query = self._target()
        self._note(bucket, key, query)
        if not key:
            self._list(bucket, query)
            return
        self._get_object(bucket, key)

    def do_HEAD(self) -> None:  # noqa: N802
        bucket, key, query = self._target()
        self._note(bucket, key, query)
        self._get_object(bucket, key)

    def _get_object(self, bucket: str, key: str) -> None:
        store = self.server.store
        with store.lock:
            stored = store.objects.get((bucket, key))
        if stored is None:
            self._error(404, "NoSuchKey")
            return
        headers = self._object_headers(stored)
        if_match = self.headers.get("If-Match")
        if if_match is not None and if_match != stored.etag:
            self._error(412, "PreconditionFailed")
            return
        if_none = self.headers.get("If-None-Match")
        if if_none is not None and if_none in (stored.etag, "*"):
            self._send(304, b"", headers)
            return
        body = stored.body
        byte_range = self.headers.get("Range")
        if byte_range and byte_range.startswith("bytes="):
            start_text, _, end_text = byte_range[6:].partition("-")
            if start_text:
                start = int(start_text)
                end = int(end_text) if end_text else len(body) - 1
            else:  # suffix range: the last N bytes
                start, end = max(len(body) - int(end_text), 0), len(body) - 1
            end = min(end, len(body) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
            self._send(206, body[start:end + 1], headers, content_type="application/octet-stream")
            return
        self._send(200, body, headers, content_type="application/octet-stream")

    def do_DELETE(self) -> None:  # noqa: N802
        bucket, key, query = self._target()
        self._note(bucket, key, query)
        store = self.server.store
        with store.lock:
            store.objects.pop((bucket, key), None)
        self._send(204)

    def do_POST(self) -> None:  # noqa: N802
        bucket, key, query = self._target()
        self._note(bucket, key, query)
        body = self._body()
        if "delete" not in query:
            self._error(501, "NotImplemented")
            return
        root = ET.fromstring(body)  # noqa: S314 - test input from our own broker
        deleted = []
        store = self.server.store
        with store.lock:
            for element in root.iter():
                if element.tag.endswith("Key") and element.text:
                    store.objects.pop((bucket, element.text), None)
                    deleted.append(element.text)
        result = "".join(f"<Deleted><Key>{escape(k)}</Key></Deleted>" for k in deleted)
        self._send(200, f'<DeleteResult xmlns="{S3_NS}">{result}</DeleteResult>'.encode())

    def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        after = query.get("continuation-token", query.get("start-after", [""]))[0]
        limit = int(query.get("max-keys", ["1000"])[0])
        store = self.server.store
        with store.lock:
            keys = sorted((k, o) for (b, k), o in store.objects.items()
                          if b == bucket and k.startswith(prefix) and k > after)
        contents: list[str] = []
        prefixes: list[str] = []
        last = ""
        truncated = False
        for key, stored in keys:
            if len(contents) + len(prefixes) >= limit:
                truncated = True
                break
            rest = key[len(prefix):]
            if delimiter and delimiter in rest:
                common = prefix + rest.split(delimiter, 1)[0] + delimiter
                if common not in prefixes:
                    prefixes.append(common)
                last = key
                continue
            contents.append(
                f"<Contents><Key>{escape(key)}</Key><LastModified>{_iso(stored.modified)}"
                f"</LastModified><ETag>{escape(stored.etag)}</ETag><Size>{len(stored.body)}"
                "</Size><StorageClass>STANDARD</StorageClass></Contents>")
            last = key
        token = f"<NextContinuationToken>{escape(last)}</NextContinuationToken>" if truncated else ""
        body = (f'<ListBucketResult xmlns="{S3_NS}"><Name>{escape(bucket)}</Name>'
                f"<Prefix>{escape(prefix)}</Prefix><KeyCount>{len(contents) + len(prefixes)}"
                f"</KeyCount><MaxKeys>{limit}</MaxKeys>"
                f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{token}"
                + "".join(contents)
                + "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>"
                          for p in prefixes)
                + "</ListBucketResult>")
        self._send(200, body.encode())


class S3Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: ObjectStore) -> None:
        super().__init__(address, S3Handler)
        self.store = store


@contextmanager
def s3_store(*, record_requests: bool = False) -> Iterator[tuple[str, ObjectStore]]:
    """Serve an in-memory object store on a free loopback port; yields (endpoint, store)."""
    store = ObjectStore(record_requests=record_requests)
    server = S3Server(("127.0.0.1", 0), store)
    thread = threading.Thread(target=server.serve_forever, name="s3-store", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()


def tansu_s3_env(endpoint: str) -> dict[str, str]:
    """Environment for a Tansu broker whose `s3://` storage is the store at `endpoint`."""
    return {"AWS_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true"}


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _dechunk(body: bytes) -> bytes:
    """Decode an aws-chunked upload body (`<hex size>;chunk-signature=...\\r\\n<data>\\r\\n`)."""
    out = bytearray()
    rest = body
    while rest:
        header, _, rest = rest.partition(b"\r\n")
        size = int(header.split(b";", 1)[0], 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return bytes(out)
