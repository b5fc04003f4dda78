"""Hostile tool sources on disk: a YAML alias bomb, symlinked manifests and tool files
that point outside the tool. `toolexec validate` and `publish` refuse each with E3105,
quickly and in bounded memory, and never read through the link."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_process import clean_env

pytestmark = pytest.mark.security

MEMORY_CAP = 1024 * 1024 * 1024  # the bomb drove `validate` to 1.8 GB


def alias_bomb() -> str:
    """A few hundred bytes of YAML standing for 9**9 (387 million) strings."""
    lines = ['tool_id: bomb\nversion: "1.0.0"\ntool_type: api\nexecutor: http_client',
             'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def capped_toolexec(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`toolexec ARGS` with its address space capped, so a bomb fails the test instead
    of the machine."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    return subprocess.run([sys.executable, "-m", "toolexec.cli", *args], cwd=cwd,
                          env=clean_env(), capture_output=True, text=True, timeout=120,
                          preexec_fn=cap)


def test_validate_refuses_a_yaml_alias_bomb_fast(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    done = capped_toolexec("validate", str(bomb), "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    [error] = report["unreadable"]
    assert error["code"] == "E3105" and "expand" in error["message"]


def test_a_knowledge_entry_with_a_bomb_in_its_frontmatter_is_refused(tmp_path: Path) -> None:
    entry = tmp_path / "notes.md"
    entry.write_text("---\n" + alias_bomb().replace("tool_type: api", "tool_type: knowledge")
                     .replace("executor: http_client", "executor: null") + "---\n# Notes\n")
    done = capped_toolexec("validate", str(entry), "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "E3105" in done.stdout and "expand" in done.stdout


def test_validate_refuses_a_symlinked_manifest(tmp_path: Path) -> None:
    secret = tmp_path / "host" / "secret.yaml"
    secret.parent.mkdir()
    secret.write_text("tool_id: stolen\nroot_password: hunter2\n")
    tool = tmp_path / "tools" / "linked"
    tool.mkdir(parents=True)
    (tool / "tool.yaml").symlink_to(secret)
    done = capped_toolexec("validate", str(tool), "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert "symbolic link" in done.stdout and "hunter2" not in done.stdout + done.stderr


def test_validate_reports_a_symlinked_tool_in_a_tools_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("tool_id: elsewhere\n")
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "elsewhere.yaml").symlink_to(elsewhere)
    done = capped_toolexec("validate", str(tools), "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert "symbolic link" in done.stdout


def test_a_tool_file_linking_outside_the_tool_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "host" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    tool = tmp_path / "tools" / "leaky"
    tool.mkdir(parents=True)
    (tool / "tool.yaml").write_text('tool_id: leaky\nversion: "1.0.0"\ntool_type: script\n'
                                    "executor: python_runtime\nconfig: {entrypoint: main.py}\n")
    (tool / "main.py").write_text("print(open('key').read())\n")
    (tool / "key").symlink_to(secret)
    done = capped_toolexec("validate", str(tool), "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert "outside the tool directory" in done.stdout
    assert "PRIVATE KEY" not in done.stdout + done.stderr
