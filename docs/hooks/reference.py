"""The reference pages, generated when the site is built, so they cannot drift from the code.

An MkDocs hook (mkdocs.yml `hooks:`): a page that holds `<!-- reference:config -->` gets every config
key, walked from the JSON Schema that `hpcrl schema` prints (`hpcrl.config.json_schema`, itself generated
from the typed fields, their bounds and their docstrings in `hpcrl/config/`), with whether a grid may
sweep it (`hpcrl.config.key_paths.is_sweepable`); a page that holds `<!-- reference:cli -->` gets every
command of `hpcrl.cli.parser()` with its arguments. Both walks are generic: a new key, bound, default,
docstring, command or option appears on the next build with nothing written here. tests/test_docs.py
builds the site with --strict and checks that every key and every option reaches these pages.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

CONFIG_MARK = "<!-- reference:config -->"
CLI_MARK = "<!-- reference:cli -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs' hook: fill the marks of the reference pages."""
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_markdown())
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_markdown())
    return markdown


# --------------------------------------------------------------------------------------------
# The config: one section per mapping of the schema, one entry per key.


def config_sections() -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(title, description, entries) of every mapping of the config, in the schema's order. `train`
    has one section per algorithm (its fields and defaults depend on `algo`). An entry is a dict with
    `key` (the dotted path), `type`, `default`, `description` and `sweepable` (None where a grid does
    not apply: inside free-form mappings and lists)."""
    from hpcrl.config.json_schema import config_schema

    schema = config_schema()
    sections: list[tuple[str, str, list[dict[str, Any]]]] = []
    _walk(schema, "", "ppo", sections, grid=True)
    for branch in schema.get("allOf", []):
        algo = branch["if"]["properties"]["algo"]["const"]
        train = branch["then"]["properties"]["train"]
        _walk(train, "train", algo, sections, grid=True, title=f"train (algo: {algo})")
    return sections


def _walk(obj: dict[str, Any], path: str, algo: str, out: list, *, grid: bool, title: str | None = None) -> None:
    """Append the section of object schema `obj` at dotted `path`, then those of its nested mappings."""
    entries = []
    nested: list[tuple[dict[str, Any], str, bool]] = []
    for name, prop in obj.get("properties", {}).items():
        key = f"{path}.{name}" if path else name
        if key == "train" and not path:  # one section per algorithm, after this one
            entries.append({"key": key, "type": "mapping", "default": None, "description": prop.get("description", ""), "sweepable": None, "see": "train (algo: ppo)"})
            continue
        inner, how = _nested_object(prop)
        entry = {
            "key": key,
            "type": type_text(prop),
            "default": _default_text(prop),
            "description": prop.get("description", ""),
            "sweepable": _sweepable(key, algo) if grid and inner is None else None,
            "required": name in obj.get("required", ()),
        }
        if inner is not None:
            sub = {"field": key, "item": f"{key}[]", "value": f"{key}.<name>"}[how]
            entry["see"] = sub
            nested.append((inner, sub, grid and how == "field"))
        entries.append(entry)
    heading = title or path or "top level"
    out.append((heading, obj.get("description", ""), entries))
    for inner, sub, sub_grid in nested:
        _walk(inner, sub, algo, out, grid=sub_grid)


def _nested_object(prop: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The object schema a key holds (a section, the items of a list, the values of a mapping), and which."""
    options = prop.get("anyOf", [prop])
    for option in options:
        if "properties" in option:
            return option, "field"
        if isinstance(option.get("items"), dict) and "properties" in option["items"]:
            return option["items"], "item"
        if isinstance(option.get("additionalProperties"), dict) and "properties" in option["additionalProperties"]:
            return option["additionalProperties"], "value"
    return None, ""


def _sweepable(key: str, algo: str) -> bool | None:
    from hpcrl.config.key_paths import is_sweepable

    try:
        return is_sweepable(key, algo)
    except (KeyError, StopIteration, TypeError):  # a key the grid grammar does not address
        return None


_BOUNDS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))


