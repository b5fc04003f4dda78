"""The `toolexec` command line: one module per group of commands, each an adapter over
the use cases (`toolexec.usecases`) that prints their answers (`output`). The
application and the console script's entry point are in `main`."""
