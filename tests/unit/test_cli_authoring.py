from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from toolexec.cli.authoring import register

EXAMPLES = Path(__file__).parents[2] / "examples" / "tools"

runner = CliRunner()


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    application = typer.Typer(no_args_is_help=True)
    register(application)
    return application


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def broken_tool(root: Path) -> Path:
    tool = root / "broken"
    write(tool / "tool.yaml", "tool_id: Broken\nversion: '1.0'\ntool_type: script\n"
                              "executor: python_runtime\nconfig: {entrypoint: app.py}\n")
    write(tool / "main.py", "def (:\n")
    return tool


# ----------------------------------------------------------------------- validate


def test_validate_examples_exits_zero(app: typer.Typer) -> None:
    result = runner.invoke(app, ["validate", str(EXAMPLES)])
    assert result.exit_code == 0, result.output
    assert "hello" in result.output


def test_validate_json_lists_every_example_tool(app: typer.Typer) -> None:
    result = runner.invoke(app, ["validate", str(EXAMPLES), "--json"])
    report = json.loads(result.stdout)
    assert report["valid"] is True
    assert {"hello", "word_stats", "greet_sh", "http_echo", "filesystem_mcp",
            "filesystem_read_file", "tool_protocol"} <= {t["tool_id"] for t in report["tools"]}


def test_broken_tool_exits_one_with_all_issues_in_json(app: typer.Typer, tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(broken_tool(tmp_path)), "--json"])
    assert result.exit_code == 1
    [tool] = json.loads(result.stdout)["tools"]
    assert sorted(i["path"] for i in tool["issues"]) == [
        "$.config.entrypoint", "$.files['main.py']", "$.tool_id", "$.version"]


def test_broken_tool_issues_are_printed_for_people(app: typer.Typer, tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(broken_tool(tmp_path))])
    assert result.exit_code == 1
    assert "$.config.entrypoint" in result.output and "invalid" in result.output


def test_unreadable_manifest_fails_validation(app: typer.Typer, tmp_path: Path) -> None:
    write(tmp_path / "bad.yaml", "tool_id: [\n")
    result = runner.invoke(app, ["validate", str(tmp_path), "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["unreadable"][0]["code"] == "E3105"


def test_validate_missing_path_is_bad_usage(app: typer.Typer, tmp_path: Path) -> None:
    assert runner.invoke(app, ["validate", str(tmp_path / "nope")]).exit_code == 2


def test_validate_directory_without_tools_is_bad_usage(app: typer.Typer, tmp_path: Path) -> None:
    assert runner.invoke(app, ["validate", str(tmp_path)]).exit_code == 2


# ---------------------------------------------------------------------- integrity


def test_integrity_is_stable_across_runs(app: typer.Typer) -> None:
    first = runner.invoke(app, ["integrity", str(EXAMPLES / "hello")])
    second = runner.invoke(app, ["integrity", str(EXAMPLES / "hello")])
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout
    assert first.stdout.startswith("sha256:") and len(first.stdout.strip()) == 7 + 64


def test_integrity_changes_when_a_file_byte_changes(app: typer.Typer, tmp_path: Path) -> None:
    tool = Path(shutil.copytree(EXAMPLES / "hello", tmp_path / "hello"))
    before = runner.invoke(app, ["integrity", str(tool), "--json"])
    main = tool / "main.py"
    main.write_bytes(main.read_bytes().replace(b"Hello", b"Hallo"))
    after = runner.invoke(app, ["integrity", str(tool), "--json"])
    assert json.loads(before.stdout)["integrity"] != json.loads(after.stdout)["integrity"]


def test_integrity_of_unreadable_source_exits_one(app: typer.Typer, tmp_path: Path) -> None:
    result = runner.invoke(app, ["integrity", str(write(tmp_path / "x.yaml", "a: [\n")), "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["error"]["code"] == "E3105"


# --------------------------------------------------------------------------- lock


def local_chain(root: Path) -> Path:
    """A self-contained chain: script -> runtime -> subprocess primitive."""
    tools = root / "tools"
    write(tools / "subprocess.yaml", "tool_id: subprocess\nversion: '1.0.0'\n"
                                     "tool_type: primitive\nexecutor: null\n")
    write(tools / "python_runtime.yaml", "tool_id: python_runtime\nversion: '1.0.0'\n"
                                         "tool_type: runtime\nexecutor: subprocess\n"
                                         "config: {command: python3}\n")
    shutil.copytree(EXAMPLES / "hello", tools / "hello")
    return tools


def test_lock_writes_a_lockfile_for_the_resolved_chain(app: typer.Typer, tmp_path: Path) -> None:
    out = tmp_path / "hello.lock.json"
    result = runner.invoke(app, ["lock", "hello@^1.0", "--tools", str(local_chain(tmp_path)),
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    lockfile = json.loads(out.read_text())
    assert "hello" in json.dumps(lockfile) and "python_runtime" in json.dumps(lockfile)


def test_lock_prints_the_lockfile_without_output_file(app: typer.Typer, tmp_path: Path) -> None:
    result = runner.invoke(app, ["lock", "hello", "--tools", str(local_chain(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "hello" in json.dumps(json.loads(result.stdout))


def test_lock_of_unknown_tool_exits_one_with_a_code(app: typer.Typer, tmp_path: Path) -> None:
    result = runner.invoke(app, ["lock", "no_such_tool", "--tools", str(local_chain(tmp_path)),
                                 "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["error"]["code"].startswith("E31")


def test_lock_with_missing_tools_dir_is_bad_usage(app: typer.Typer, tmp_path: Path) -> None:
    result = runner.invoke(app, ["lock", "hello", "--tools", str(tmp_path / "nope")])
    assert result.exit_code == 2
