"""What a user can do with toolexec, whatever the front end: invoke, publish, lock and
sign (authoring), change a lifecycle, cancel, apply a policy, read the audit trail.

Each use case returns values or raises a `ToolexecError` (domain/errors.py) and never
prints: the CLI (`toolexec.cli`), the HTTP gateway and the MCP server
(`toolexec.gateway`) are adapters that turn those into their own answers, so the same
input gets the same code everywhere.
"""