def type_text(prop: dict[str, Any]) -> str:
    """A JSON Schema as a reader says it: `integer ≥ 1`, `number in (0, 1]`, `one of a, b`, `list of strings`."""
    if "enum" in prop:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" if not isinstance(v, str) else f"`{v}`" for v in prop["enum"])
    if "anyOf" in prop:
        options = prop["anyOf"]
        numbers = [o for o in options if o.get("type") == "number"]
        if numbers and all(o.get("type") in ("number", "string") for o in options) and all("pattern" in o for o in options if o.get("type") == "string"):
            return _bounded("number", numbers[0])  # a float field: YAML 1.1's 3e-4 (a string) is taken as the number it spells
        texts = [type_text(o) for o in options if o.get("type") != "null"]
        text = " or ".join(dict.fromkeys(texts))
        return text + (" or null" if any(o.get("type") == "null" for o in options) else "")
    kind = prop.get("type")
    if kind == ["string", "number"]:
        return "string"
    if kind == "integer":
        return _bounded("integer", prop)
    if kind == "number":
        return _bounded("number", prop)
    if kind == "string":
        return "string" + (f" matching `{prop['pattern']}`" if "pattern" in prop else "")
    if kind == "boolean":
        return "boolean"
    if kind == "null":
        return "null"
    if kind == "array":
        item = _plural(type_text(prop.get("items", {})))
        low, high = prop.get("minItems"), prop.get("maxItems")
        if low is not None and low == high:
            return f"list of {low} {item}"
        lengths = [f"at least {low}" if low is not None else "", f"at most {high}" if high is not None else ""]
        return f"list of {item}" + (f" ({' and '.join(filter(None, lengths))})" if any(lengths) else "")
    if kind == "object":
        if "properties" in prop:
            return "mapping"
        value = prop.get("additionalProperties")
        return "mapping" + (f" of names to {type_text(value)}" if isinstance(value, dict) and value else "")
    if not prop:
        return "any value"
    return json.dumps(prop)


def _plural(text: str) -> str:
    """`integer ≥ 1` -> `integers ≥ 1`, `one of a, b` and `any value` as they are."""
    first, sep, rest = text.partition(" ")
    if first in ("integer", "number", "string", "boolean", "mapping", "list"):
        return first + "s" + sep + rest
    return "any values" if text == "any value" else text


def _bounded(noun: str, prop: dict[str, Any]) -> str:
    low = next(((sym, prop[k]) for k, sym in _BOUNDS[:2] if k in prop), None)
    high = next(((sym, prop[k]) for k, sym in _BOUNDS[2:] if k in prop), None)
    if low and high:
        return f"{noun} in {'[' if low[0] == '≥' else '('}{_num(low[1])}, {_num(high[1])}{']' if high[0] == '≤' else ')'}"
    if low:
        return f"{noun} {low[0]} {_num(low[1])}"
    if high:
        return f"{noun} {high[0]} {_num(high[1])}"
    return noun


def _num(value: float) -> str:
    if float(value).is_integer():
        value = int(value)
        return f"{value:,}" if abs(value) < 10**12 else f"2^{value.bit_length() - 1}" if value & (value - 1) == 0 else str(value)
    return f"{value:g}"


def _default_text(prop: dict[str, Any]) -> str | None:
    if "default" not in prop:
        return None
    return json.dumps(prop["default"])


def config_markdown() -> str:
    """The config reference: a short index of the sections, then each section's keys."""
    sections = config_sections()
    lines = ["Sections: " + " · ".join(f"[`{title}`](#{_anchor(title)})" for title, _, _ in sections), ""]
    for title, description, entries in sections:
        lines += [f"## `{title}` {{#{_anchor(title)}}}", ""]
        if description:
            lines += [description, ""]
        for entry in entries:
            lines += _entry_markdown(entry)
    return "\n".join(lines)


def _entry_markdown(entry: dict[str, Any]) -> list[str]:
    """One key: its name, then one paragraph of its facts (type, default, sweepable) and meaning."""
    facts = [entry["type"]]
    if entry.get("required"):
        facts.append("required")
    elif entry["default"] is not None:
        facts.append(f"default `{entry['default']}`")
    if entry["sweepable"] is True:
        facts.append("sweepable")
    elif entry["sweepable"] is False:
        facts.append("not sweepable")
    text = f"<small>{' · '.join(facts)}</small>"
    if entry["description"]:
        text += f"<br>{entry['description']}"
    if entry.get("see"):
        text += f" Its keys: [`{entry['see']}`](#{_anchor(entry['see'])})."
    return [f"**`{entry['key']}`**", f":   {text}", ""]


