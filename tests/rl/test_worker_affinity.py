"""Env worker processes pinned to cores (`env.worker_affinity`): a ViZDoom worker and its game's engine on one
core hand each step to each other without a wake-up across cores (hpcrl.rl.envs.worker_cores)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from test_conformance import process_table

from hpcrl.config.experiment import EnvConfig
from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.cores import allowed_cores
from hpcrl.leftovers import process_stat
from hpcrl.rl.env_workers import Workers
from hpcrl.rl.envs import make_vec_env, worker_cores


@pytest.mark.parametrize(
    ("affinity", "backend", "workers", "allowed", "offset", "cores"),
    [
        ("auto", "vizdoom", 4, [0, 1], 0, [0, 1, 0, 1]),
        ("auto", "vizdoom", 3, [0, 1], 1, [1, 0, 1]),  # the offset (the trainer's pid) puts runs' extra workers apart
        ("auto", "vizdoom", 2, [4, 6], 0, [4, 6]),  # a cpuset's cores, not the node's first ones
        ("auto", "vizdoom", 8, list(range(16)), 0, None),  # fewer workers than cores: pinned, they would leave cores idle
        ("auto", "habitat", 4, [0, 1], 0, None),  # a simulator with threads of its own
        ("auto", "gymnasium", 4, [0, 1], 0, None),
        ("pinned", "gymnasium", 3, [0, 1, 2, 3], 2, [2, 3, 0]),
        ("free", "vizdoom", 4, [0, 1], 0, None),
        ("pinned", "vizdoom", 4, [], 0, None),  # no affinity to be had (not Linux)
    ],
)
def test_each_worker_gets_a_core_only_where_the_rule_says(affinity: str, backend: str, workers: int, allowed: list[int], offset: int, cores: list[int] | None) -> None:
    assert worker_cores(affinity, backend, workers, allowed, offset) == cores


def test_an_affinity_that_is_none_of_the_three_is_one_line(tmp_path: os.PathLike) -> None:
    config = tmp_path / "x.yaml"
    config.write_text("name: x\nenv: {worker_affinity: 'pinned\\n0'}\n")
    with pytest.raises(ConfigError) as raised:
        load_experiment(config)
    assert "\n" not in str(raised.value) and "env.worker_affinity" in str(raised.value)


@pytest.mark.skipif(importlib.util.find_spec("vizdoom") is None or not hasattr(os, "sched_getaffinity"), reason="needs vizdoom and CPU affinity")
def test_pinned_workers_and_the_game_engines_they_start_run_on_their_cores() -> None:
    """Two ViZDoom workers of one game each: each worker runs on its core, and so does its game's engine, a
    process it started after it was pinned."""
    spec = EnvConfig(backend="vizdoom", id="basic", num_envs=2, envs_per_worker=1, vectorization="async", worker_affinity="pinned", kwargs={"downsample": 2})
    expected = worker_cores("pinned", "vizdoom", 2, allowed_cores(), os.getpid())
    envs = make_vec_env(spec)
    try:
        envs.reset(seed=0)
        workers = envs.unwrapped.groups[0].unwrapped
        assert isinstance(workers, Workers)
        for process, core in zip(workers.processes, expected or []):
            engines = [pid for pid in process_table("vizdoom") if (stat := process_stat(pid)) is not None and stat.parent == process.pid]
            assert engines, "the worker started no game engine"
            assert [os.sched_getaffinity(pid) for pid in [process.pid, *engines]] == [{core}] * (1 + len(engines))
    finally:
        envs.close()
    assert expected is not None and len(expected) == 2
