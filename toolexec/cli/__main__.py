"""`python -m toolexec.cli`: the `toolexec` command."""

from toolexec.cli.main import main

main()
