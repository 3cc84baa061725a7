"""A config's plain data into the typed `Experiment`: `train:` built as the chosen algorithm's class, a
user's program's flat Hydra keys nested, every section's problems found at once, then the rules that join
fields and, unless configs a sweep wrote are read (`stored_configs`), those of a request."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from hpcrl.config.container_spec import ImageConfig
from hpcrl.config.experiment import PROGRAM_UNUSED, Experiment
from hpcrl.config.hparams import ALGORITHMS, TrainConfig
from hpcrl.config.key_paths import known_paths, leaf_hint
from hpcrl.config.schema import ConfigError, Problems, build, choice_problem


def algo_of(data: dict[str, Any]) -> str:
    """The config's `algo` (PPO where it names none), checked first: it picks the class `train:` is built as."""
    algo = data.get("algo", "ppo")
    if not isinstance(algo, str) or algo not in (*ALGORITHMS, "program"):
        raise ConfigError(f"algo: {choice_problem(algo, (*ALGORITHMS, 'program'))}")
    return algo


def unused_by_program(key: str) -> ConfigError:
    return ConfigError(f"{key}: not used with algo 'program' (hpcrl does not train; give your program's settings in program.params or program.args)")


def _nest_params(data: dict[str, Any]) -> None:
    """`program.params` may be written flat with Hydra's dotted keys (`habitat_baselines.rl.ppo.lr: 2.5e-4`):
    stored nested, as the sweep grammar addresses them (`program.params.habitat_baselines.rl.ppo.lr`)."""
    program = data.get("program")
    params = program.get("params") if isinstance(program, dict) else None
    if not isinstance(params, dict) or not any(isinstance(k, str) and "." in k for k in params):
        return
    nested: dict[str, Any] = {}
    for key, value in params.items():
        parts = key.split(".") if isinstance(key, str) else [key]
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"program.params.{key}: {part} is both a value and a mapping")
        if parts[-1] in node:
            raise ConfigError(f"program.params.{key}: given twice (flat and nested)")
        node[parts[-1]] = value
    data["program"] = {**program, "params": nested}


def build_experiment(data: dict[str, Any], *, request: bool | None = None) -> Experiment:
    """The dataclasses of plain data; `train` takes the class of the chosen algorithm. `request`: whether the rules of
    a request hold (`Experiment.request_problems`); by default, unless configs a sweep wrote are read (`stored_configs`)."""
    data = dict(data)
    algo = algo_of(data)
    if algo == "program":
        if unused := [key for key in PROGRAM_UNUSED if key in data]:
            raise ConfigError(*(str(unused_by_program(key)) for key in unused))
        _nest_params(data)
    train_data = data.pop("train", None)
    image_data = data.pop("image", None)
    problems = Problems()  # the sections are built apart: a problem in one leaves the others looked at
    paths = known_paths(algo)
    with problems.kept():
        exp = build(Experiment, data, "", elsewhere=lambda key: leaf_hint(key, paths))
    with problems.kept():
        train = build(ALGORITHMS.get(algo, TrainConfig), {} if train_data is None else train_data, "train", elsewhere=lambda key: leaf_hint(key, [p for p in paths if not p.startswith("train.")]))
    with problems.kept():
        image = None if image_data is None else build(ImageConfig, image_data, "image")
    problems.raise_any()
    exp.train, exp.image = train, image
    if found := exp.check():  # again: train was a TrainConfig when build() checked it first
        raise ConfigError(*(f"{key}: {message}" for key, message in found))
    if (not reading_stored() if request is None else request) and (found := exp.request_problems()):
        raise ConfigError(*(f"{key}: {message}" for key, message in found))
    return exp


_STORED: contextvars.ContextVar[bool] = contextvars.ContextVar("hpcrl_stored_configs", default=False)


@contextlib.contextmanager
def stored_configs() -> Iterator[None]:
    """Read configs that a sweep wrote (an experiment's and its runs'): each field's own bounds and the rules of
    `Experiment.check` hold for them, the rules of `Experiment.request_problems` do not, so that an experiment
    written before those rules existed still loads for status, collect and its jobs in flight."""
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


def reading_stored() -> bool:
    """Whether configs a sweep wrote are being read (`stored_configs`): the sweep's rules that a request must
    meet (`hpcrl.config.sweep_rules`) then pass, as `Experiment.request_problems` does."""
    return _STORED.get()
