"""The `sweep:` section: which runs an experiment holds (seeds, a grid, rules per grid point, a search).

These classes hold each key's own rules; the rules that join the sweep with the rest of the config (what
may be swept, how many runs, duplicate points) are in hpcrl.config.sweep_rules, which knows every key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Optional

from hpcrl.config.limits import MAX_RUNS, MAX_SEED
from hpcrl.config.schema import Verbatim, integer_spelling_problem, no_spaces_problem, setting


@dataclass
class WhenRule:
    """Settings for the grid points that match (RL Zoo keeps hyperparameters per algorithm and env):
    `{match: {algo: a2c}, set: {train.lr: 7e-4}}`. Rules apply in order; a later one wins."""

    match: dict[str, Verbatim] = setting(factory=dict)
    """Swept key -> one of its grid values; every pair must hold. Empty: every point."""
    set: dict[str, Verbatim] = setting(factory=dict)
    """Dotted key -> value, for keys that are not swept themselves."""


@dataclass
class Distribution:
    """Where one searched key's values come from (`sweep.search.space`): `{type: loguniform, low:
    1.0e-4, high: 1.0e-2}`, `{type: int, low: 16, high: 256, log: true}`, `{type: choice, values:
    [tanh, relu]}`. Both bounds are included; the values are typed by the key's own field."""

    type: Literal["uniform", "loguniform", "int", "choice"]
    """`uniform` and `loguniform` between low and high, `int` (integers between low and high), or `choice` among values."""
    low: Optional[float] = None
    """Smallest value (included); above 0 on a log scale."""
    high: Optional[float] = None
    """Largest value (included); above low."""
    log: bool = False
    """For `int`: sample on a log scale (loguniform is `uniform` with log: true)."""
    values: list[Verbatim] = setting(factory=list)
    """The options of a `choice`."""

    def check(self) -> list[tuple[str, str]]:
        if self.type == "choice":
            if not self.values:
                return [("values", "expected at least one option for a choice")]
            if self.low is not None or self.high is not None:
                return [("low" if self.low is not None else "high", "a choice takes values, not low and high")]
            return []
        if self.values:
            return [("values", f"only a choice takes values; {self.type} takes low and high")]
        for key in ("low", "high"):
            if getattr(self, key) is None:
                return [(key, f"required for {self.type}")]
        assert self.low is not None and self.high is not None
        if self.low >= self.high:
            return [("low", f"must be below high ({_num_text(self.low)} >= {_num_text(self.high)})")]
        if (self.type == "loguniform" or self.log) and self.low <= 0:
            return [("low", f"a log scale needs low > 0, got {_num_text(self.low)}")]
        if self.type == "int" and not (self.low.is_integer() and self.high.is_integer()):
            return [("low" if not self.low.is_integer() else "high", "an int distribution needs integer bounds")]
        return []


def _num_text(value: float) -> str:
    return f"{value:g}"


@dataclass
class SearchConfig:
    """Search beyond the grid: random samples (`method: random`), or an Optuna study whose workers
    are the train array's tasks (`method: optuna`, `pip install 'hpcrl[optuna]'`)."""

    space: dict[str, Distribution] = setting(factory=dict)
    """Dotted key -> distribution; each run samples every key. Keys may not also be in the grid."""
    method: Literal["random", "optuna"] = "random"
    """`random`: `samples` points; `optuna`: a study of `n_trials` trials run by the train array's tasks."""
    samples: Optional[int] = setting(None, ge=1, le=MAX_RUNS)
    """random: how many points. Sample i is the same whatever the count, so a re-sweep with more
    samples trains only the new ones."""
    seed: int = setting(0, ge=0, le=MAX_SEED)
    """Seed of the random points and of Optuna's sampler: the same seed, the same points."""
    n_trials: Optional[int] = setting(None, ge=1, le=MAX_RUNS)
    """optuna: trials of the study (complete, pruned and failed); a re-sweep with more adds trials."""
    sampler: Literal["tpe", "random"] = "tpe"
    """optuna: TPE, or random sampling."""
    pruner: Literal["none", "median", "hyperband", "asha"] = "median"
    """Stops trials whose intermediate metric is poor: median (MedianPruner), hyperband
    (HyperbandPruner) or asha (SuccessiveHalvingPruner)."""
    direction: Literal["maximize", "minimize"] = "maximize"
    """optuna: whether a higher or a lower metric is better."""
    metric: Literal["auto", "eval", "train"] = "auto"
    """What a trial reports and is judged on: the evaluations during training (`eval`, needs
    eval.every_steps), the training episodes' return (`train`), or `auto`: eval when it is set."""
    startup_trials: int = setting(5, ge=0, le=MAX_RUNS)
    """Trials that are sampled at random and never pruned before TPE and the pruner start judging."""
    warmup_percent: int = setting(10, ge=0, le=99)
    """Percent of its budget a trial trains before the pruner may stop it."""
    storage: Optional[str] = setting(None, valid=no_spaces_problem)
    """An RDB URL (postgresql://...) for large studies; default: Optuna's journal file in the
    experiment directory, which needs no server and works on NFS and Lustre homes."""

    def check(self) -> list[tuple[str, str]]:
        if not self.space:
            return [("space", "expected at least one key to search")]
        if self.method == "random":
            if self.samples is None:
                return [("samples", "required for method random (how many points)")]
            if self.n_trials is not None:
                return [("n_trials", "for method optuna; random search takes samples")]
        else:
            if self.n_trials is None:
                return [("n_trials", "required for method optuna (how many trials)")]
            if self.samples is not None:
                return [("samples", "for method random; an Optuna study takes n_trials")]
        return []


def _seed_shorthand(value: Any) -> Any:
    """`5` -> [0, 1, 2, 3, 4]; `"10..19"` -> [10, ..., 19]; a list (or anything else) as it is."""
    if isinstance(value, int) and not isinstance(value, bool):
        if problem := integer_spelling_problem(value):
            raise ValueError(problem)
        if not 1 <= value <= MAX_RUNS:
            raise ValueError(f"a count of seeds is 1..{MAX_RUNS:,}, got {value}")
        return list(range(value))
    if isinstance(value, str) and (m := re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*", value)):
        low, high = int(m.group(1)), int(m.group(2))
        if low > high or high - low + 1 > MAX_RUNS or high > MAX_SEED:
            raise ValueError(f"a range of seeds is LOW..HIGH with LOW <= HIGH <= {MAX_SEED} and at most {MAX_RUNS:,} seeds, got {value!r}")
        return list(range(low, high + 1))
    if isinstance(value, str):
        raise ValueError(f"expected a list of seeds, a count (5) or a range ('10..19'), got {value!r}")
    return value


@dataclass
class SweepConfig:
    seeds: list[int] = setting(factory=lambda: [0], ge=0, le=MAX_SEED, min_items=1, shorthand=_seed_shorthand)
    """Seeds of numpy and torch, each a run (0 .. 2**32-1): a list, a count (`5`: seeds 0..4) or an inclusive
    range (`"10..19"`)."""
    grid: dict[str, list[Verbatim]] = setting(factory=dict)
    """Dotted key -> values; the runs are the product of all lists times the seeds. `algo` and
    `env.id` may be swept: settings that only some points need go in `when`."""
    when: list[WhenRule] = setting(factory=list)
    """Rules that set keys for the grid points they match, in order (a later rule wins)."""
    search: Optional[SearchConfig] = None
    """Sampled keys beside the grid: random points, or an Optuna study."""

    def check(self) -> list[tuple[str, str]]:
        if len(set(self.seeds)) != len(self.seeds):
            return [("seeds", "seeds repeat")]
        return []
