"""Reading a user's YAML strictly: duplicate keys, alias bombs and non-UTF-8 files are refused.

PyYAML silently keeps the last of two equal keys (so `lr:` written twice trains with the one the
user did not look at), and expands aliases into shared references that later copies (`asdict`,
JSON, deep copies) multiply: nine nested aliases of nine items each ("billion laughs") is a
200-byte file that takes gigabytes. Anchors and aliases themselves are useful (one `&defaults`
block reused), so they stay allowed; what is bounded is the number of nodes the document has once
every alias is expanded (`MAX_NODES`), counted on the node graph before anything is built.

Numbers keep the text they were written as (`YamlInt`, `YamlFloat`), so a string field receives
`1.10`, `0x1f` or `1:30` as typed rather than as YAML 1.1's 1.1, 31 and 90.

Only the user's config goes through this loader. Run configs that hpcrl wrote itself are read with
libyaml's plain loader by `status` and `collect`, where speed matters and the text is trusted.
"""

from __future__ import annotations

from typing import Any

import yaml

from hpcrl.config.schema import ConfigError, YamlFloat, YamlInt

MAX_NODES = 100_000
"""Nodes of a config once its aliases are expanded. A real config has a few hundred."""

_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_Base):  # type: ignore[misc, valid-type]
    """libyaml's parser (when PyYAML has it) with a checking constructor."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_size(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        if isinstance(node, yaml.MappingNode):
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: construct_mapping says so itself
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _check_size(root: yaml.Node) -> None:
    """Refuse a document whose alias-expanded node count passes MAX_NODES, or that refers to itself."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ConfigError(f"line {node.start_mark.line + 1}: an alias refers to a node that contains it")
        active.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        active.discard(key)
        if total > MAX_NODES:
            raise ConfigError(
                f"line {node.start_mark.line + 1}: the config expands to more than {MAX_NODES:,} values "
                "(counting each alias as what it repeats)"
            )
        sizes[key] = total
        return total

    size(root)


def _int(loader: StrictLoader, node: yaml.ScalarNode) -> YamlInt:
    value = YamlInt(yaml.SafeLoader.construct_yaml_int(loader, node))
    value.text = node.value
    return value


def _float(loader: StrictLoader, node: yaml.ScalarNode) -> YamlFloat:
    value = YamlFloat(yaml.SafeLoader.construct_yaml_float(loader, node))
    value.text = node.value
    return value


StrictLoader.add_constructor("tag:yaml.org,2002:int", _int)
StrictLoader.add_constructor("tag:yaml.org,2002:float", _float)


def _represent_number(dumper: yaml.SafeDumper, value: YamlInt | YamlFloat) -> yaml.ScalarNode:
    """Free-form values (a program's parameters) are stored as typed: written back as they were spelled."""
    tag = "tag:yaml.org,2002:float" if isinstance(value, YamlFloat) else "tag:yaml.org,2002:int"
    return dumper.represent_scalar(tag, value.text)


for _dumper in {yaml.SafeDumper, getattr(yaml, "CSafeDumper", yaml.SafeDumper)}:
    _dumper.add_representer(YamlInt, _represent_number)
    _dumper.add_representer(YamlFloat, _represent_number)


def load(text: str) -> Any:
    """Parse a user's YAML; YAML errors (duplicate keys included) name their line."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}malformed YAML: {problem}") from None
    except RecursionError:
        raise ConfigError("malformed YAML: nested too deeply") from None
