"""How a tool process ended, in the primitive's error codes.

E3402 timeout, E3403 out of memory, E3404 killed by a signal, E3407 resource limit,
E3401 any other failure; a sandbox that could not be set up (bwrap, the Landlock
wrapper or the egress relay failing before the tool started) raises E3405.

Out-of-memory heuristic (E3403), applied to a run that failed (non-zero exit or a
signal) and did not time out:
1. the last 4 KiB of stderr hold a well-known allocation-failure message: Python
   `MemoryError`, `Cannot allocate memory` (ENOMEM), C++ `std::bad_alloc`,
   `out of memory` (Go, Node, many C programs), Java `OutOfMemoryError`, Rust
   `memory allocation of N bytes failed`; or
2. a memory limit was set and the child died of SIGKILL that we did not send (under
   rlimits the only usual sender is the kernel's OOM killer); or
3. a memory limit was set, the child died of SIGSEGV/SIGBUS/SIGABRT (unchecked
   allocation failures) and its own peak RSS reached 75 % of the limit. Linux keeps
   the peak RSS of the address space a process leaves at exec, and a vfork child
   leaves ours, so `ru_maxrss` up to our own peak says nothing about the tool: only
   a peak above ours counts as the tool's.
A crash that meets none of these is E3404, so an ordinary segfault is not reported
as OOM; the cost is that a C program that crashes on a failed allocation of
untouched (virtual, not resident) memory is reported as a crash.
CPU time (SIGXCPU, or SIGKILL past the hard CPU limit) and file size (SIGXFSZ)
limits are reported as E3407.
Under bwrap and the namespace launcher a tool killed by signal N is seen as exit
status 128+N (their PID 1 reports it so) and is mapped back to the signal.
"""

from __future__ import annotations

import os
import re
import signal
from typing import Any

from consumers.primitives import landlock_exec
from consumers.primitives.tool_process import TAIL_BYTES, Capture, max_rss
from domain.errors import ExecutionError
from domain.model import ResourceLimits, SubprocessPlan

STDERR_TAIL_BYTES = 2048
_BWRAP_SETUP_FAILURE = b"bwrap: "
_OOM_RSS_FRACTION = 0.75
_OOM_MARKERS = re.compile(
    rb"\bMemoryError\b|Cannot allocate memory|std::bad_alloc|out of memory"
    rb"|OutOfMemoryError|memory allocation of \d+ bytes failed",
    re.IGNORECASE,
)
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT})


def unwrap_bwrap_status(status: int | None, stderr: Capture) -> int | None:
    """bwrap reports a tool killed by signal N as exit 128+N: give the signal back.
    A failure of bwrap itself (exit 1, "bwrap: ..." on stderr) raises E3405."""
    if status is None or not os.WIFEXITED(status):
        return status
    code = os.WEXITSTATUS(status)
    if code == 1 and bytes(stderr.data[:len(_BWRAP_SETUP_FAILURE)]) == _BWRAP_SETUP_FAILURE:
        raise ExecutionError("the bwrap sandbox could not be set up: "
                             + bytes(stderr.data[:500]).decode("utf-8", "replace").strip(),
                             code="E3405", details={"sandbox": "bwrap"})
    return unwrap_init_status(status)


def unwrap_init_status(status: int | None) -> int | None:
    """A sandbox's PID 1 (bwrap's, the namespace launcher's) reports a tool killed by
    signal N as exit 128+N: give the signal back."""
    if status is None or not os.WIFEXITED(status):
        return status
    code = os.WEXITSTATUS(status)
    if 128 < code < 128 + 65:
        return code - 128  # a raw wait status for "killed by signal code-128"
    return status


def check_landlock_setup(status: int | None, stderr: Capture) -> None:
    """The wrapper exits SETUP_FAILED with "landlock_exec: ..." when it could not
    restrict itself (the tool never started): E3405."""
    check_setup(status, stderr, landlock_exec.MESSAGE_PREFIX, "landlock")


def check_setup(status: int | None, stderr: Capture, prefix: bytes, sandbox: str) -> None:
    """A wrapper in front of the tool (landlock_exec, the egress relay) that failed
    before the tool started exits SETUP_FAILED with "<its name>: <why>": E3405."""
    if (status is not None and os.WIFEXITED(status)
            and os.WEXITSTATUS(status) == landlock_exec.SETUP_FAILED
            and bytes(stderr.data[:len(prefix)]) == prefix):
        raise ExecutionError(f"the {sandbox} sandbox could not be set up: "
                             + bytes(stderr.data[:500]).decode("utf-8", "replace").strip(),
                             code="E3405", details={"sandbox": sandbox})



def error_for(status: int | None, usage: Any, timed_out: bool, stderr: Capture,
               plan: SubprocessPlan, *, inherited_rss: int | None = None,
               ) -> dict[str, Any] | None:
    if timed_out:
        return _error("E3402", f"tool timed out after {plan.timeout_seconds:g}s; "
                      "its process group was killed", timeout_seconds=plan.timeout_seconds)
    if status is None:
        return _error("E3404", "the tool process vanished without an exit status")
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return None
    tail = stderr.tail(TAIL_BYTES)
    details: dict[str, Any] = {
        "exit_code": code,
        "stderr_tail": tail[-STDERR_TAIL_BYTES:].decode("utf-8", errors="replace"),
    }
    limit_error = _resource_limit_error(code, usage, plan.limits)
    if limit_error is not None:
        return limit_error | {"details": {**limit_error["details"], **details}}
    peak_rss = _own_peak_rss(usage, inherited_rss)
    if _out_of_memory(code, tail, peak_rss, plan.limits):
        return _error("E3403", "tool ran out of memory", memory_bytes=plan.limits.memory_bytes,
                      max_rss_bytes=peak_rss, **details)
    if code < 0:
        name = _signal_name(-code)
        return _error("E3404", f"tool was killed by {name}", signal=name, **details)
    return _error("E3401", f"tool exited with status {code}", **details)


def _resource_limit_error(code: int, usage: Any,
                          limits: ResourceLimits) -> dict[str, Any] | None:
    if code == -signal.SIGXFSZ:
        return _error("E3407", "tool exceeded its file size limit",
                      max_file_bytes=limits.max_file_bytes)
    cpu_spent = None if usage is None else usage.ru_utime + usage.ru_stime
    out_of_cpu = (limits.cpu_seconds is not None and cpu_spent is not None
                  and cpu_spent >= limits.cpu_seconds)
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and out_of_cpu):
        return _error("E3407", "tool exceeded its CPU time limit",
                      cpu_seconds=limits.cpu_seconds)
    return None


def _out_of_memory(code: int, stderr_tail: bytes, peak_rss: int | None,
                   limits: ResourceLimits) -> bool:
    """The heuristic of the module docstring."""
    if _OOM_MARKERS.search(stderr_tail):
        return True
    if limits.memory_bytes is None or code >= 0:
        return False
    if code == -signal.SIGKILL:
        return True
    return (-code in _CRASH_SIGNALS and peak_rss is not None
            and peak_rss >= _OOM_RSS_FRACTION * limits.memory_bytes)



def _own_peak_rss(usage: Any, inherited_rss: int | None) -> int | None:
    """The child's peak RSS, or None when it may be the one inherited from us."""
    peak = max_rss(usage)
    if peak is None or (inherited_rss is not None and peak <= inherited_rss):
        return None
    return peak


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _error(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"code": code, "message": message, "details": details}
