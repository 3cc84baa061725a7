"""What a dotted key of a config names (`train.lr`, `env.kwargs.frame_skip`): a field of the schema or not,
with a did-you-mean for a typo; whether it changes what a run learns (and so its id) and whether a sweep
may vary it; Hydra's sweep syntax in an override, refused with the grid key to write instead."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import types
import typing
from typing import Any, Union

from hpcrl.config.experiment import Experiment
from hpcrl.config.hparams import ALGORITHMS, NATURE_CNN, TrainConfig
from hpcrl.config.schema import ConfigError, Verbatim, did_you_mean, field_rules, hints, public_fields


def _field_type(cls: Any, part: str, algo: str) -> Any:
    tp = ALGORITHMS.get(algo, TrainConfig) if (cls is Experiment and part == "train") else hints(cls)[part]
    if typing.get_origin(tp) in (Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def known_path(dotted: str, algo: str) -> bool:
    """Whether a dotted key names a field of the schema (so `-p` and the grid fail on typos)."""
    cls: Any = Experiment
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if cls is None or not dataclasses.is_dataclass(cls):
            # Inside a free-form mapping (env.kwargs, container.env): any key is allowed.
            return cls is dict
        if part not in public_fields(cls):
            return False
        tp = _field_type(cls, part, algo)
        if typing.get_origin(tp) is dict:
            return True
        cls = tp if dataclasses.is_dataclass(tp) else (None if i < len(parts) - 1 else tp)
    return True


def known_paths(algo: str) -> list[str]:
    """Every dotted key of a setting of the schema for `algo` (`train.lr`, `resources.ranks`, ...)."""
    out: list[str] = []

    def walk(cls: Any, prefix: str) -> None:
        for name in public_fields(cls):
            tp = _field_type(cls, name, algo)
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{name}.")
            else:
                out.append(prefix + name)

    walk(Experiment, "")
    return out


def unknown_key(where: str, key: str, algo: str) -> ConfigError:
    """`unknown key`, with the closest known keys when one is close (`train.lrr`: did you mean
    train.lr?), and else the keys whose last part is close to the key's (`lr`, `trian.num_env`: the
    section left out or misspelt: did you mean train.lr?, env.num_envs?)."""
    paths = known_paths(algo)
    hint = did_you_mean(key, paths) or leaf_hint(key, paths)
    return ConfigError(f"{where}: unknown key" + (f" ({hint})" if hint else ""))


def leaf_hint(key: str, paths: list[str]) -> str:
    """`did you mean train.lr?` for `lr`: the known keys whose last part is close to the key's last
    part (a key written without its section, or in the wrong one), or ''."""
    leaf = key.rpartition(".")[2]
    close = difflib.get_close_matches(leaf, list(dict.fromkeys(p.rpartition(".")[2] for p in paths)), n=2, cutoff=0.7)
    found = [p for name in close for p in paths if p.rpartition(".")[2] == name][:2]
    return f"did you mean {' or '.join(found)}?" if found else ""


def check_hydra_sweep(key: str, value: Any, text: str, algo: str) -> None:
    """Hydra's sweep syntax in an override (`train.lr=1e-3,3e-4`, `train.lr=choice(1e-3,3e-4)`):
    hpcrl sweeps what `sweep.grid` lists, so the override is refused with the grid key to write,
    where the key is one a grid may vary and holds one value of the schema (a free-form value,
    such as a program's parameter `--gpus 0,1`, may hold a comma; a list is written in brackets)."""
    if not isinstance(value, str) or "," not in value:
        return
    if key != "algo" and (not known_path(key, algo) or _free_form(key, algo) or not is_sweepable(key, algo)):
        return
    raw = text.split("=", 1)[1].strip()
    if found := re.fullmatch(r"choice\((.*)\)", raw):
        raw = found.group(1)
    raise ConfigError(
        f"-p {key}={text.split('=', 1)[1].strip()}: Hydra's sweep syntax; hpcrl sweeps the lists in sweep.grid: "
        f"write sweep.grid.{key}=[{raw}]"
    )


def _free_form(dotted: str, algo: str) -> bool:
    """Whether a (known) dotted key holds a free-form value or a list rather than one typed scalar."""
    cls: Any = Experiment
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return True  # inside a free-form mapping (env.kwargs, program.params)
        cls = _field_type(cls, part, algo)
    return cls in (Any, Verbatim) or typing.get_origin(cls) in (list, dict) or dataclasses.is_dataclass(cls)


def _path_rules(dotted: str, algo: str) -> list[Any]:
    """The rules of each field along a (known) dotted key, down to a free-form mapping."""
    cls: Any = Experiment
    out = []
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            break  # inside a free-form mapping, which its field already answered for
        out.append(field_rules(cls)[part])
        cls = _field_type(cls, part, algo)
    return out


def is_learned(dotted: str, algo: str) -> bool:
    """Whether the setting at a (known) dotted key changes what a run learns. Settings that change
    only how or where it runs (`resources.*`, `train.device`, `train.checkpoint_every`, ...) are
    declared `learned=False` on their fields: a run id need not hash them."""
    return all(rules.learned for rules in _path_rules(dotted, algo))


def is_sweepable(dotted: str, algo: str) -> bool:
    """Whether a grid may vary the setting: what is learned, and how runs are evaluated (`eval.*`
    but `eval.gpus`)."""
    return all(rules.in_grid for rules in _path_rules(dotted, algo))


def learned_settings(exp: Experiment) -> dict[str, Any]:
    """The typed values of every setting that changes what is learned (nested like `to_dict()`):
    what a run id should hash, so `1e-3`, `0.001` and a default left out hash alike."""

    def keep(obj: Any) -> Any:
        if not dataclasses.is_dataclass(obj):
            return copy.deepcopy(obj)
        rules = field_rules(type(obj))
        return {name: keep(getattr(obj, name)) for name in public_fields(type(obj)) if rules[name].learned}

    learned = keep(exp)
    if exp.algo == "program":  # hpcrl's own env and trainer settings do not reach the user's program
        del learned["env"], learned["train"]
    else:  # the ids of hpcrl's own runs stay what they were before programs existed
        del learned["program"]
    if exp.resources.ranks > 1:  # every rank steps env.num_envs envs: the batch grows with the ranks
        learned["ranks"] = exp.resources.ranks
    for dotted, before in _LATER_KEYS.items():
        section, key = dotted.split(".")
        values = learned.get(section)
        if isinstance(values, dict) and values.get(key) == before:
            del values[key]
    return learned


_LATER_KEYS: dict[str, Any] = {"train.async_rollout": "auto", "train.cnn_channels": list(NATURE_CNN), "distributed.ratio_slack": 0.0, "train.value_target_q": 0.0}
"""Learned keys added after run ids existed, with the value that trains as runs did before the key:
left out of the hash at that value, so the ids of existing runs stay what they were (`auto` is
hpcrl's own choice per env kind; the Nature CNN was the only CNN; the learner held its ratio exactly)."""
