from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from domain.model import ToolSource
from domain.publication_limits import PublicationLimits
from toolexec.sources import (
    SourceError,
    bash_syntax_check,
    collect_sources,
    discover,
    discover_project_tools,
    load_builtin_sources,
    load_source,
    manifest_schema_text,
    shadow,
    write_manifest_schema,
)

TOOL_YAML = """\
tool_id: {tool_id}
version: "{version}"
tool_type: script
executor_id: python_runtime
config:
  entrypoint: main.py
parameters:
  - name: text
    type: string
    required: true
"""


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def script_dir(root: Path, tool_id: str = "echo", version: str = "1.0.0") -> Path:
    tool = root / tool_id
    write(tool / "tool.yaml", TOOL_YAML.format(tool_id=tool_id, version=version))
    write(tool / "main.py", "print('{}')\n")
    return tool


def sources_of(found: list[ToolSource | SourceError]) -> list[ToolSource]:
    assert not [f for f in found if isinstance(f, SourceError)]
    return [f for f in found if isinstance(f, ToolSource)]


# ----------------------------------------------------------------- directory layout


def test_directory_tool_holds_every_file_but_the_manifest(tmp_path: Path) -> None:
    tool = script_dir(tmp_path)
    write(tool / "lib" / "util.py", "X = 1\n")
    write(tool / "__pycache__" / "main.cpython-311.pyc", b"\0")
    write(tool / ".git" / "HEAD", "ref\n")
    source = load_source(tool)
    assert [f.path for f in source.files] == ["lib/util.py", "main.py"]
    assert source.layout == "directory"


def test_directory_tool_files_carry_sha256_content_and_mode(tmp_path: Path) -> None:
    tool = script_dir(tmp_path)
    script = write(tool / "run.sh", "echo hi\n")
    script.chmod(0o755)
    files = {f.path: f for f in load_source(tool).files}
    assert files["run.sh"].is_executable and not files["main.py"].is_executable
    assert files["run.sh"].sha256 == hashlib.sha256(b"echo hi\n").hexdigest()
    assert files["run.sh"].content == b"echo hi\n"


def test_manifest_is_normalised_on_load(tmp_path: Path) -> None:
    manifest = load_source(script_dir(tmp_path)).manifest
    assert manifest["executor"] == "python_runtime" and "executor_id" not in manifest
    assert manifest["parameters"]["required"] == ["text"]


def test_a_symlink_out_of_the_tool_is_refused(tmp_path: Path) -> None:
    secret = write(tmp_path / "secret.txt", "s3cret")
    tool = script_dir(tmp_path / "tools")
    (tool / "leak.txt").symlink_to(secret)
    with pytest.raises(SourceError, match="outside the tool directory") as caught:
        load_source(tool)
    assert caught.value.code == "E3105" and "s3cret" not in caught.value.message


def test_a_symlinked_directory_out_of_the_tool_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside / "key.pem", "private")
    tool = script_dir(tmp_path / "tools")
    (tool / "lib").symlink_to(outside)
    with pytest.raises(SourceError, match="outside the tool directory"):
        load_source(tool)


def test_a_symlink_inside_the_tool_is_skipped(tmp_path: Path) -> None:
    tool = script_dir(tmp_path)
    (tool / "alias.py").symlink_to(tool / "main.py")
    assert [f.path for f in load_source(tool).files] == ["main.py"]


def test_a_symlinked_manifest_is_refused(tmp_path: Path) -> None:
    real = script_dir(tmp_path / "real")
    tool = tmp_path / "linked"
    write(tool / "main.py", "print('{}')\n")
    (tool / "tool.yaml").symlink_to(real / "tool.yaml")
    with pytest.raises(SourceError, match="symbolic link"):
        load_source(tool)


def test_a_symlinked_single_file_manifest_is_refused_and_reported(tmp_path: Path) -> None:
    real = write(tmp_path / "elsewhere" / "api.yaml", "tool_id: api\n")
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "api.yaml").symlink_to(real)
    with pytest.raises(SourceError, match="symbolic link"):
        load_source(tools / "api.yaml")
    [error] = discover([tools])
    assert isinstance(error, SourceError) and "symbolic link" in error.message


def test_yaml_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb = write(tmp_path / "bomb.yaml", "\n".join(lines) + "\n")
    with pytest.raises(SourceError, match="expand") as caught:
        load_source(bomb)
    assert caught.value.code == "E3105"


