"""The sweep's rules, which need the whole config: what `sweep.grid`, `sweep.search` and `sweep.when` may
vary, how many runs a sweep may have, that no two grid points are one run, that every grid point (with the
`sweep.when` settings it matches) and every value a search can draw makes a valid config, and that
`results.normalize` has the scores it needs. Each grid value is replaced by its typed value on the way."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from typing import Any

from hpcrl.config import tasks
from hpcrl.config.build import build_experiment, reading_stored, unused_by_program
from hpcrl.config.dotted import get_dotted, set_dotted
from hpcrl.config.experiment import NETWORK_KEYS, PROGRAM_UNUSED, Experiment
from hpcrl.config.hparams import ALGORITHMS, PPOConfig, minibatch_problem
from hpcrl.config.key_paths import is_sweepable, known_path, unknown_key
from hpcrl.config.limits import MAX_RUNS
from hpcrl.config.schema import ConfigError, Problems, did_you_mean, plain, public_fields
from hpcrl.config.sweep_spec import WhenRule


def check_normalize(exp: Experiment) -> None:
    """`results.normalize` needs random and reference scores for every env the runs train on: found
    missing at sweep time, not by the aggregate job after the training is spent."""
    if not exp.results.normalize:
        return
    if "env.id" in exp.sweep.grid:
        envs = list(exp.sweep.grid["env.id"])
    elif exp.results.task or exp.algo != "program":
        envs = [exp.results.task or exp.env.id]
    else:
        raise ConfigError("results.normalize: needs results.task with algo 'program' (the env id your program trains on)")
    scores = {task: dataclasses.asdict(ref) for task, ref in exp.results.scores.items()}
    tasks.normalizer(envs, tasks.references({"results": {"scores": scores}}))


def check_grid(exp: Experiment, data: dict[str, Any]) -> None:
    """What may be swept, how many runs a sweep may have, that no two grid points are one run, and
    that every grid point, with the `sweep.when` settings it matches, is a valid config.

    Each grid value is validated as part of a whole config, and replaced by its typed value (so
    `1e-3` and `0.001` are one value, found to repeat here rather than as one run id twice); so are
    the values `sweep.when` matches on.
    """
    grid = exp.sweep.grid
    problems = Problems()  # each grid key on its own: every misspelt key is named at once
    for key, values in grid.items():
        with problems.kept():
            _check_grid_key(exp, key, values)
    problems.raise_any()
    runs = math.prod(len(v) for v in grid.values()) * len(exp.sweep.seeds)
    if runs > MAX_RUNS:
        raise ConfigError(f"sweep.grid: {runs:,} runs (grid points x seeds) pass the limit of {MAX_RUNS:,}")
    base = copy.deepcopy(data)
    base.pop("sweep", None)
    if "algo" in grid:  # a value of another key is typed under the first algorithm of the grid
        base["algo"] = grid["algo"][0]
    for key, values in grid.items():
        with problems.kept():
            grid[key] = _typed_values(base, key, values, f"sweep.grid.{key}")
    problems.raise_any()
    _check_when(exp, base)


def _check_grid_key(exp: Experiment, key: str, values: list[Any]) -> None:
    """One key of `sweep.grid`: known (or a did-you-mean), sweepable, with values, swept once."""
    where = f"sweep.grid.{key}"
    if key != "algo" and not known_path(key, exp.algo):
        raise unknown_key(where, key, exp.algo)
    if exp.algo == "program" and key.split(".")[0] in PROGRAM_UNUSED + ("algo",):
        raise unused_by_program(where)
    if key != "algo" and not is_sweepable(key, exp.algo):
        raise ConfigError(f"{where}: cannot be swept: it changes how or where runs execute, not what they learn (set it once, outside the grid)")
    if not values:
        raise ConfigError(f"{where}: expected a non-empty list of values")
    for other in exp.sweep.grid:
        if other.startswith(key + "."):
            raise ConfigError(f"sweep.grid.{other}: overlaps sweep.grid.{key} (sweep each key once)")
    for value in values if key == "algo" else []:
        if not isinstance(value, str) or value not in ALGORITHMS:
            hint = did_you_mean(value, list(ALGORITHMS), quote=True) if isinstance(value, str) else ""
            raise ConfigError(
                f"sweep.grid.algo: expected values among {', '.join(map(repr, ALGORITHMS))} (a user's program is its own experiment), got {_show(value)}"
                + (f" ({hint})" if hint else "")
            )


def check_search(exp: Experiment, data: dict[str, Any]) -> None:
    """`sweep.search`: what may be searched (as for the grid, and never a key the grid sweeps), each
    distribution's bounds and options typed by the key's own field, and what an Optuna study needs
    (one seed per trial, hpcrl's own trainer, a metric it reports while it trains)."""
    search = exp.sweep.search
    if search is None:
        return
    base = copy.deepcopy(data)
    base.pop("sweep", None)
    for key, dist in search.space.items():
        where = f"sweep.search.space.{key}"
        if key == "algo" or not known_path(key, exp.algo):
            raise unknown_key(where, key, exp.algo) if key != "algo" else ConfigError(f"{where}: sweep algo in sweep.grid instead")
        if not is_sweepable(key, exp.algo):
            raise ConfigError(f"{where}: cannot be searched: it changes how or where runs execute, not what they learn")
        if any(key == g or key.startswith(g + ".") or g.startswith(key + ".") for g in exp.sweep.grid):
            raise ConfigError(f"{where}: also in sweep.grid (search or sweep a key, not both)")
        if dist.type == "choice":
            dist.values = _typed_values(base, key, dist.values, f"{where}.values")
            _check_network_memory(base, key, dist.values, f"{where}.values")
            continue
        low, high = _typed_values(base, key, [dist.low, dist.high], where)
        _check_network_memory(base, key, [high], where)  # the network is largest at the top of the range
        if dist.type != "int" and not isinstance(low, float):
            raise ConfigError(f"{where}: {key} takes integers: use type: int")
        if dist.type == "int" and isinstance(low, float):
            dist.low, dist.high = float(low), float(high)  # an int distribution of a float field: whole numbers
        elif dist.type == "int" and key in SPLIT_KEYS and not reading_stored():
            _check_split_range(exp, key, low, high, where)
    runs = math.prod(len(v) for v in exp.sweep.grid.values()) * len(exp.sweep.seeds) * (search.samples or search.n_trials or 1)
    if runs > MAX_RUNS:
        raise ConfigError(f"sweep.search: {runs:,} runs (grid points x samples x seeds) pass the limit of {MAX_RUNS:,}")
    if search.method != "optuna":
        return
    if exp.algo == "program" or exp.distributed is not None:
        raise ConfigError("sweep.search.method: optuna trains hpcrl's own PPO, A2C or DQN in its workers (not algo 'program' or a distributed run); use method random")
    if exp.sweep.grid:
        raise ConfigError("sweep.search.method: an Optuna study searches its space alone: move the keys of sweep.grid into sweep.search.space (type: choice)")
    if len(exp.sweep.seeds) != 1:
        raise ConfigError(f"sweep.seeds: an Optuna trial trains one seed, got {len(exp.sweep.seeds)} (the trial's value is that run's metric)")
    if search.metric == "eval" and exp.eval.every_steps is None:
        if search.pruner != "none":
            raise ConfigError(f"sweep.search.pruner: {search.pruner} has no intermediate metric: metric 'eval' needs eval.every_steps (or use metric: train)")
        raise ConfigError("sweep.search.metric: 'eval' needs eval.every_steps (the evaluations during training it reports)")


def _check_network_memory(base: dict[str, Any], key: str, values: list[Any], where: str) -> None:
    """Each value of a searched NETWORK_KEYS key that a search can draw, with the config's other values: a
    network it makes that outgrows resources.mem would fail its run when drawn, after the queue."""
    if key not in NETWORK_KEYS or reading_stored():
        return
    for value in values:
        point = copy.deepcopy(base)
        set_dotted(point, key, value, merge=True)
        if (problem := build_experiment(point, request=False)._network_memory_problem()) is not None:
            raise ConfigError(f"{where}={_show(value)}: {problem[0]}: {problem[1]}")


SPLIT_KEYS = ("env.num_envs", "train.num_steps", "train.num_minibatches", "train.recurrent_size")
"""The keys of PPO's split of a rollout into minibatches (`hparams.minibatch_problem`)."""


def _check_split_range(exp: Experiment, key: str, low: int, high: int, where: str) -> None:
    """Every value an int distribution of a SPLIT_KEYS key can draw, with the config's other values:
    a search draws any of them, and one that does not split the rollout would fail its Optuna trial
    when drawn, or the random search's expansion without naming the space."""
    if not isinstance(exp.train, PPOConfig) or (exp.train.num_minibatches == 1 and key != "train.num_minibatches"):
        return  # one minibatch splits any rollout
    shape = {"env.num_envs": exp.env.num_envs, "train.num_steps": exp.train.num_steps, "train.num_minibatches": exp.train.num_minibatches, "train.recurrent_size": exp.train.recurrent_size}
    for value in range(low, high + 1):
        at = {**shape, key: value}
        if problem := minibatch_problem(at["train.num_minibatches"], at["train.num_steps"], at["env.num_envs"], at["train.recurrent_size"] > 0, exp.resources.ranks):
            raise ConfigError(f"{where}={value} (of {low}..{high}): train.num_minibatches: {problem} (search the values that work, with type: choice)")


def _typed_values(base: dict[str, Any], key: str, values: list[Any], where: str) -> list[Any]:
    """Each value validated as one point on `base` and replaced by its typed value; no repeats."""
    typed_values: list[Any] = []
    given: list[Any] = []
    problems = Problems()  # every bad value of the key, one line each
    for value in values:
        point = copy.deepcopy(base)
        set_dotted(point, key, value, merge=True)
        try:
            # Typed alone: a request's rules join keys, and _check_when checks them on whole grid points (JOINED_KEYS).
            typed = _canonical(get_dotted(build_experiment(point, request=False), key), value)
        except ConfigError as exc:
            problems.errors.append(exc.within(f"{where}={_show(value)}: "))
            continue
        if typed in typed_values:
            raise ConfigError(f"{where}: {_show(value)} repeats {_show(given[typed_values.index(typed)])} (the same value once typed)")
        typed_values.append(typed)
        given.append(value)
    problems.raise_any()
    return typed_values


def when_settings(rules: list[WhenRule], point: dict[str, Any]) -> list[tuple[str, Any]]:
    """The settings of every `sweep.when` rule that a grid point matches, in rule order: applied one
    after the other, each merged like a grid point's mapping, so a later rule wins key by key."""
    return [item for rule in rules if all(key in point and point[key] == value for key, value in rule.match.items()) for item in rule.set.items()]


JOINED_KEYS = (
    "env", "env.num_envs", "train", "train.num_steps", "train.num_minibatches",
    "train.total_steps", "train.learning_starts", "train.train_freq", "train.gradient_steps", "train.batch_size", "train.buffer_size",
    *NETWORK_KEYS,
)
"""Grid keys that the config's cross-field rules join (a PPO rollout's size and its split into
minibatches, when a DQN trains, the network's size against resources.mem): each value valid on the
base config, two of them can still make a point that is not (`env.num_envs: [2, 3]` with
`train.num_minibatches: [2, 128]`), so every combination of their values is validated, and named,
as one point."""


def _check_when(exp: Experiment, base: dict[str, Any]) -> None:
    """`sweep.when`: matches name swept keys and their grid values; sets name keys that are not
    swept. Then every combination of the keys that rules match on (and `algo`, whose train section
    differs, and the JOINED_KEYS) is validated with the settings it gets, and every other grid value
    with each of them."""
    grid, rules = exp.sweep.grid, exp.sweep.when
    algos = grid.get("algo", [exp.algo])
    for i, rule in enumerate(rules):
        for key, value in rule.match.items():
            where = f"sweep.when[{i}].match.{key}"
            if key not in grid:
                raise ConfigError(f"{where}: not swept (a rule matches on keys of sweep.grid: {', '.join(grid) or 'none'})")
            typed = _typed_values(base, key, [value], where)[0]
            if typed not in grid[key]:
                raise ConfigError(f"{where}: {_show(value)} is not one of the grid's values ({', '.join(map(_show, grid[key]))})")
            rule.match[key] = typed
        for key in rule.set:
            where = f"sweep.when[{i}].set.{key}"
            if not any(known_path(key, algo) for algo in algos) or key == "algo":
                raise unknown_key(where, key, algos[0]) if key != "algo" else ConfigError(f"{where}: sweep algo in sweep.grid instead")
            if any(key == g or key.startswith(g + ".") or g.startswith(key + ".") for g in grid):
                raise ConfigError(f"{where}: swept in sweep.grid (a rule sets keys that are not swept)")
            if not all(is_sweepable(key, algo) for algo in algos if known_path(key, algo)):
                raise ConfigError(f"{where}: cannot vary between runs: it changes how or where runs execute, not what they learn")
    joined = [] if reading_stored() else [k for k in grid if k in JOINED_KEYS]  # their rules are a request's (request_problems)
    cond = list(dict.fromkeys([k for rule in rules for k in rule.match] + (["algo"] if "algo" in grid else []) + joined))
    if not rules and not cond:
        return  # every value was validated on the base config, which is each point's
    others = [k for k in grid if k not in cond]
    for combo in itertools.product(*(grid[k] for k in cond)):
        point_values = dict(zip(cond, combo))
        extra = when_settings(rules, point_values)
        label = ", ".join(f"{k}={_show(v)}" for k, v in point_values.items()) or "every point"
        point = copy.deepcopy(base)
        for key, value in [*point_values.items(), *extra]:
            set_dotted(point, key, value, merge=True)
        try:
            build_experiment(point)
            for key in others:
                _typed_values(point, key, grid[key], f"sweep.grid.{key}")
        except ConfigError as exc:
            raise exc.within(f"sweep: the grid point {label}{' with sweep.when settings' if extra else ''}: ") from None


def _canonical(typed: Any, given: Any) -> Any:
    """The typed value of a grid point, keeping only the keys a mapping point named."""
    if dataclasses.is_dataclass(typed):
        typed = {name: getattr(typed, name) for name in public_fields(type(typed))}
    if isinstance(typed, dict) and isinstance(given, dict):
        return {k: _canonical(typed[k], given[k]) for k in given}
    return copy.deepcopy(typed)


def _show(value: Any) -> str:
    return repr(plain(value))
