"""The egress relay: the only way out of a sandbox's private network namespace.

A script tool whose network policy allows some hosts still runs in a network
namespace of its own (nothing but a loopback). This relay, started inside the
sandbox in front of the tool, listens on `127.0.0.1:PORT` of that namespace and
hands every accepted connection, as a file descriptor, over a unix socket pair
inherited from toolexec (`--channel FD`). Toolexec's egress proxy, outside the
sandbox, then reads the HTTP proxy request on that connection and decides
(consumers.primitives.egress_proxy). The relay itself decides nothing and moves no
bytes: a tool that kills or replaces it only loses its own network.

The tool finds the proxy through `HTTP_PROXY` / `HTTPS_PROXY` / `ALL_PROXY` (set by
the sandbox); a program that ignores them has no route anywhere.

Usage: `python -I -S egress_relay.py --channel FD --port PORT -- argv...`: binds the
listener, forks the relay loop into a child (stdio closed, killed with its parent),
and execs the tool in this process, so the tool keeps the pid, the exit status and
the signals the sandbox watches. Only the standard library; also imported by
`landlock_exec`, which calls `serve_then_exec` after restricting itself.
"""

from __future__ import annotations

import array
import os
import signal
import socket
import sys

SETUP_FAILED = 125
MESSAGE_PREFIX = b"egress_relay: "
DEFAULT_PORT = 3128
_PR_SET_PDEATHSIG = 1


def listen(port: int) -> socket.socket:
    """The relay's listener on the namespace's loopback."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    return listener


def serve_then_exec(listener: socket.socket, channel: int, argv: list[str],
                    program: str | None = None) -> None:
    """Fork the relay loop, then exec `argv` here (`program`, or argv[0] looked up on
    PATH) — never returns."""
    pid = os.fork()
    if pid == 0:
        _relay(listener, channel)
        os._exit(0)
    os.close(channel)
    listener.close()
    _exec(argv, program)


def _relay(listener: socket.socket, channel: int) -> None:
    _die_with_parent()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the tool's pipes must close when the tool exits
        os.dup2(devnull, fd)
    os.close(devnull)
    out = socket.socket(fileno=channel)
    while True:
        try:
            connection, _ = listener.accept()
        except InterruptedError:
            continue
        try:
            out.sendmsg([b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  array.array("i", [connection.fileno()]))])
        except OSError:  # toolexec closed its end: the run is over
            return
        finally:
            connection.close()


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (ImportError, OSError):  # the process group is killed at the end anyway
        pass
    if os.getppid() == 1:
        os._exit(0)


def _exec(argv: list[str], program: str | None) -> None:
    try:
        if program is None:
            os.execvp(argv[0], argv)
        else:
            os.execv(program, argv)
    except OSError as error:
        sys.stderr.buffer.write(f"{argv[0]}: {error.strerror}\n".encode())
        sys.stderr.flush()
        os._exit(127 if isinstance(error, FileNotFoundError) else 126)


def parse(argv: list[str]) -> tuple[int, int, list[str]]:
    """(channel fd, port, tool argv) of the relay's command line."""
    channel, port, rest = -1, DEFAULT_PORT, list(argv)
    while rest and rest[0] != "--":
        option = rest.pop(0)
        if not rest:
            raise ValueError(f"option {option} lacks a value")
        value = rest.pop(0)
        if option == "--channel":
            channel = int(value)
        elif option == "--port":
            port = int(value)
        else:
            raise ValueError(f"unknown option {option}")
    if channel < 0 or len(rest) < 2:
        raise ValueError("usage: --channel FD [--port PORT] -- argv...")
    return channel, port, rest[1:]


def main(argv: list[str]) -> None:
    try:
        channel, port, command = parse(argv)
        os.set_inheritable(channel, False)
        listener = listen(port)
    except (OSError, ValueError) as error:
        sys.stderr.buffer.write(MESSAGE_PREFIX + str(error).encode() + b"\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED)
    serve_then_exec(listener, channel, command)


if __name__ == "__main__":
    main(sys.argv[1:])
