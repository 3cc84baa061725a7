"""`hpcrl schema`: a JSON Schema of the config, for editors (yaml-language-server completes and
checks a YAML file that names it).

It is generated from the same typed fields and bounds that validation uses (`hpcrl.config.schema`'s
`setting()` rules and the sections' dataclasses in `hpcrl.config`), never written by hand, so the two cannot
drift. The schema holds what is per key: keys, types, choices, bounds and list lengths, and each
field's docstring as its description. Rules that join several keys (a rollout's size, `nodes`
dividing `ranks`, a grid point that breaks another key) stay with `hpcrl sweep`, which checks them
before anything is written: the schema accepts a few configs that hpcrl refuses, never the reverse.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from typing import Any, Literal, Union

from hpcrl.config.experiment import Experiment
from hpcrl.config.hparams import ALGORITHMS
from hpcrl.config.limits import MAX_RUNS
from hpcrl.config.schema import _NUMBER, Rules, Verbatim, field_rules, hints, public_fields
from hpcrl.config.sweep_spec import SweepConfig

DIALECT = "https://json-schema.org/draft/2020-12/schema"
_SEED_RANGE = r"^\s*\d+\s*\.\.\s*\d+\s*$"


def config_schema() -> dict[str, Any]:
    """The schema of an experiment config: `train` takes the fields of the config's `algo`."""
    top = _object(Experiment, skip=("train",))
    top["properties"]["train"] = {"type": "object", "description": "The algorithm's hyperparameters: the fields depend on algo."}
    top["allOf"] = [
        {"if": {"properties": {"algo": {"const": algo}}}, "then": {"properties": {"train": _object(cls)}}}  # an absent algo is ppo's default
        for algo, cls in ALGORITHMS.items()
    ]
    return {"$schema": DIALECT, "title": "hpcrl experiment config", **top}


def _object(cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    docs = _field_docs(cls)
    rules = field_rules(cls)
    properties: dict[str, Any] = {}
    required = []
    for name, f in public_fields(cls).items():
        if name in skip:
            continue
        prop = _typed(hints(cls)[name], rules[name])
        if cls is SweepConfig and name == "seeds":  # the shorthand: a count or an inclusive range
            prop = {"anyOf": [prop, {"type": "integer", "minimum": 1, "maximum": MAX_RUNS}, {"type": "string", "pattern": _SEED_RANGE}]}
        if name in docs:
            prop["description"] = docs[name]
        default = _default(f)
        if default is not dataclasses.MISSING:
            prop["default"] = default
        properties[name] = prop
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(name)
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = required
    if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):
        out["description"] = " ".join(cls.__doc__.split())
    return out


def _typed(tp: Any, rules: Rules) -> dict[str, Any]:
    """The schema of a value of type `tp`; bounds apply to numbers (and to each element of a list)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is Verbatim:
        return {}
    if origin in (Union, types.UnionType):
        options = [_typed(a, rules) for a in args if a is not type(None)]
        if type(None) in args:
            options.append({"type": "null"})
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin is Literal:
        return {"enum": list(args)}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", **_bounds(rules)}
    if tp is float:  # YAML 1.1 reads 3e-4 (no dot) as a string, and hpcrl takes it as the number it spells
        return {"anyOf": [{"type": "number", **_bounds(rules)}, {"type": "string", "pattern": f"^(?:{_NUMBER.pattern})$"}]}
    if tp is str:  # a number where a string is expected keeps its text (account: 0x1f)
        return {"type": ["string", "number"]}
    if origin is list:
        out = {"type": "array", "items": _typed(args[0], rules)}
        if rules.min_items:
            out["minItems"] = rules.min_items
        if rules.max_items is not None:
            out["maxItems"] = rules.max_items
        return out
    if origin is dict:
        return {"type": "object", "additionalProperties": _typed(args[1], Rules())}
    if dataclasses.is_dataclass(tp):
        return _object(tp)
    raise TypeError(f"no JSON Schema for {tp!r}")  # a new kind of field: teach this function


def _bounds(rules: Rules) -> dict[str, float]:
    names = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    return {key: getattr(rules, attr) for attr, key in names.items() if getattr(rules, attr) is not None}


def _default(f: dataclasses.Field) -> Any:
    value = f.default if f.default is not dataclasses.MISSING else (f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
    if value is dataclasses.MISSING or dataclasses.is_dataclass(value):
        return dataclasses.MISSING
    return value if isinstance(value, (bool, int, float, str, list, dict, type(None))) else dataclasses.MISSING


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of `cls` and its bases (`x: int = 1` then `\"\"\"why\"\"\"`)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs
