"""Random malformed values for every config key, through the real CLI (`hpcrl sweep`).

The keys are found by walking the config dataclasses, so a field added later is covered without
editing this file. Each value goes into an otherwise valid config; the sweep must then either run
(with `--dry-run`, for values that happen to be valid) or refuse with exit 2 and one line on stderr
for each problem (a malformed mapping may hold several), and write nothing. A value this file's oracle knows to be invalid for the field's type
(`must_refuse`) must be refused, and the line must name the key path.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import tempfile
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Literal, Union

import pytest
import yaml
from factories import TINY, deep_update
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hpcrl.cli import main
from hpcrl.config.experiment import Experiment
from hpcrl.config.hparams import ALGORITHMS
from hpcrl.config.schema import MAX_PROBLEMS, Verbatim, hints, public_fields

NEGATIVE_OK = {"eval.threshold"}
"""Float fields where a negative value is meaningful (a return threshold); every other number of
the schema is a count, a size, a rate or a coefficient that cannot be negative."""

BASES: dict[str, dict[str, Any]] = {
    "ppo": TINY,
    "a2c": {**TINY, "algo": "a2c", "train": {"total_steps": 1024, "num_steps": 16, "hidden_sizes": [16]}},
    "dqn": {
        **TINY,
        "algo": "dqn",
        "train": {"total_steps": 1000, "buffer_size": 500, "batch_size": 32, "learning_starts": 100, "hidden_sizes": [16]},
        "distributed": {"actors": 1},
    },
    "program": {
        **{k: v for k, v in TINY.items() if k not in ("env", "train")},
        "algo": "program",
        "program": {"command": ["true"], "params": {"lr": 0.1}, "eval": {"command": ["true"]}},
    },
}


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """(type without Optional, whether None is allowed)."""
    if typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp):
        return next(a for a in typing.get_args(tp) if a is not type(None)), True
    return tp, False


def config_keys() -> list[tuple[str, str, Any]]:
    """(algo, dotted key, declared type) for every key of the schema, sections included."""
    out: list[tuple[str, str, Any]] = []

    def walk(cls: type, prefix: str, algo: str) -> None:
        for name in public_fields(cls):
            tp = ALGORITHMS[algo] if (cls is Experiment and name == "train") else hints(cls)[name]
            out.append((algo, prefix + name, tp))
            inner, _ = _unwrap(tp)
            if dataclasses.is_dataclass(inner):
                walk(inner, f"{prefix}{name}.", algo)

    walk(Experiment, "", "ppo")
    out += [("a2c", k, tp) for _, k, tp in _train_keys("a2c")]
    out += [("dqn", k, tp) for _, k, tp in _train_keys("dqn")]
    out += [(a, k, tp) for a, k, tp in _dqn_distributed_keys(out)]
    out += [("program", k, tp) for a, k, tp in out if a == "ppo" and k.startswith("program")]
    return [(a, k, tp) for a, k, tp in out if not (a == "ppo" and k.startswith(("distributed", "program")))]


def _train_keys(algo: str) -> list[tuple[str, str, Any]]:
    return [(algo, f"train.{name}", hints(ALGORITHMS[algo])[name]) for name in public_fields(ALGORITHMS[algo])]


def _dqn_distributed_keys(keys: list[tuple[str, str, Any]]) -> list[tuple[str, str, Any]]:
    return [("dqn", k, tp) for a, k, tp in keys if a == "ppo" and k.startswith("distributed")]


KEYS = config_keys()
_LINE_BREAK = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def must_refuse(tp: Any, value: Any, key: str) -> bool:
    """Whether `value` is invalid for a field of type `tp` by rules every field of that type obeys."""
    tp, optional = _unwrap(tp)
    if tp is Any:
        return False
    if tp is Verbatim:  # a program's parameter: a word, a number, or a list or mapping of them
        if isinstance(value, dict):
            return any(must_refuse(Verbatim, v, key) for v in value.values())
        items = value if isinstance(value, list) else [value]
        return any(
            isinstance(v, (list, dict)) or (isinstance(v, float) and not math.isfinite(v)) or (isinstance(v, str) and _LINE_BREAK.search(v))
            for v in items
        )
    if value is None:
        return not optional
    if isinstance(value, str) and _LINE_BREAK.search(value):
        return True  # no string of a config holds a line break, nor is one a number
    non_finite = isinstance(value, float) and not math.isfinite(value)
    origin = typing.get_origin(tp)
    if tp is bool:
        return not isinstance(value, bool)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or non_finite:
            return True
        return value != int(value) or value < 0 or abs(value) > 2**53
    if tp is float:
        if isinstance(value, bool) or isinstance(value, (list, dict)) or non_finite:
            return True
        if isinstance(value, str):
            return not _NUMBER.fullmatch(value) or not math.isfinite(float(value))
        return value < 0 and key not in NEGATIVE_OK
    if tp is str:
        return isinstance(value, (bool, list, dict))
    if origin is Literal:
        return not (isinstance(value, str) and value in typing.get_args(tp))
    if origin is list:
        return not isinstance(value, list) or any(must_refuse(typing.get_args(tp)[0], v, key) for v in value)
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        return not isinstance(value, dict) or any(
            must_refuse(key_tp, k, key) or must_refuse(value_tp, v, key) or (isinstance(v, str) and _LINE_BREAK.search(v)) for k, v in value.items()
        )
    if dataclasses.is_dataclass(tp):
        return not isinstance(value, dict) or any(k not in public_fields(tp) for k in value)
    return False


line_break = st.builds(lambda a, b, c: f"{a}{b}{c}", st.text(max_size=6), st.sampled_from(["\n", "\r", "\r\n", "\x0b", "\x85", "\u2028"]), st.text(max_size=6))
garbage = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
malformed = st.one_of(
    line_break,
    st.sampled_from([math.nan, math.inf, -math.inf, "nan", "-inf", "", "fast", [], {}, None, True, False, 1e300, -1e300]),
    st.integers(max_value=-1),
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
    st.integers(min_value=2**53 + 1, max_value=10**40),
    st.lists(line_break, min_size=1, max_size=2),
    garbage,
)


def config_with(tmp: Path, algo: str, key: str, value: Any) -> Path:
    data = deep_update(BASES[algo], {"output": str(tmp / "logs")})
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=False))
    return path


@contextmanager
def workdir() -> Iterator[Path]:
    """A fresh directory, made the working directory (a relative `output` would land in it)."""
    old = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(old)


def run_sweep(config: Path, dry_run: bool) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = main(["sweep", str(config), "--scheduler", "local", *(["--dry-run"] if dry_run else [])])
    return code, err.getvalue()


def check(algo: str, key: str, tp: Any, value: Any, dry_run: bool) -> None:
    with workdir() as tmp:
        config = config_with(tmp, algo, key, value)
        code, stderr = run_sweep(config, dry_run)
        written = sorted(p.name for p in tmp.iterdir() if p.name != "config.yaml")
    if must_refuse(tp, value, key):
        assert code == 2, f"{key}={value!r} was accepted"
        assert re.search(rf": {re.escape(key)}(\.|\[|:| |=)", stderr), f"{key}={value!r}: {stderr}"
    assert code in (0, 2), stderr
    if code == 2:
        lines = stderr.splitlines()  # one line per problem of the config, each the whole story
        assert stderr.endswith("\n") and 1 <= len(lines) <= MAX_PROBLEMS and all(line.startswith("hpcrl: error: ") for line in lines), stderr
        assert written == [], f"{key}={value!r} wrote {written}"


@pytest.mark.parametrize("algo,key,tp", KEYS, ids=[f"{a}:{k}" for a, k, _ in KEYS])
@settings(max_examples=4, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=malformed)
def test_every_key_refuses_malformed_values_in_one_line(algo: str, key: str, tp: Any, value: Any) -> None:
    check(algo, key, tp, value, dry_run=True)


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(target=st.sampled_from(KEYS), value=malformed)
def test_a_real_sweep_with_a_malformed_value_writes_nothing(target: tuple[str, str, Any], value: Any) -> None:
    """Without --dry-run only values that must be refused are fed: a valid one would start training."""
    algo, key, tp = target
    assume(must_refuse(tp, value, key))
    check(algo, key, tp, value, dry_run=False)


def test_the_walk_finds_every_section() -> None:
    keys = {k for _, k, _ in KEYS}
    assert {"name", "train.lr", "train.clip_coef", "train.rms_alpha", "train.buffer_size", "resources.partition",
            "distributed.redis.address", "image.python", "sweep.seeds", "eval.gpus", "env.kwargs"} <= keys
