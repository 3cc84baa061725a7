"""Dotted keys on a config's plain data, before it is typed: `-p key=value` overrides read as YAML (and
Hydra's `{a:1}`), and setting, merging and reading a value at a dotted key, as a grid point and
`sweep.when` do."""

from __future__ import annotations

import re
from typing import Any

from hpcrl.config import strict_yaml
from hpcrl.config.schema import ConfigError, key_path


def _merge(old: Any, new: Any) -> Any:
    """A mapping given for a mapping changes only the keys it names; anything else replaces."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for key, value in new.items():
            out[key] = _merge(old.get(key), value)
        return out
    return new


def set_dotted(data: dict, dotted: str, value: Any, *, merge: bool = False) -> None:
    """Set a dotted key; with `merge` (a grid point), a mapping changes only the keys it names,
    while `-p key=value` sets the key to exactly the value given."""
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part} is not a mapping")
        node = child
    node[parts[-1]] = _merge(node.get(parts[-1]), value) if merge else value


DOTTED_KEY_MAPS = ("sweep.grid", "sweep.search.space")
"""Mappings whose keys are themselves dotted config keys (`train.lr`)."""


def set_override(data: dict, key: str, value: Any) -> None:
    """`-p key=value`; below a mapping of dotted keys the rest is one key, so
    `-p sweep.grid.train.lr=[...]` sets the grid's `train.lr`, as the same line in the file does."""
    for prefix in DOTTED_KEY_MAPS:
        if key.startswith(prefix + ".") and len(key) > len(prefix) + 1:
            node = _dotted_or_none(data, prefix)
            if node is None:
                set_dotted(data, prefix, node := {})
            if not isinstance(node, dict):
                raise ConfigError(f"-p {key}: {prefix} is not a mapping")
            node[key[len(prefix) + 1 :]] = value
            return
    set_dotted(data, key, value)


def _dotted_or_none(data: dict, dotted: str) -> Any:
    """The value at a dotted key of plain data; None where a part is missing or not a mapping."""
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def get_dotted(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=3e-4` -> ('train.lr', 0.0003): the value is read as YAML, then typed by the schema
    (numbers keep their text, so `name=1.10` stays '1.10')."""
    if "=" not in text:
        raise ConfigError(f"-p {text}: expected key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"-p {text}: expected key.path=value")
    if any(c in text for c in "\n\r"):  # YAML would fold it, or read what follows a # as a comment
        raise ConfigError(f"-p {key_path('', key)}: an override is one line, got a line break in {raw!r}")
    flow = raw.strip()[:1] in ("{", "[")
    try:
        value = strict_yaml.load(_hydra_flow(raw) if flow else raw) if raw.strip() else ""
    except ConfigError as exc:
        if flow:  # a mapping or list the user meant, not a string that happens to start with a bracket
            raise ConfigError(f"-p {key_path('', key)}: {re.sub(r'^line [0-9]+: ', '', str(exc))} in {raw!r}") from None
        value = raw
    return key, value


def _hydra_flow(text: str) -> str:
    """Hydra's `{a:1,b:2}` as YAML's `{a: 1, b: 2}`: YAML reads a key and value without a space
    after the colon as one key with no value ('a:1': null), so a space is put after the first colon
    of each key of a flow mapping, at any depth. Quoted text, and colons inside values
    (`{url:http://x}`), are left as written."""
    out: list[str] = []
    stack: list[str] = []  # "{" or "[" per open collection
    in_key = False  # reading a mapping key: its first colon separates it from its value
    quote = ""
    for i, c in enumerate(text):
        out.append(c)
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "{[":
            stack.append(c)
            in_key = c == "{"
        elif c in "}]":
            if stack:
                stack.pop()
            in_key = False
        elif c == ",":
            in_key = bool(stack) and stack[-1] == "{"
        elif c == ":" and in_key:
            in_key = False
            if text[i + 1 : i + 2] not in (" ", ""):
                out.append(" ")
    return "".join(out)
