"""The command line of a Python child of ours: this interpreter running one of our
modules.

`-P` (Python 3.11+): the working directory is not put first on the child's
`sys.path`. With `python -m` it otherwise is, so a folder there named like one of our
top-level packages (`toolexec`, `domain`, `contracts`, `consumers`, `projections`: a
user's project often has a `domain/`) would be imported instead of ours, and a
checkout's code instead of the code the parent runs.
"""

from __future__ import annotations

import sys


def module_argv(module: str, *args: str) -> list[str]:
    """`python -P -m MODULE ARGS...` with the interpreter running this process."""
    return [sys.executable, "-P", "-m", module, *args]
