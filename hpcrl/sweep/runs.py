"""Experiment -> runs (grid × seeds, random samples) with stable ids: what to try, and run identity.

A run id is a hash of the settings that change what is learned, so re-running `hpcrl sweep` on the
same config finds the same runs on disk and only submits what is missing or failed. It hashes the
canonical values (the typed values after validation: `1e-3`, `1.0e-3` and `0.001` are one number,
and a default left out equals the default written), never how the YAML spelled them. Where runs
live on disk (runs.csv, each run's config.yaml) is hpcrl.store.expdir's.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from hpcrl.config.experiment import Experiment
from hpcrl.config.key_paths import is_learned, learned_settings
from hpcrl.config.load import apply_settings
from hpcrl.config.output_dir import run_id
from hpcrl.config.schema import ConfigError
from hpcrl.store import expdir
from hpcrl.sweep.search import random_points


def get_dotted(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def run_hash(config: Experiment, swept: list[str] | tuple[str, ...] = ()) -> str:
    """The id of a run's setting: a hash of the canonical values of what it learns, plus its swept keys.

    `config` is a resolved, validated run config, so every value is already typed. What is learned
    is declared once, on the config's fields (`learned=False` for resources, checkpoints, threads,
    the device, the distributed plumbing ...): `config.learned_settings` reads those declarations.
    A field without the flag counts as learned, so at worst a run trains twice, never two settings
    under one id.
    """
    data = config.to_dict()
    # A swept key that is learned is in learned_settings already: sweeping lr over [0.001] and
    # writing lr: 0.001 give one id. Only a swept key that is not learned (eval.*) is added on its own.
    extra = {k: get_dotted(data, k) for k in sorted(swept) if not is_learned(k, config.algo)}
    blob = json.dumps([learned_settings(config), extra], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def expand(exp: Experiment) -> list[expdir.Run]:
    """The runs of an experiment, in a stable order: grid points in config order, then the random
    search's samples (sweep.search), then seeds. An Optuna study has none until its workers ask
    for trials (hpcrl.sweep.study).

    A run's `settings` are its swept values as validated (0.001 however the YAML wrote it), so the
    labels results are pooled under are canonical too.
    """
    search = exp.sweep.search
    if search is not None and search.method == "optuna":
        return []
    samples = random_points(search) if search is not None else [{}]
    runs: list[expdir.Run] = []
    points: dict[str, dict[str, Any]] = {}
    for values in itertools.product(*exp.sweep.grid.values()):
        for sample in samples:
            runs += _point_runs(exp, {**dict(zip(exp.sweep.grid, values)), **sample}, points, len(runs))
    return runs


def _point_runs(exp: Experiment, point: dict[str, Any], points: dict[str, dict[str, Any]], first_index: int) -> list[expdir.Run]:
    """The runs (one per seed) of one point of the sweep; `points` (hash -> settings) holds the
    points so far. A random sample that repeats an earlier point (a small choice space) adds no
    run; two grid points that are one run are a config error."""
    keys = list(point)
    where = f"{exp.source}: " if exp.source else ""
    # Validated once per point: the seeds of a point differ in sweep.seeds only. The config's checks typed each
    # value alone and joined the grid's; a random sample's values were drawn apart, so two that do not go
    # together (a minibatch count that does not divide the envs it drew) are first met here, and named.
    try:
        config = apply_settings(exp, point, exp.sweep.seeds[0])
    except ConfigError as exc:
        if exp.sweep.search is None:
            raise
        raise exc.within(f"{where}sweep.search: the point {expdir.setting_label(expdir.encoded(point))}: ") from None
    data = config.to_dict()
    settings = {k: get_dotted(data, k) for k in keys}
    setting_hash = run_hash(config, keys)
    if setting_hash in points:
        if exp.sweep.search is not None and points[setting_hash] == settings:
            return []
        # The config's own check refuses repeated grid values; this guards every other way two
        # points could collapse into one run, which would otherwise surface as a KeyError in a task.
        raise ConfigError(
            f"{where}sweep.grid: the points {expdir.setting_label(expdir.encoded(points[setting_hash]))} and {expdir.setting_label(expdir.encoded(settings))} are the same run"
        )
    points[setting_hash] = settings
    return [expdir.Run(first_index + i, run_id(setting_hash, seed), seed, settings, expdir.seeded(config, seed)) for i, seed in enumerate(exp.sweep.seeds)]