def _anchor(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-").replace("--", "-")


# --------------------------------------------------------------------------------------------
# The command line: one section per command of the parser.


def cli_groups() -> list[tuple[str, str, list[tuple[str, str, argparse.ArgumentParser]]]]:
    """(title, description, commands) of each group of subcommands as `hpcrl --help` lists them: a group
    of the root parser whose lines name subcommands (the user's commands, the in-job entry points); a
    subcommand no group lists comes under "Commands". A command is (name, one-line help, parser)."""
    from hpcrl.cli import parser

    root = parser()
    subparsers = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in subparsers._choices_actions}

    def command(name: str) -> tuple[str, str, argparse.ArgumentParser]:
        sub = subparsers.choices[name]
        text = helps.get(name)
        return name, text if text and text != argparse.SUPPRESS else (sub.description or ""), sub

    groups, listed = [], set()
    for group in root._action_groups:
        names = [a.dest for a in group._group_actions if a.dest in subparsers.choices and not isinstance(a, argparse._SubParsersAction)]
        if names:
            groups.append((group.title or "Commands", group.description or "", [command(n) for n in names]))
            listed.update(names)
    seen = {id(subparsers.choices[n]) for n in listed}
    rest = []
    for name, sub in subparsers.choices.items():
        if id(sub) not in seen:  # an alias shares its command's parser
            seen.add(id(sub))
            rest.append(command(name))
    if rest:
        groups.append(("Commands", "", rest))
    return groups


def cli_commands() -> list[tuple[str, str, argparse.ArgumentParser]]:
    """Every subcommand, as (name, one-line help, parser), in the order `hpcrl --help` lists them."""
    return [c for _, _, commands in cli_groups() for c in commands]


def cli_markdown() -> str:
    from hpcrl.cli import parser

    root = parser()
    lines = ["```text", root.format_usage().strip(), "```", ""]
    if root.description:
        lines += [root.description, ""]
    lines += _arguments_markdown(root, skip_subcommands=True)
    if root.epilog:
        lines += [root.epilog, ""]
    groups = cli_groups()
    for title, description, commands in groups:
        lines += [f"## {title[0].upper() + title[1:]}", ""]
        if description:
            lines += [description[0].upper() + description[1:] + ("" if description.endswith(".") else "."), ""]
        lines += ["| command | what it does |", "| --- | --- |"]
        lines += [f"| [`{name}`](#hpcrl-{_anchor(name)}) | {_cell(text)} |" for name, text, _ in commands]
        lines.append("")
    for name, text, sub in cli_commands():
        lines += [f"## `hpcrl {name}` {{#hpcrl-{_anchor(name)}}}", ""]
        if text:
            lines += [text[0].upper() + text[1:] + ("" if text.endswith(".") else "."), ""]
        if sub.description and sub.description != text:
            lines += [sub.description, ""]
        lines += ["```text", sub.format_usage().strip(), "```", ""]
        lines += _arguments_markdown(sub)
        if sub.epilog:
            lines += [sub.epilog, ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Text inside a Markdown table cell: its pipes escaped."""
    return text.replace("|", "\\|")


def _arguments_markdown(p: argparse.ArgumentParser, *, skip_subcommands: bool = False) -> list[str]:
    lines = []
    for action in p._actions:
        if isinstance(action, argparse._HelpAction) or (skip_subcommands and isinstance(action, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        lines += [f"**`{_argument_name(action)}`**", f":   {_argument_facts(action)}", ""]
    return lines


def _argument_name(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar if isinstance(action.metavar, str) else action.dest
    takes = action.nargs != 0
    metavar = action.metavar or ("{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper())
    suffix = "" if not takes else f" [{metavar}]" if action.nargs == "?" else f" {metavar}"
    return ", ".join(action.option_strings) + suffix


def _argument_facts(action: argparse.Action) -> str:
    facts = []
    if action.help:
        facts.append(action.help % {"default": action.default, "prog": ""} if "%(" in action.help else action.help)
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        facts.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    if not action.option_strings:
        facts.append({"?": "optional", "*": "any number", "+": "one or more"}.get(action.nargs, "positional"))  # type: ignore[arg-type]
    elif action.required:
        facts.append("required")
    if action.option_strings and isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or ""):
        facts.append("repeatable")
    if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS) and action.nargs != 0:
        facts.append(f"default `{action.default}`")
    elif action.nargs == "?" and action.const is not None:
        facts.append(f"alone: `{action.const}`")
    return "; ".join(facts)
