"""`toolexec bench`: performance figures, each against a baseline measured in the same run.

`command` is the CLI command and the scenario list; `env` builds the stack under test
(`stack`, `http` run as processes of their own); `pipeline`, `up`, `hotpath`,
`replay`, `sandbox` and `search` are the scenarios; `report` renders the table.
"""
