"""Reading tool sources from disk into `ToolSource` values (the I/O side of authoring).

Layouts understood:
- a directory with `tool.yaml` (every other file in it, recursively, belongs to the tool),
- a single-file manifest `<name>.yaml` / `<name>.yml` (pure data: API, MCP, runtimes),
- a legacy Python file with dunder metadata (`__version__`, `__tool_type__`, ...), read
  with `ast` and never imported,
- a knowledge entry `<name>.md` whose YAML frontmatter is the manifest,
- the built-in tools shipped under `toolexec/builtin_tools/`.

Reading is bounded: manifests are parsed with `domain.safe_yaml` (no alias bombs,
at most 1 MiB), a symbolic link is never followed (a symlinked manifest, tool
directory entry or file is refused), and a directory's files are counted and
sized with `stat` against the publication limits before any is read.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from domain.errors import ToolexecError
from domain.manifest import MANIFEST_SCHEMA, normalise_manifest, split_frontmatter
from domain.model import ToolFile, ToolSource
from domain.publication_limits import DEFAULT_LIMITS, PublicationLimits, PublicationTooLarge
from domain.safe_yaml import MAX_YAML_CHARS, YamlTooLarge, load_yaml

MANIFEST_FILE = "tool.yaml"
BUILTIN_DIR = Path(__file__).parent / "builtin_tools"
IGNORED_NAMES = frozenset({"__pycache__", ".git", ".venv", "node_modules", ".DS_Store"})
VISIBLE_DOT_DIRS = frozenset({".ai"})
YAML_SUFFIXES = (".yaml", ".yml")
BASH_CHECK_TIMEOUT_SECONDS = 5.0


class SourceError(ToolexecError):
    """A tool source cannot be read: unreadable YAML, a manifest that is not a mapping,
    a Python file that does not parse, an unknown file kind (E3105)."""

    code = "E3105"


class ToolDirs(Protocol):
    """The part of the settings `collect_sources` reads."""

    tools_dir: Path | None
    user_tools_dir: Path | None


# ----------------------------------------------------------------------------- loading


def load_source(path: Path, *, limits: PublicationLimits = DEFAULT_LIMITS) -> ToolSource:
    """Load one tool source from `path` (a tool directory, a YAML manifest, a legacy
    `.py` file or a knowledge `.md` file). Raises SourceError when it cannot be read,
    is a symbolic link, or holds more files or bytes than `limits` allow."""
    if path.is_dir():
        if not (path / MANIFEST_FILE).is_file():
            raise SourceError(f"{path}: a tool directory needs a {MANIFEST_FILE}",
                              details={"path": str(path)})
        return _load_directory(path, limits)
    _refuse_symlink(path)
    suffix = path.suffix.lower()
    if suffix in YAML_SUFFIXES:
        return ToolSource(normalise_manifest(_read_yaml_mapping(path)), (), _origin(path),
                          "single_file")
    if suffix == ".py":
        return _load_legacy_python(path, limits.max_bytes)
    if suffix == ".md":
        return _load_knowledge(path, limits.max_bytes)
    raise SourceError(f"{path}: not a tool source (expected a directory with {MANIFEST_FILE}, "
                      "a .yaml/.yml manifest, a .py legacy tool or a .md knowledge entry)",
                      details={"path": str(path)})


def _origin(path: Path) -> str:
    return str(path.resolve())


def _refuse_symlink(path: Path) -> None:
    if path.is_symlink():
        raise SourceError(f"{path}: is a symbolic link; tool sources and their files must "
                          "be regular files (copy the file instead of linking it)",
                          details={"path": str(path)})


def _read_bytes(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a regular file, opened without following a symbolic link and
    refused past `limit` bytes before they are read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if error.errno == errno.ELOOP:
            _refuse_symlink(path)
        raise SourceError(f"{path}: cannot read: {error.strerror or error}",
                          details={"path": str(path)}) from error
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise SourceError(f"{path}: not a regular file", details={"path": str(path)})
        if limit is not None and info.st_size > limit:
            raise SourceError(f"{path}: {info.st_size} bytes is more than the {limit}-byte "
                              "limit", details={"path": str(path), "max": limit,
                                                "actual": info.st_size})
        try:
            content = handle.read() if limit is None else handle.read(limit + 1)
        except OSError as error:
            raise SourceError(f"{path}: cannot read: {error.strerror or error}",
                              details={"path": str(path)}) from error
    if limit is not None and len(content) > limit:  # grew while being read
        raise SourceError(f"{path}: more than the {limit}-byte limit",
                          details={"path": str(path), "max": limit})
    return content


def _read_text(path: Path, limit: int | None = None) -> str:
    try:
        return _read_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError as error:
        raise SourceError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})",
                          details={"path": str(path)}) from error


def _parse_yaml_mapping(text: str, where: Path) -> dict[str, Any]:
    try:
        data = load_yaml(text)
    except YamlTooLarge as error:
        raise SourceError(f"{where}: {error.message}",
                          details={"path": str(where), **error.details}) from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(error, "problem", None) or str(error)
        at = f" at line {line}" if line else ""
        raise SourceError(f"{where}: unreadable YAML{at}: {problem}",
                          details={"path": str(where), "line": line}) from error
    if not isinstance(data, Mapping):
        raise SourceError(f"{where}: the manifest must be a YAML mapping, "
                          f"got {type(data).__name__}", details={"path": str(where)})
    return dict(data)


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    return _parse_yaml_mapping(_read_text(path, MAX_YAML_CHARS), path)


def _tool_file(path: Path, relative: str, limit: int | None = None) -> ToolFile:
    content = _read_bytes(path, limit)
    mode = path.lstat().st_mode
    return ToolFile(path=relative, sha256=hashlib.sha256(content).hexdigest(),
                    is_executable=bool(mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)),
                    content=content)


def _load_directory(root: Path, limits: PublicationLimits) -> ToolSource:
    manifest = normalise_manifest(_read_yaml_mapping(root / MANIFEST_FILE))
    return ToolSource(manifest, _directory_files(root, limits), _origin(root), "directory")


def _directory_files(root: Path, limits: PublicationLimits) -> tuple[ToolFile, ...]:
    """Every regular file under `root` except the manifest, caches and VCS data.

    A symbolic link whose target lies outside `root` is refused (SourceError); one
    that stays inside is skipped, its target being a file of the tool anyway. Files
    are counted and sized with `lstat` first: past `limits`, nothing is read."""
    found: list[tuple[Path, str, int]] = []
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_NAMES)
        for name in [*sorted(filenames), *(d for d in dirnames
                                           if (Path(directory) / d).is_symlink())]:
            full = Path(directory) / name
            relative = full.relative_to(root).as_posix()
            if relative == MANIFEST_FILE or name in IGNORED_NAMES or name.endswith(".pyc"):
                continue
            info = full.lstat()
            if stat.S_ISLNK(info.st_mode):
                _refuse_escaping_link(root, full)
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((full, relative, info.st_size))
            if len(found) > limits.max_files:  # no need to walk a huge tree to its end
                raise SourceError(f"{root}: more than {limits.max_files} files, the file "
                                  "limit of a tool", details={"path": str(root),
                                                              "limit": "files",
                                                              "max": limits.max_files})
    try:
        limits.check_declared((relative, size) for _, relative, size in found)
    except PublicationTooLarge as error:
        raise SourceError(f"{root}: {error.message}",
                          details={"path": str(root), **error.details}) from error
    files = [_tool_file(full, relative, limits.max_bytes) for full, relative, _ in found]
    return tuple(sorted(files, key=lambda f: f.path))


def _refuse_escaping_link(root: Path, link: Path) -> None:
    target = link.resolve()
    if not target.is_relative_to(root.resolve()):
        raise SourceError(f"{link}: is a symbolic link to {target}, outside the tool "
                          "directory; a tool may only hold its own files",
                          details={"path": str(link), "target": str(target)})


# ------------------------------------------------------------------ legacy and knowledge


def _load_legacy_python(path: Path, limit: int) -> ToolSource:
    tool_file = _tool_file(path, path.name, limit)
    manifest = normalise_manifest(legacy_manifest(tool_file.content or b"", path))
    return ToolSource(manifest, (tool_file,), _origin(path), "legacy_python")


def legacy_manifest(content: bytes, path: Path) -> dict[str, Any]:
    """The raw manifest of a legacy Python tool, read from its module-level dunder
    assignments and docstring with `ast` (the file is never imported or run)."""
    try:
        tree = ast.parse(content, filename=str(path))
    except (SyntaxError, ValueError) as error:
        line = getattr(error, "lineno", None)
        raise SourceError(f"{path}: Python does not parse (line {line}): {error}",
                          details={"path": str(path), "line": line}) from error
    values = _module_constants(tree)
    manifest: dict[str, Any] = {
        "tool_id": values.get("__tool_id__", path.stem),
        "name": path.stem,
        "config": {"entrypoint": path.name},
        "manifest": {"language": "python", "entrypoint": path.name},
    }
    docstring = ast.get_docstring(tree)
    if docstring:
        manifest["description"] = docstring.strip()
    for key, field in (("__version__", "version"), ("__tool_type__", "tool_type"),
                       ("__category__", "category")):
        if key in values:
            manifest[field] = values[key]
    if "__executor_id__" in values or "__executor__" in values:
        manifest["executor"] = values.get("__executor_id__", values.get("__executor__"))
    parameters = values.get("__parameters__", values.get("CONFIG_SCHEMA"))
    if parameters is not None:
        manifest["parameters"] = parameters
    return manifest


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level `NAME = <literal>` assignments; non-literal values are ignored."""
    values: dict[str, Any] = {}
    for node in tree.body:
        targets: list[ast.expr]
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    values[target.id] = ast.literal_eval(value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
    return values


def _load_knowledge(path: Path, limit: int) -> ToolSource:
    tool_file = _tool_file(path, path.name, limit)
    text = (tool_file.content or b"").decode("utf-8", errors="replace")
    frontmatter, _ = split_frontmatter(text)
    if frontmatter is None:
        raise SourceError(f"{path}: a knowledge entry needs YAML frontmatter between '---' lines",
                          details={"path": str(path)})
    raw = {"tool_id": path.stem, "tool_type": "knowledge", "executor": None,
           **_parse_yaml_mapping(frontmatter, path)}
    return ToolSource(normalise_manifest(raw), (tool_file,), _origin(path), "single_file")


# ---------------------------------------------------------------------------- discovery


def discover(paths: Iterable[Path], *, limits: PublicationLimits = DEFAULT_LIMITS,
             ) -> list[ToolSource | SourceError]:
    """Find and load every tool under `paths`, in a stable order. A directory holding a
    `tool.yaml` is one tool; other directories are walked. Unreadable sources come back
    as SourceError values in place, so one bad file does not hide the others; so do
    symbolic links met while walking (they are never followed)."""
    found: list[ToolSource | SourceError] = []
    for path in paths:
        if not path.exists():
            found.append(SourceError(f"{path}: no such file or directory",
                                     details={"path": str(path)}))
        elif path.is_dir() and not (path / MANIFEST_FILE).is_file():
            found.extend(_walk(path, limits))
        else:
            found.append(_try_load(path, limits))
    return found


def _try_load(path: Path, limits: PublicationLimits) -> ToolSource | SourceError:
    try:
        return load_source(path, limits=limits)
    except SourceError as error:
        return error


def _walk(directory: Path, limits: PublicationLimits) -> list[ToolSource | SourceError]:
    found: list[ToolSource | SourceError] = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        hidden = entry.name.startswith(".") and entry.name not in VISIBLE_DOT_DIRS
        if entry.name in IGNORED_NAMES or hidden:
            continue
        if entry.is_symlink():
            if entry.is_dir() or _looks_like_tool(entry):
                found.append(SourceError(f"{entry}: is a symbolic link; tool sources are not "
                                         "followed through links (copy the tool instead)",
                                         details={"path": str(entry)}))
            continue
        if entry.is_dir():
            found.extend([_try_load(entry, limits)] if (entry / MANIFEST_FILE).is_file()
                         else _walk(entry, limits))
        elif _looks_like_tool(entry):
            found.append(_try_load(entry, limits))
    return found


def _looks_like_tool(path: Path) -> bool:
    """YAML files are manifests; .py files only with `__tool_type__`; .md files only with
    frontmatter naming a tool_id (plain notes and helper modules are not tools)."""
    suffix = path.suffix.lower()
    if suffix in YAML_SUFFIXES:
        return True
    try:
        if suffix == ".py":
            return b"__tool_type__" in path.read_bytes()
        if suffix == ".md":
            frontmatter, _ = split_frontmatter(path.read_text(encoding="utf-8", errors="replace"))
            return frontmatter is not None and "tool_id" in frontmatter
    except OSError:
        return True
    return False


def shadow(*levels: Iterable[ToolSource]) -> list[ToolSource]:
    """Merge source lists, highest precedence first: a tool_id present in an earlier
    level hides every source with that tool_id in later levels."""
    merged: list[ToolSource] = []
    taken: set[str] = set()
    for level in levels:
        sources = list(level)
        merged.extend(s for s in sources if _tool_id(s) not in taken)
        taken.update(_tool_id(s) for s in sources)
    return merged


def _tool_id(source: ToolSource) -> str:
    return str(source.manifest.get("tool_id", source.origin))


def _sources_only(found: Iterable[ToolSource | SourceError],
                  on_error: Callable[[SourceError], None] | None) -> list[ToolSource]:
    sources: list[ToolSource] = []
    for item in found:
        if isinstance(item, SourceError):
            if on_error is not None:
                on_error(item)
        else:
            sources.append(item)
    return sources


def discover_project_tools(project_dir: Path, user_dir: Path | None, *,
                           on_error: Callable[[SourceError], None] | None = None,
                           ) -> list[ToolSource]:
    """Tools of a project (`<project_dir>/.ai/tools`) and of the user (`user_dir`,
    usually `~/.ai/tools`); project tools shadow user tools with the same tool_id.
    Unreadable sources are passed to `on_error` and left out."""
    limits = DEFAULT_LIMITS
    project = _sources_only(_discover_dir(project_dir / ".ai" / "tools", limits), on_error)
    user = (_sources_only(_discover_dir(user_dir, limits), on_error) if user_dir is not None
            else [])
    return shadow(project, user)


def _discover_dir(directory: Path | None, limits: PublicationLimits,
                  ) -> list[ToolSource | SourceError]:
    if directory is None or not directory.is_dir():
        return []
    return discover([directory], limits=limits)


def collect_sources(extra_dirs: Iterable[Path], settings: ToolDirs, *,
                    on_error: Callable[[SourceError], None] | None = None) -> list[ToolSource]:
    """Everything a running system publishes: the built-in tools, then the tools of
    `extra_dirs`, `settings.tools_dir` and `settings.user_tools_dir`, earlier ones
    shadowing later ones by tool_id (built-ins are never shadowed: other versions of
    them coexist in the registry)."""
    limits = getattr(settings, "publication_limits", None) or DEFAULT_LIMITS
    levels = [
        _sources_only(discover(list(extra_dirs), limits=limits), on_error),
        _sources_only(_discover_dir(getattr(settings, "tools_dir", None), limits), on_error),
        _sources_only(_discover_dir(getattr(settings, "user_tools_dir", None), limits),
                      on_error),
    ]
    return load_builtin_sources() + shadow(*levels)


def load_builtin_sources() -> list[ToolSource]:
    """The built-in tools (primitives, runtimes...): every YAML under
    `toolexec/builtin_tools/`, each a single-file tool with layout "builtin"."""
    if not BUILTIN_DIR.is_dir():
        return []
    paths = sorted(p for p in BUILTIN_DIR.iterdir() if p.suffix.lower() in YAML_SUFFIXES)
    return [replace(load_source(p), layout="builtin") for p in paths]


# ----------------------------------------------------------------------- bash, schema


def bash_syntax_check(text: str) -> str | None:
    """Check Bash syntax with `bash -n` (nothing is executed). Returns bash's error
    message, or None when the text parses, bash is missing, or the check times out."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    try:
        completed = subprocess.run(
            [bash, "--norc", "--noprofile", "-n"], input=text.encode("utf-8"),
            capture_output=True, timeout=BASH_CHECK_TIMEOUT_SECONDS, check=False,
            env={"LC_ALL": "C", "PATH": os.defpath},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if completed.returncode == 0:
        return None
    message = completed.stderr.decode("utf-8", errors="replace").strip()
    return message.replace(f"{bash}: ", "").replace("bash: ", "") or "bash -n failed"


def manifest_schema_text() -> str:
    """MANIFEST_SCHEMA as committed in contracts/schemas (sorted keys, indent 2)."""
    return json.dumps(MANIFEST_SCHEMA, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def write_manifest_schema(path: Path) -> None:
    """Write the tool manifest JSON Schema to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(manifest_schema_text(), encoding="utf-8")