def test_small_anchors_and_aliases_still_load(tmp_path: Path) -> None:
    text = TOOL_YAML.format(tool_id="anchored", version="1.0.0") + \
        "tags: &t [a, b]\nchangelog_tags: *t\n"
    tool = write(tmp_path / "anchored" / "tool.yaml", text).parent
    write(tool / "main.py", "print('{}')\n")
    assert load_source(tool).manifest["changelog_tags"] == ["a", "b"]


def test_a_tool_with_too_many_files_is_refused_before_reading_them(tmp_path: Path) -> None:
    tool = script_dir(tmp_path)
    for index in range(5):
        write(tool / "data" / f"{index}.txt", "")
    with pytest.raises(SourceError, match="file limit") as caught:
        load_source(tool, limits=PublicationLimits(max_files=3))
    assert caught.value.code == "E3105"


def test_a_huge_sparse_file_is_refused_by_its_size_without_reading_it(tmp_path: Path) -> None:
    tool = script_dir(tmp_path)
    with open(tool / "sparse.bin", "wb") as handle:
        handle.truncate(650 * 1024 * 1024)  # 650 MB, no blocks on disk
    with pytest.raises(SourceError, match="byte limit"):
        load_source(tool)


def test_unreadable_yaml_raises_source_error_with_line(tmp_path: Path) -> None:
    tool = write(tmp_path / "bad" / "tool.yaml", "tool_id: bad\nconfig: [unclosed\n")
    with pytest.raises(SourceError) as caught:
        load_source(tool.parent)
    assert caught.value.code == "E3105" and "line" in caught.value.message


def test_manifest_that_is_not_a_mapping_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="mapping"):
        load_source(write(tmp_path / "list.yaml", "- a\n- b\n"))


def test_directory_without_manifest_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"tool\.yaml"):
        load_source(tmp_path)


# ------------------------------------------------------------------- single files


def test_single_yaml_file_is_a_tool_without_files(tmp_path: Path) -> None:
    path = write(tmp_path / "weather.yml", "tool_id: weather\nversion: 1.2\ntool_type: api\n")
    source = load_source(path)
    assert (source.layout, source.files, source.manifest["version"]) == ("single_file", (), "1.2")


def test_legacy_python_tool_is_read_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = write(tmp_path / "hello_world.py", f'''"""Say hello to the world, politely."""
import pathlib
pathlib.Path({str(marker)!r}).write_text("ran")
__version__ = "1.2.0"
__tool_type__ = "script"
__executor_id__ = "python_runtime"
__category__ = "utility"
__parameters__ = [{{"name": "who", "type": "string", "required": True}}]
''')
    source = load_source(path)
    assert not marker.exists()
    assert source.layout == "legacy_python"
    assert {k: source.manifest[k] for k in ("tool_id", "version", "tool_type", "executor",
                                            "category", "description")} == {
        "tool_id": "hello_world", "version": "1.2.0", "tool_type": "script",
        "executor": "python_runtime", "category": "utility",
        "description": "Say hello to the world, politely."}
    assert source.manifest["parameters"]["required"] == ["who"]
    assert [f.path for f in source.files] == ["hello_world.py"]
    assert source.manifest["config"]["entrypoint"] == "hello_world.py"


def test_legacy_config_schema_becomes_parameters(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    path = write(tmp_path / "count.py", f"__tool_type__ = 'script'\nCONFIG_SCHEMA = {schema!r}\n")
    assert load_source(path).manifest["parameters"] == schema


def test_legacy_python_that_does_not_parse_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="line 1"):
        load_source(write(tmp_path / "broken.py", "def (:\n"))


def test_knowledge_markdown_frontmatter_is_the_manifest(tmp_path: Path) -> None:
    path = write(tmp_path / "style_guide.md",
                 "---\nversion: '1.0.0'\ndescription: How we write code here.\n---\n# Style\n")
    source = load_source(path)
    assert (source.manifest["tool_id"], source.manifest["tool_type"]) == ("style_guide", "knowledge")
    assert source.manifest["executor"] is None
    assert [f.path for f in source.files] == ["style_guide.md"]


def test_markdown_without_frontmatter_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="frontmatter"):
        load_source(write(tmp_path / "notes.md", "# just notes\n"))


# ---------------------------------------------------------------------- discovery


def test_discover_walks_directories_for_every_layout(tmp_path: Path) -> None:
    script_dir(tmp_path / "scripts")
    write(tmp_path / "api.yaml", "tool_id: api_tool\nversion: '1.0.0'\ntool_type: api\n")
    write(tmp_path / "legacy" / "old_tool.py", "__tool_type__ = 'script'\n")
    write(tmp_path / "legacy" / "helper.py", "def helper(): pass\n")
    write(tmp_path / "guide.md", "---\ntool_id: guide\n---\ntext\n")
    write(tmp_path / "README.md", "# not a tool\n")
    ids = [s.manifest["tool_id"] for s in sources_of(discover([tmp_path]))]
    assert ids == ["api_tool", "guide", "old_tool", "echo"]


def test_walking_a_project_finds_ai_tools_but_skips_other_hidden_dirs(tmp_path: Path) -> None:
    script_dir(tmp_path / ".ai" / "tools", "echo")
    script_dir(tmp_path / ".cache", "cached")
    assert [s.manifest["tool_id"] for s in sources_of(discover([tmp_path]))] == ["echo"]


def test_directory_with_manifest_is_one_tool(tmp_path: Path) -> None:
    tool = script_dir(tmp_path)
    write(tool / "nested" / "other.yaml", "tool_id: other\n")
    assert [s.manifest["tool_id"] for s in sources_of(discover([tool]))] == ["echo"]


def test_one_bad_source_does_not_hide_the_others(tmp_path: Path) -> None:
    script_dir(tmp_path)
    write(tmp_path / "bad.yaml", "tool_id: [\n")
    found = discover([tmp_path])
    assert [type(f).__name__ for f in found] == ["SourceError", "ToolSource"]


def test_project_tools_shadow_user_tools_with_the_same_id(tmp_path: Path) -> None:
    project, user = tmp_path / "project", tmp_path / "home" / ".ai" / "tools"
    script_dir(project / ".ai" / "tools", "echo", "2.0.0")
    script_dir(user, "echo", "1.0.0")
    script_dir(user, "personal", "1.0.0")
    found = discover_project_tools(project, user)
    assert sorted((s.manifest["tool_id"], s.manifest["version"]) for s in found) == [
        ("echo", "2.0.0"), ("personal", "1.0.0")]


def test_missing_tool_directories_yield_no_tools(tmp_path: Path) -> None:
    assert discover_project_tools(tmp_path, tmp_path / "nowhere") == []


def test_shadowing_keeps_every_version_of_the_winning_level(tmp_path: Path) -> None:
    first = sources_of(discover([script_dir(tmp_path / "a", "echo", "1.0.0"),
                                 script_dir(tmp_path / "b", "echo", "1.1.0")]))
    later = sources_of(discover([script_dir(tmp_path / "c", "echo", "9.0.0")]))
    assert [s.manifest["version"] for s in shadow(first, later)] == ["1.0.0", "1.1.0"]


def test_collected_sources_put_extra_dirs_before_project_and_user(tmp_path: Path) -> None:
    extra, project, user = tmp_path / "extra", tmp_path / "project", tmp_path / "user"
    script_dir(extra, "echo", "3.0.0")
    script_dir(project, "echo", "2.0.0")
    script_dir(project, "only_project", "1.0.0")
    script_dir(user, "only_user", "1.0.0")
    settings = SimpleNamespace(tools_dir=project, user_tools_dir=user)
    local = [s for s in collect_sources([extra], settings) if s.layout != "builtin"]
    assert sorted((s.manifest["tool_id"], s.manifest["version"]) for s in local) == [
        ("echo", "3.0.0"), ("only_project", "1.0.0"), ("only_user", "1.0.0")]


def test_unreadable_sources_are_passed_to_the_error_callback(tmp_path: Path) -> None:
    write(tmp_path / ".ai" / "tools" / "bad.yaml", "tool_id: [\n")
    seen: list[SourceError] = []
    assert discover_project_tools(tmp_path, None, on_error=seen.append) == []
    assert [error.code for error in seen] == ["E3105"]


def test_manifest_schema_is_written_as_sorted_json(tmp_path: Path) -> None:
    target = tmp_path / "schemas" / "tool-manifest.schema.json"
    write_manifest_schema(target)
    assert target.read_text(encoding="utf-8") == manifest_schema_text()


def test_builtin_sources_have_the_builtin_layout() -> None:
    assert all(source.layout == "builtin" for source in load_builtin_sources())


# ---------------------------------------------------------------------------- bash


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_syntax_check_reports_errors_and_accepts_valid_scripts() -> None:
    assert bash_syntax_check("echo hi\nif true; then echo ok; fi\n") is None
    message = bash_syntax_check("echo hi\nfi\n")
    assert message is not None and "syntax error" in message


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_syntax_check_does_not_run_the_script(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    assert bash_syntax_check(f"touch {marker}\n") is None
    assert not marker.exists()


def test_bash_syntax_check_is_skipped_without_bash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert bash_syntax_check("fi\n") is None
