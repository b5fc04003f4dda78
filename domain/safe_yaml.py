"""YAML loading with a bound on what aliases may expand to (manifests, frontmatter).

YAML anchors and aliases let a few hundred bytes describe billions of values (the
"billion laughs" bomb): PyYAML builds shared objects cheaply, and whatever walks the
result afterwards (normalising, hashing, validating, serialising) pays for every
expanded value. `load_yaml` composes the node graph first, counts the nodes the
document stands for once every alias is expanded (each distinct node counted once per
reference, in time linear in the distinct nodes) and refuses it before anything is
constructed when that count, the nesting depth or the text size passes a bound.
Recursive aliases (an anchor used inside itself) are refused too.
"""

from __future__ import annotations

from typing import Any, Final

import yaml

from domain.errors import RegistryError

MAX_YAML_CHARS: Final = 1024 * 1024
"""Longest YAML text read (a manifest is a few kilobytes)."""
MAX_YAML_NODES: Final = 100_000
"""Most values a document may stand for once aliases are expanded."""
MAX_YAML_DEPTH: Final = 100
"""Deepest nesting of mappings and sequences."""

try:  # the C composer when libyaml is there; same behaviour, faster
    _Loader: type[yaml.SafeLoader] = yaml.CSafeLoader  # type: ignore[assignment]
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _Loader = yaml.SafeLoader


class YamlTooLarge(RegistryError):
    """A YAML document past a loading bound: text size, expanded values, depth, or a
    recursive alias (E3105)."""

    code = "E3105"


def load_yaml(text: str, *, max_nodes: int = MAX_YAML_NODES, max_depth: int = MAX_YAML_DEPTH,
              max_chars: int = MAX_YAML_CHARS) -> Any:
    """`yaml.safe_load(text)` within bounds. Raises YamlTooLarge past a bound and
    yaml.YAMLError for text that is not YAML."""
    if len(text) > max_chars:
        raise YamlTooLarge(f"YAML text of {len(text)} characters is longer than the "
                           f"{max_chars}-character limit",
                           details={"limit": "chars", "max": max_chars, "actual": len(text)})
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise _too_deep(max_depth) from None
        if node is None:
            return None
        expanded = _expanded_size(node, max_nodes, max_depth)
        if expanded > max_nodes:
            raise YamlTooLarge(
                f"YAML aliases expand to more than {max_nodes} values; anchors and aliases "
                "may only repeat small parts of a manifest",
                details={"limit": "expanded_nodes", "max": max_nodes})
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _too_deep(max_depth: int) -> YamlTooLarge:
    return YamlTooLarge(f"YAML nests deeper than {max_depth} levels",
                        details={"limit": "depth", "max": max_depth})


def _expanded_size(root: yaml.Node, max_nodes: int, max_depth: int) -> int:
    """Values `root` stands for with every alias expanded, stopping early past
    `max_nodes` (the result is then only known to be larger)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        known = sizes.get(key)
        if known is not None:
            return known
        if key in active:
            raise YamlTooLarge("a YAML alias refers to a node that contains it (a recursive "
                               "structure)", details={"limit": "recursive_alias"})
        if depth > max_depth:
            raise _too_deep(max_depth)
        total = 1
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            active.add(key)
            children = (child for pair in node.value for child in pair) \
                if isinstance(node, yaml.MappingNode) else iter(node.value)
            for child in children:
                total += size(child, depth + 1)
                if total > max_nodes:
                    break
            active.discard(key)
        sizes[key] = total
        return total

    return size(root, 0)
