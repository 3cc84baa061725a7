"""Every declared bound of the config schema, probed at its edge through `hpcrl sweep --dry-run`: the
value at the bound is accepted, one step past it (1 for an integer, the next float for a number) is
refused with one line naming the file and the key, exit 2, nothing written.

The keys and bounds come from the schema's own metadata (each field's `setting(ge=, le=, ...)`, walked
from `Experiment` and each algorithm's train config, as `hpcrl schema` walks them), so a bound added
tomorrow is probed too. Issue 25: a mutant that checked bounds only far from the edge accepted
`env.num_envs: 5000` where the bound is 4096, and the suite passed.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import pytest
import yaml
from factories import TINY, deep_update
from test_config_hostile import DQN_TRAIN, assert_refused, sweep

from hpcrl.config.experiment import Experiment
from hpcrl.config.hparams import ALGORITHMS, TrainConfig
from hpcrl.config.json_schema import config_schema
from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError, Rules, field_rules, hints, public_fields

BOUNDS = ("ge", "gt", "le", "lt")
SECTION_BASES: dict[str, dict[str, Any]] = {
    "distributed": {"algo": "dqn", "train": DQN_TRAIN, "resources": {"max_concurrent": 3}},  # Ape-X is DQN's: a learner and 2 actors
    "sweep": {"sweep": {"seeds": [0], "search": {"space": {"train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}}, "samples": 2}}},
    "program": {
        "algo": "program", "train": None, "env": None, "eval": None,
        "program": {"command": [sys.executable, "-c", "pass"], "eval": {"command": [sys.executable, "-c", "pass"]}},
    },  # fmt: skip
}
"""What a key's section needs to be valid at all, replacing TINY's top-level keys (None: a key it must not have)."""


@dataclasses.dataclass(frozen=True)
class Bound:
    algo: str | None
    """The algorithm whose train config declares the key (None: a key outside `train`)."""
    key: str
    number: type
    """int or float."""
    in_list: bool
    side: str
    """ge, gt, le or lt."""
    at: float
    items: int = 1
    """How many items a list key is given (its least allowed number), each the probed value."""

    def __str__(self) -> str:
        return f"{self.algo + ':' if self.algo else ''}{self.key}-{self.side}-{self.at:g}"

    def edge(self) -> tuple[float, float]:
        """(the value at the bound or the nearest one inside, the nearest one outside)."""
        up = self.side in ("le", "lt")
        inclusive = self.side in ("ge", "le")
        if self.number is int:
            step = 1 if up else -1
            inside = self.at if inclusive else self.at - step
            return int(inside), int(inside + step)
        past = math.nextafter(self.at, math.inf if up else -math.inf)
        return (self.at, past) if inclusive else (math.nextafter(self.at, -math.inf if up else math.inf), self.at)


def _number_type(tp: Any) -> tuple[Any, bool]:
    """(the scalar type under Optional and list, whether it is a list's element)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _number_type(inner[0]) if len(inner) == 1 else (None, False)
    if origin is list:
        return _number_type(args[0])[0], True
    return tp, False


def _walk(cls: type, path: str, algo: str | None) -> Iterator[Bound]:
    for name in public_fields(cls):
        if cls is Experiment and name == "train":
            continue  # each algorithm's fields, below
        key = f"{path}.{name}" if path else name
        tp, in_list = _number_type(hints(cls)[name])
        rules: Rules = field_rules(cls)[name]
        if dataclasses.is_dataclass(tp):
            yield from _walk(tp, key, algo)
        for side in BOUNDS:
            if getattr(rules, side) is not None:
                assert tp in (int, float), f"{key}: a bound on {tp}: teach this test"
                yield Bound(algo, key, tp, in_list, side, getattr(rules, side), max(1, rules.min_items))


def declared_bounds() -> list[Bound]:
    out = list(_walk(Experiment, "", None))
    for algo, cls in ALGORITHMS.items():
        out += _walk(cls, "train", algo)
    return out


BOUNDED = declared_bounds()


def test_the_walk_finds_the_bounds_the_json_schema_publishes() -> None:
    """The same metadata as `hpcrl schema`: every key with a minimum or maximum there is probed here."""
    published: set[str] = set()

    def visit(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if any(k in node for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
                published.add(path)
            for k, v in node.items():
                visit(v, f"{path}.{k}" if k not in ("properties", "anyOf", "allOf", "items", "then", "if") and not k.isdigit() else path)
        elif isinstance(node, list):
            for v in node:
                visit(v, path)

    schema = config_schema()
    for name, prop in schema["properties"].items():
        visit(prop, name)
    for rule in schema["allOf"]:
        for name, prop in rule["then"]["properties"]["train"]["properties"].items():
            visit(prop, f"train.{name}")
    probed = {b.key for b in BOUNDED}
    assert published == probed
    assert Bound(None, "env.num_envs", int, False, "le", 4096) in BOUNDED


def _nest(key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def _config(tmp_path: Path, bound: Bound, value: float) -> Path:
    base = deep_update(TINY, {"output": str(tmp_path / "logs")})
    section = bound.key.split(".")[0]
    if bound.algo is not None:
        base["algo"] = bound.algo
        if bound.algo == "dqn":
            base["train"] = dict(DQN_TRAIN)
        elif bound.algo != "ppo":
            base["train"] = {k: v for k, v in base["train"].items() if k in public_fields(ALGORITHMS[bound.algo])}
        if bound.algo == "alphazero":  # it plays two-player games
            base["env"] = {"backend": "game", "id": "hpcrl.games.tictactoe:TicTacToe", "num_envs": 1}
    elif section in SECTION_BASES:
        base.update(SECTION_BASES[section])
    base = {k: v for k, v in base.items() if v is not None}
    data = deep_update(base, _nest(bound.key, [value] * bound.items if bound.in_list else value))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("bound", BOUNDED, ids=str)
def test_every_declared_bound_holds_at_its_edge(tmp_path: Path, bound: Bound) -> None:
    inside, outside = bound.edge()
    own = f": {bound.key}{'[0]' if bound.in_list else ''}: expected"
    try:  # loaded, not swept: a dry run of `sweep.search.samples: 100000` would expand 100,000 runs
        load_experiment(_config(tmp_path, bound, inside))
    except ConfigError as exc:  # refused by a rule that joins keys (a DQN batch at most its buffer), never by its own bound
        assert own not in str(exc), f"{bound.key}={inside!r} is within its bound: {exc}"
    code, stderr = sweep(_config(tmp_path, bound, outside))
    assert_refused(tmp_path, code, stderr, bound.key)
    assert own in stderr and str(tmp_path / "config.yaml") in stderr, stderr


def test_a_default_changed_in_a_subclass_keeps_the_rules_its_base_declared() -> None:
    """Issue 37 item 7: AlphaZeroConfig and DQNConfig give `hidden_sizes` a default of their own
    (through `setting(factory=...)`, as a list needs) and had lost TrainConfig's bounds with it:
    `[0]` and `[-5]` passed the sweep. A setting that names no rule declares none."""
    base = field_rules(TrainConfig)
    for algo, cls in ALGORITHMS.items():
        for name in ("hidden_sizes", "lr", "max_grad_norm", "checkpoint_every"):
            assert field_rules(cls)[name] == base[name], (algo, name)
    assert base["hidden_sizes"].ge == 1 and base["hidden_sizes"].min_items == 1
