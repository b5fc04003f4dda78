"""Export of the audit trail for a third party, and its offline verification.

An export is JSON Lines (UTF-8, one ``\\n`` after every line):

1. a header: ``{"format": "toolexec-audit-export/1", "exported_at": ..., "genesis": ...}``;
2. one line per audit record, chain by chain (topic, partition), in offset order:
   ``{"document": <the redacted CloudEvent>, <every HASHED_COLUMNS column>,
   "prev_hash", "hash", "signature"}``. ``signature`` is the folding process's verdict
   on the fact's pipeline signature (information only: it is outside the chain);
3. the checkpoint: ``{"checkpoint": C}`` or, signed, ``{"checkpoint": C, "kid": K,
   "signature": S}``, where C is ``{"format", "exported_at", "records", "chains":
   [{"topic", "partition", "last_offset", "hash", "records"}], "digest"}``, ``digest``
   is the sha256 (hex) of every byte of the lines before it, K the signing key's id
   (`contracts.fact_signature.key_id`) and S the Ed25519 signature (unpadded
   base64url) over the RFC 8785 canonical JSON of the line without ``signature``
   (``{"checkpoint": C, "kid": K}``).

Each record holds when its ``prev_hash`` is its predecessor's hash (`GENESIS` for the
first of a chain) and its ``hash`` is `chain_hash` of it, as `audit verify` checks the
database; each chain must end where the checkpoint says. The verifier needs the file
and the public key only: no database, no broker.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from contracts.fact_signature import key_id
from domain.canonical_json import canonical_json
from projections.audit_document import GENESIS, HASHED_COLUMNS, _chain_hash, chain_hash
from projections.tables import audit_heads, audit_log

FORMAT: Final = "toolexec-audit-export/1"
EXPORT_ROWS: Final = 5000
"""Rows fetched per round trip while exporting."""
_OTHER_COLUMNS: Final = (*HASHED_COLUMNS, "prev_hash", "hash", "signature")


# --- export -------------------------------------------------------------------------------


class ExportBroken(Exception):
    """The trail does not hold (a record or a chain head): it is not exported."""

    def __init__(self, topic: str, partition: int, offset: int | None, reason: str) -> None:
        super().__init__(f"{topic}/{partition}@{offset}: {reason}")
        self.topic, self.partition, self.offset, self.reason = topic, partition, offset, reason


@dataclass(slots=True)
class _Chain:
    last_offset: int = -1
    hash: str = GENESIS
    records: int = 0


@dataclass(slots=True)
class ExportWriter:
    """Builds the lines of one export (pure): `header`, then `record` for every row in
    chain order, then `checkpoint`. Each record is checked as it goes (the fast path of
    `audit verify`): a trail that does not hold is refused with `ExportBroken`."""

    exported_at: str
    _digest: Any = field(default_factory=hashlib.sha256)
    _chains: dict[tuple[str, int], _Chain] = field(default_factory=dict)
    _records: int = 0

    def _line(self, body: bytes) -> bytes:
        line = body + b"\n"
        self._digest.update(line)
        return line

    def header(self) -> bytes:
        return self._line(orjson.dumps({"format": FORMAT, "exported_at": self.exported_at,
                                        "genesis": GENESIS}))

    def record(self, row: Mapping[str, Any]) -> bytes:
        place = (row["topic"], row["partition"])
        chain = self._chains.setdefault(place, _Chain())
        if row["prev_hash"] != chain.hash or row["offset"] <= chain.last_offset:
            raise ExportBroken(*place, row["offset"], "prev_hash does not match the previous "
                               "record (a record was removed or reordered)")
        text = row["document"].encode("utf-8")
        if _chain_hash(chain.hash, row, text) != row["hash"]:
            # Not the canonical text it was written as: whitespace only, or a change.
            try:
                document = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise ExportBroken(*place, row["offset"],
                                   "document is not JSON (the record was modified)") from None
            if chain_hash(chain.hash, row, document) != row["hash"]:
                raise ExportBroken(*place, row["offset"], "hash does not match the record's "
                                   "contents (the record was modified)")
            text = canonical_json(document)
        rest = orjson.dumps({name: row[name] for name in _OTHER_COLUMNS})
        chain.last_offset, chain.hash = row["offset"], row["hash"]
        chain.records += 1
        self._records += 1
        return self._line(b'{"document":' + text + b"," + rest[1:])

    def chains(self) -> list[dict[str, Any]]:
        return [{"topic": topic, "partition": partition, "last_offset": chain.last_offset,
                 "hash": chain.hash, "records": chain.records}
                for (topic, partition), chain in sorted(self._chains.items())]

    def checkpoint(self, signing_key: Ed25519PrivateKey | None = None) -> bytes:
        """The last line; signed with `signing_key` when given."""
        body: dict[str, Any] = {"checkpoint": {
            "format": FORMAT, "exported_at": self.exported_at, "records": self._records,
            "chains": self.chains(), "digest": self._digest.hexdigest()}}
        if signing_key is not None:
            body["kid"] = key_id(signing_key.public_key())
            signature = signing_key.sign(canonical_json(body))
            body["signature"] = base64.urlsafe_b64encode(signature).rstrip(b"=").decode()
        return orjson.dumps(body) + b"\n"


ExportProgress = Callable[[int, int], None]


async def export_audit(conn: AsyncConnection, exported_at: str, *,
                       signing_key: Ed25519PrivateKey | None = None,
                       progress: ExportProgress | None = None) -> AsyncIterator[bytes]:
    """The lines of a full export of the trail, a block of rows at a time.

    The checkpoint is the chain heads read first: rows appended meanwhile (past a head,
    or of a chain begun since) are left for the next export. Raises
    `ExportBroken` when a record or a head does not hold (`audit verify` names all)."""
    heads = {(r.topic, r.partition): (r.last_offset, r.hash, r.records)
             for r in await conn.execute(select(audit_heads))}
    announced = sum(int(head[2]) for head in heads.values())
    writer = ExportWriter(exported_at)
    yield writer.header()
    query = (select(audit_log)
             .order_by(audit_log.c.topic, audit_log.c.partition, audit_log.c.offset)
             .execution_options(yield_per=EXPORT_ROWS))
    headless: dict[tuple[str, int], int] = {}
    result = await conn.stream(query)
    try:
        async for rows in result.mappings().partitions():
            for row in rows:
                if (row["topic"], row["partition"]) not in heads:
                    headless.setdefault((row["topic"], row["partition"]), row["offset"])
            lines = [writer.record(row) for row in rows
                     if (row["topic"], row["partition"]) in heads
                     and row["offset"] <= heads[(row["topic"], row["partition"])][0]]
            yield b"".join(lines)
            if progress is not None:
                progress(writer._records, max(announced, writer._records))
    finally:
        await result.close()
    if headless:  # a chain begun since the heads were read has a head by now
        now = {(r.topic, r.partition) for r in await conn.execute(
            select(audit_heads.c.topic, audit_heads.c.partition))}
        for (topic, partition), offset in sorted(headless.items()):
            if (topic, partition) not in now:
                raise ExportBroken(topic, partition, offset, "chain has no head record")
    ends = {(c["topic"], c["partition"]): (c["last_offset"], c["hash"], c["records"])
            for c in writer.chains()}
    for (topic, partition), head in sorted(heads.items()):
        if ends.get((topic, partition)) != head:
            end = ends.get((topic, partition))
            raise ExportBroken(topic, partition, head[0],
                               f"chain ends at offset {end[0] if end else None} after "
                               f"{end[2] if end else 0} record(s) but its head names offset "
                               f"{head[0]} after {head[2]} (records deleted or head edited)")
    yield writer.checkpoint(signing_key)


# --- offline verification -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExportProblem:
    """The first thing in an export that does not hold."""

    line: int
    reason: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "topic": self.topic, "partition": self.partition,
                "offset": self.offset, "reason": self.reason}

    def __str__(self) -> str:
        where = (f" ({self.topic}/{self.partition}@{self.offset})"
                 if self.topic is not None else "")
        return f"line {self.line}{where}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ExportVerification:
    """Outcome of verifying an export: how much was walked, what was signed, and the
    first problem (None: every chain, the checkpoint, the digest and, when keys were
    given, the signature hold)."""

    records: int
    chains: int
    exported_at: str | None
    kid: str | None
    signature_checked: bool
    problem: ExportProblem | None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "records": self.records, "chains": self.chains,
                "exported_at": self.exported_at, "kid": self.kid,
                "signature_checked": self.signature_checked,
                "problem": None if self.problem is None else self.problem.as_dict()}


class _Stop(Exception):
    def __init__(self, problem: ExportProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


_INT_FIELDS: Final = ("partition", "offset", "redactions")
_TEXT_FIELDS: Final = ("topic", "event_id", "type", "time", "prev_hash", "hash")


def verify_export(lines: Iterable[bytes],
                  public_keys: Sequence[Ed25519PublicKey] = ()) -> ExportVerification:
    """Verify an export read as `lines` (bytes, each with its ``\\n``, e.g. a file opened
    in binary mode). With `public_keys`, the checkpoint must be signed by one of them;
    without, the signature is not checked (the chains, checkpoint and digest are)."""
    state = _Walk()
    try:
        state.walk(lines, public_keys)
    except _Stop as stop:
        return state.outcome(stop.problem, bool(public_keys))
    return state.outcome(None, bool(public_keys))


@dataclass(slots=True)
class _Walk:
    chains: dict[tuple[str, int], _Chain] = field(default_factory=dict)
    records: int = 0
    exported_at: str | None = None
    kid: str | None = None

    def outcome(self, problem: ExportProblem | None, checked: bool) -> ExportVerification:
        return ExportVerification(self.records, len(self.chains), self.exported_at, self.kid,
                                  checked and problem is None, problem)

    def walk(self, lines: Iterable[bytes], public_keys: Sequence[Ed25519PublicKey]) -> None:
        digest = hashlib.sha256()
        pending: bytes | None = None
        number = 0
        for line in lines:
            if pending is not None:
                if number == 1:
                    self.header(pending)
                else:
                    self.record(number, pending)
                digest.update(pending)
            pending, number = line, number + 1
        if pending is None:
            raise _Stop(ExportProblem(1, "the export is empty"))
        if number == 1:
            self.header(pending)
            raise _Stop(ExportProblem(1, "no checkpoint line (the export is truncated)"))
        self.checkpoint(number, pending, digest.hexdigest(), public_keys)

    def header(self, line: bytes) -> None:
        header = _json_object(1, line)
        if header.get("format") != FORMAT:
            raise _Stop(ExportProblem(1, f"not a {FORMAT} export (format "
                                         f"{header.get('format')!r})"))
        if header.get("genesis", GENESIS) != GENESIS:
            raise _Stop(ExportProblem(1, "the header names another genesis hash"))
        self.exported_at = header.get("exported_at")

    def record(self, number: int, line: bytes) -> None:
        row = _json_object(number, line)
        if "checkpoint" in row:
            raise _Stop(ExportProblem(number, "a checkpoint before the last line (lines were "
                                              "appended after it)"))
        missing = [name for name in ("document", *HASHED_COLUMNS, "prev_hash", "hash")
                   if name not in row]
        if missing:
            raise _Stop(ExportProblem(number, f"record lacks {', '.join(missing)}"))
        bad = [name for name in _INT_FIELDS
               if not isinstance(row[name], int) or isinstance(row[name], bool)]
        bad += [name for name in _TEXT_FIELDS if not isinstance(row[name], str)]
        if bad:
            raise _Stop(ExportProblem(number, f"record has a wrong type for {', '.join(bad)}",
                                      _text_or_none(row["topic"]), None, None))
        place = (row["topic"], row["partition"])
        chain = self.chains.setdefault(place, _Chain())

        def problem(reason: str) -> _Stop:
            return _Stop(ExportProblem(number, reason, row["topic"], row["partition"],
                                       row["offset"]))

        if row["prev_hash"] != chain.hash:
            raise problem("prev_hash does not match the previous record of its chain (a "
                          "record was removed, inserted or reordered)")
        if row["offset"] <= chain.last_offset:
            raise problem(f"offset does not follow {chain.last_offset} (records reordered)")
        try:
            computed = chain_hash(chain.hash, row, row["document"])
        except (TypeError, ValueError) as error:
            raise problem(f"document cannot be canonicalised: {error}") from None
        if computed != row["hash"]:
            raise problem("hash does not match the record's contents (the record was "
                          "modified)")
        chain.last_offset, chain.hash = row["offset"], row["hash"]
        chain.records += 1
        self.records += 1

    def checkpoint(self, number: int, line: bytes, digest: str,
                   public_keys: Sequence[Ed25519PublicKey]) -> None:
        body = _json_object(number, line)
        checkpoint = body.get("checkpoint")
        if not isinstance(checkpoint, dict):
            raise _Stop(ExportProblem(number, "the last line is not a checkpoint (the export "
                                              "is truncated)"))
        self.kid = body.get("kid") if isinstance(body.get("kid"), str) else None
        if checkpoint.get("format") != FORMAT:
            raise _Stop(ExportProblem(number, "the checkpoint names another format"))
        if checkpoint.get("exported_at") != self.exported_at:
            raise _Stop(ExportProblem(number, "the checkpoint's exported_at differs from the "
                                              "header's"))
        if checkpoint.get("digest") != digest:
            raise _Stop(ExportProblem(number, "digest does not match the lines before the "
                                              "checkpoint (lines were changed, added, removed "
                                              "or reordered)"))
        if checkpoint.get("records") != self.records:
            raise _Stop(ExportProblem(number, f"the checkpoint counts "
                                              f"{checkpoint.get('records')} record(s), the "
                                              f"export holds {self.records}"))
        self.chain_ends(number, checkpoint.get("chains"))
        if public_keys:
            self.signature(number, body, public_keys)

    def chain_ends(self, number: int, chains: Any) -> None:
        if not isinstance(chains, list) or not all(isinstance(c, dict) for c in chains):
            raise _Stop(ExportProblem(number, "the checkpoint's chains are not a list"))
        named: dict[tuple[Any, Any], dict[str, Any]] = {
            (c.get("topic"), c.get("partition")): c for c in chains}
        if len(named) != len(chains):
            raise _Stop(ExportProblem(number, "the checkpoint names a chain twice"))
        for place in sorted(self.chains.keys() | named.keys(), key=repr):
            walked, end = self.chains.get(place), named.get(place)
            topic, partition = _text_or_none(place[0]), place[1]
            if end is None:
                raise _Stop(ExportProblem(number, "the checkpoint does not name this chain",
                                          topic, partition, None))
            if walked is None:
                raise _Stop(ExportProblem(number, "the checkpoint names a chain the export "
                                                  "does not hold (records removed)",
                                          topic, partition, end.get("last_offset")))
            if (end.get("last_offset"), end.get("hash"), end.get("records")) != (
                    walked.last_offset, walked.hash, walked.records):
                raise _Stop(ExportProblem(
                    number, f"chain ends at offset {walked.last_offset} after "
                            f"{walked.records} record(s) but the checkpoint names offset "
                            f"{end.get('last_offset')} after {end.get('records')} (records "
                            "removed or checkpoint edited)",
                    topic, partition, end.get("last_offset")))

    def signature(self, number: int, body: dict[str, Any],
                  public_keys: Sequence[Ed25519PublicKey]) -> None:
        signature = body.get("signature")
        if self.kid is None or not isinstance(signature, str):
            raise _Stop(ExportProblem(number, "the export is not signed (a signature is "
                                              "required with a public key)"))
        keys = {key_id(key): key for key in public_keys}
        key = keys.get(self.kid)
        if key is None:
            raise _Stop(ExportProblem(number, f"signed by key {self.kid}, not by the given "
                                              f"public key ({', '.join(sorted(keys))})"))
        try:
            raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
            key.verify(raw, canonical_json({k: v for k, v in body.items()
                                            if k != "signature"}))
        except (InvalidSignature, binascii.Error, ValueError):
            raise _Stop(ExportProblem(number, "signature does not verify (the checkpoint "
                                              "was changed after signing)")) from None


def _json_object(number: int, line: bytes) -> dict[str, Any]:
    if not line.endswith(b"\n"):
        raise _Stop(ExportProblem(number, "line does not end with a newline (the export is "
                                          "truncated)"))
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        raise _Stop(ExportProblem(number, f"not JSON: {error}")) from None
    if not isinstance(value, dict):
        raise _Stop(ExportProblem(number, "not a JSON object"))
    return value


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
