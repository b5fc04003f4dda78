"""The servers agents and programs talk to, each an adapter over the use cases
(`toolexec.usecases`): the HTTP gateway (`http`: routes; `server`: uvicorn inside
`toolexec up`; `errors`, `models`, `access`, `body`: its answers, schemas, token
checks and body limits), the status page it serves (`status_page`), and the MCP
server (`mcp`). The HTTP gateway and the MCP server do not import each other."""
