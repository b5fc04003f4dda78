"""The bench measures a process tree's CPU whole: live descendants and reaped ones."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

from toolexec.bench.env import cpu_seconds, tree_cpu_seconds

BURN = "x = 0\nfor i in range(3_000_000): x += i\n"
TICK = 1 / os.sysconf("SC_CLK_TCK")


def test_a_reaped_child_stays_in_its_parents_tree() -> None:
    before = tree_cpu_seconds(os.getpid())
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", BURN], check=True)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (children.ru_utime - children_before.ru_utime
                 + children.ru_stime - children_before.ru_stime)
    after = tree_cpu_seconds(os.getpid())
    assert before is not None and after is not None and child_cpu > 0
    assert after - before >= child_cpu - 2 * TICK


def test_a_live_grandchild_counts_in_the_tree() -> None:
    # a child that starts a grandchild which burns, then waits on stdin with it alive
    script = ("import subprocess, sys\n"
              f"g = subprocess.Popen([sys.executable, '-c', {BURN + 'input()'!r}],"
              " stdin=subprocess.PIPE)\n"
              "print(g.pid, flush=True)\n"
              "sys.stdin.readline()\n"
              "g.stdin.close(); g.wait()\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        grandchild = int(child.stdout.readline())
        own = cpu_seconds(grandchild)
        tree = tree_cpu_seconds(child.pid)
        assert own is not None and tree is not None
        assert tree >= own + (cpu_seconds(child.pid) or 0.0) - TICK
        assert tree_cpu_seconds(2**22 + 1) is None  # no such process
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(60)
