"""Tasks (environments) in results: which task a run was scored on, and how scores are normalised.

Comparisons across environments (rliable, RL Zoo's `all_plots`, openrlbenchmark) treat each
environment as a task: a setting's scores form a runs x tasks matrix, bootstrapped per task. A
return of 500 on CartPole and -100 on Acrobot cannot be averaged raw, so each task's score can be
normalised as (score - random) / (reference - random), the Atari convention: 0 is a uniformly
random policy, 1 the reference.

The task of a run is its `env.id` when the grid sweeps it (a runs.csv column, so results never
parse run configs); otherwise the experiment's one env id, or `results.task` for a user's program.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from hpcrl.config.schema import ConfigError

TASK_KEY = "env.id"
"""The swept key that makes tasks of its values instead of settings."""

REFERENCE_SCORES: dict[str, tuple[float, float]] = {
    "CartPole-v1": (22.42, 475.0),
    "Acrobot-v1": (-498.07, -100.0),
    "MountainCar-v0": (-200.0, -110.0),
    "MountainCarContinuous-v0": (-33.25, 90.0),
}
"""(random, reference) of the bundled environments. Random: the mean return of a uniformly random
policy over 300 episodes (seeds 0-299, gymnasium 1.4, measured 2026-11-24). Reference: the env's
own registered `reward_threshold`, the score gymnasium calls solved, so a normalised 1 means solved."""


def experiment_task(config: Mapping) -> str | None:
    """The task of an experiment's runs when its grid does not sweep env.id (None: unknown)."""
    results = config.get("results") or {}
    if results.get("task"):
        return str(results["task"])
    if config.get("algo") == "program":
        return None
    env = config.get("env") or {}
    return str(env.get("id") or "CartPole-v1")


def split_row(row: Mapping[str, str], default_task: str | None) -> tuple[str | None, dict[str, str]]:
    """(task, the swept values that make the setting) of a runs.csv row's swept columns."""
    swept = dict(row)
    task = swept.pop(TASK_KEY, "") or default_task
    return task, swept


def references(config: Mapping) -> dict[str, tuple[float, float]]:
    """Random and reference scores: the shipped ones, then the config's `results.scores`."""
    out = dict(REFERENCE_SCORES)
    for task, ref in ((config.get("results") or {}).get("scores") or {}).items():
        out[str(task)] = (float(ref["random"]), float(ref["reference"]))
    return out


def normalizer(tasks: list[str], refs: Mapping[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """(random, reference) of each task, or one ConfigError naming the tasks that have none."""
    missing = [t for t in tasks if t not in refs]
    if missing:
        raise ConfigError(
            f"results.normalize: no random and reference scores for {', '.join(map(repr, missing))}: "
            f"declare them in results.scores (e.g. {json.dumps({missing[0]: {'random': 0, 'reference': 1}})}); "
            f"hpcrl ships them for {', '.join(sorted(REFERENCE_SCORES))}"
        )
    return {t: refs[t] for t in tasks}


def normalize(score: float, ref: tuple[float, float]) -> float:
    random, reference = ref
    return (score - random) / (reference - random)
