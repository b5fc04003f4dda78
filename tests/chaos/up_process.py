"""`toolexec up` as a separate process on a given broker, for tests that kill it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import IO

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from contracts.fact_signature import FactVerifier
from tests.waiting import START_WAIT

TOOLS = Path(__file__).parent / "tools"


def signing_key(state: Path) -> Path:
    """The Ed25519 key the pipelines of a test sign their facts with (one key shared by
    every replica whose state dir is beside `state`), made on first call."""
    path = state.parent / "facts.pem"
    if not path.exists():
        key = ed25519.Ed25519PrivateKey.generate()
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return path


def verifier_for(state: Path) -> FactVerifier:
    """A verifier trusting the facts `up` on `state` signs."""
    key = serialization.load_pem_private_key(signing_key(state).read_bytes(), password=None)
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    return FactVerifier([key.public_key()])


def start_up(bootstrap: str, state: Path, *, log: IO[bytes] | None = None,
             **settings: str) -> subprocess.Popen[bytes]:
    """Start `toolexec up` with the chaos tools, no authorization and rlimits only (the
    tools write to the host, outside any bubblewrap sandbox); `settings` are further
    `TOOLEXEC_*` variables by lower-case name (e.g. require_auth="true")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")}
    env.update(TOOLEXEC_KAFKA_BOOTSTRAP=bootstrap, TOOLEXEC_STATE_DIR=str(state),
               TOOLEXEC_REQUIRE_AUTH="false", TOOLEXEC_SANDBOX="rlimits",
               TOOLEXEC_FACT_SIGNING_KEY=str(signing_key(state)))
    env.update({f"TOOLEXEC_{name.upper()}": value for name, value in settings.items()})
    (state / "runtime.json").unlink(missing_ok=True)  # wait_until_up waits for the new one
    output = subprocess.DEVNULL if log is None else log
    return subprocess.Popen([sys.executable, "-m", "toolexec.cli", "up", "--tools", str(TOOLS)],
                            env=env, stdout=output,
                            stderr=subprocess.DEVNULL if log is None else subprocess.STDOUT)


async def wait_until_up(process: subprocess.Popen[bytes], state: Path) -> None:
    """Until `up` wrote its runtime file; fails if it exited first."""
    async with asyncio.timeout(START_WAIT):
        while not (state / "runtime.json").exists():
            assert process.poll() is None, "toolexec up exited"
            await asyncio.sleep(0.1)
