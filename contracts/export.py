"""Export the JSON Schema of every event contract to ``contracts/schemas/``, and the
E3xxx error registry to ``docs/errors.md``.

Run ``python -m contracts.export [DIRECTORY]`` after changing a model or an error code;
a test fails while the files on disk differ from the models and the registry.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from contracts.errors import ERROR_CODES, family_of
from contracts.events import EVENT_MODELS, dataschema_uri

SCHEMA_DIRECTORY: Final = Path(__file__).parent / "schemas"
JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
ERRORS_DOCUMENT: Final = Path(__file__).parent.parent / "docs" / "errors.md"


def schema_for(event_type: str) -> dict[str, Any]:
    """The JSON Schema of one event type's data, with ``$id``, ``$schema`` and title."""
    model = EVENT_MODELS[event_type]
    schema = model.model_json_schema()
    schema["$id"] = dataschema_uri(event_type, model.SCHEMA_VERSION)
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["title"] = event_type
    return schema


def render(event_type: str) -> str:
    """The exact text written for `event_type` (sorted keys, indent 2, final newline)."""
    return json.dumps(schema_for(event_type), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def schema_filename(event_type: str) -> str:
    """File name of an event type's schema, e.g. ``tool.published.schema.json``."""
    return f"{event_type}.schema.json"


def export_schemas(directory: Path | str = SCHEMA_DIRECTORY) -> list[Path]:
    """Write one ``<type>.schema.json`` per event type into `directory`; return the paths."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for event_type in sorted(EVENT_MODELS):
        path = target / schema_filename(event_type)
        path.write_text(render(event_type), encoding="utf-8")
        written.append(path)
    return written


def render_error_table() -> str:
    """docs/errors.md: every E3xxx code by family, with its HTTP status and what to do."""
    lines = ["# Error codes", "",
             "Every failure toolexec reports carries one of these codes: in a",
             "`tool.invoke.failed` event (`data.error.code`), an HTTP error body",
             "(`{\"error\": {\"code\", \"message\", \"details\"}}`, with the status below), an MCP",
             "tool error, a dead-letter record, and the CLI's `--json` output (exit 1).",
             "The message and `details` say what exactly was wrong; the code says what kind of",
             "failure it is. Generated from `contracts/errors.py` by `python -m contracts.export`.",
             ""]
    family = None
    for code in sorted(ERROR_CODES):
        info = ERROR_CODES[code]
        if family_of(code) != family:
            family = family_of(code)
            lines += [f"## {family.replace('_', ' ')}", "",
                      "| code | meaning | HTTP | what to do |", "|---|---|---|---|"]
        lines.append(f"| {code} | {_cell(info.title)} | {info.http_status} "
                     f"| {_cell(info.resolution)} |")
        if code == max(c for c in ERROR_CODES if family_of(c) == family):
            lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    """Command line: export into the given directory or ``contracts/schemas/``, and the
    error table into docs/errors.md."""
    args = sys.argv[1:] if argv is None else argv
    for path in export_schemas(Path(args[0]) if args else SCHEMA_DIRECTORY):
        sys.stdout.write(f"{path}\n")
    ERRORS_DOCUMENT.write_text(render_error_table(), encoding="utf-8")
    sys.stdout.write(f"{ERRORS_DOCUMENT}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
