"""The measured window every side of benchmarks/vizdoom_speed.py shares: steps per second, CPU per step by part
(read from /proc by `_cpu`), the episodes that ended, each vector step's wait, and the final evaluation's mean
return. One home for these rules, so hpcrl's, SB3's and Sample Factory's figures are counted alike (Sample
Factory's measurement runs in its own venv, which imports this module and `_cpu` but not hpcrl)."""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

PARTS: dict[str, dict[int, str]] = {"threads": {}, "processes": {}}
"""The parts of the measured side that `cpu_seconds` tells apart (_cpu.cpu_by_part's `threads` and
`processes`), named by the side's measurement once they exist."""


def cpu_seconds() -> tuple[float, float, dict[str, float]]:
    """CPU seconds used so far by (this process, it and every process under it: env workers, their game
    engines, Sample Factory's workers, those by part). Unlike steps per second, CPU time per step hardly
    depends on what else the machine runs: the figure to compare on a loaded machine (a quiet one's rate is
    at most cores / CPU time per step)."""
    from _cpu import cpu_by_part

    parts = cpu_by_part(os.getpid(), PARTS["threads"], PARTS["processes"])
    own = sum(v for k, v in parts.items() if k == "main" or k in PARTS["threads"].values())
    return own, sum(parts.values()), parts


def episodes_ended(terminated: Any, truncated: Any) -> int:
    """The episodes that ended in one vector step: each env whose episode terminated or was cut, every one of
    them where several end in the same step."""
    return int((terminated | truncated).sum())


class StepWaits:
    """Each vector step's wall time, by how many of its envs ended an episode in it: where a learner that ends
    episodes sooner waits. ViZDoom starts an episode in ~1.7 ms of wall time, and a batched rollout waits for the
    worker whose game restarts (2026-12-03, 8 envs on 2 cores: 2.9 ms a step in which none ended, 4.5 with one).
    It wraps `envs.step` of hpcrl's vector env (the random-action and hpcrl sides; a rollout that pipelines
    worker groups on a GPU steps them otherwise, and nothing is recorded)."""

    def __init__(self, envs: Any) -> None:
        self.inner = envs.step
        envs.step = self
        self.env_steps = 0
        self.episodes = 0
        """Every environment step and ended episode so far (the random-action side's counts)."""
        self.begin()

    def begin(self) -> None:
        """Forget what was recorded: the measured window starts."""
        self.counts: dict[int, int] = {}
        self.seconds: dict[int, float] = {}

    def __call__(self, actions: Any) -> Any:
        start = time.perf_counter()
        outcome = self.inner(actions)
        wall, ended = time.perf_counter() - start, episodes_ended(outcome[2], outcome[3])
        self.env_steps += len(outcome[2])
        self.episodes += ended
        counts, seconds = self.counts, self.seconds  # (one pair: `begin` may swap them from another thread)
        counts[ended] = counts.get(ended, 0) + 1
        seconds[ended] = seconds.get(ended, 0.0) + wall
        return outcome

    def fields(self) -> dict[str, Any]:
        """`step_waits`: {episodes ended in a step: [steps, mean wall ms]}, as a row's field (none recorded: none)."""
        counts, seconds = self.counts, self.seconds
        return {"step_waits": {str(k): [counts[k], 1000 * seconds[k] / counts[k]] for k in sorted(counts)}} if counts else {}


def window(steps: int, seconds: float, episodes: int, cpu: tuple[tuple[float, float, dict[str, float]], tuple[float, float, dict[str, float]]]) -> dict[str, Any]:
    """A measured window as a row's fields: SPS, steps, seconds, the episodes that ended in it, and CPU per step
    between its two `cpu_seconds()` readings (`per_step`). Every side's window is made here."""
    return {"sps": steps / seconds, "steps": steps, "seconds": seconds, "episodes": episodes, **per_step(cpu, steps)}


def per_step(cpu: tuple[tuple[float, float, dict[str, float]], tuple[float, float, dict[str, float]]], steps: int) -> dict[str, Any]:
    """CPU milliseconds per environment step between two `cpu_seconds()` readings: the measuring process,
    all, and all by part (`cpu_ms_parts`). Nothing where no step was counted (a window of a second in which Sample
    Factory, which counts its steps as its learner trains, trained none): the table then leaves the cells empty."""
    if steps <= 0:
        return {}
    (own0, all0, parts0), (own1, all1, parts1) = cpu
    ms = 1000 / steps
    parts = {k: ms * (v - parts0.get(k, 0.0)) for k, v in parts1.items()}
    return {"cpu_ms_own": ms * (own1 - own0), "cpu_ms_all": ms * (all1 - all0), "cpu_ms_parts": {k: v for k, v in parts.items() if v > 0}}


def timed(step: Any, steps_of: Any, episodes_of: Any, seconds: float, waits: StepWaits | None = None) -> dict[str, Any]:
    """Run `step()` once to warm up, then until `seconds` have passed: SPS, steps, seconds, the episodes
    that ended meanwhile (`episodes_of()` counts them) and CPU per step, as a row's fields (with `waits`,
    the vector steps' waits in the window)."""
    step()
    if waits is not None:
        waits.begin()
    first, ended, start, cpu = steps_of(), episodes_of(), time.perf_counter(), cpu_seconds()
    while True:
        step()
        wall = time.perf_counter() - start
        if wall >= seconds:
            steps = steps_of() - first
            return {**window(steps, wall, episodes_of() - ended, (cpu, cpu_seconds())), **(waits.fields() if waits is not None else {})}


def return_fields(env: Any, act: Any, episodes: int) -> dict[str, float | None]:
    """A side's row fields for its final policy, whichever side: `final_return` and `final_return_se` (`mean_return`'s)."""
    mean, se = mean_return(env, act, episodes)
    return {"final_return": mean, "final_return_se": se}


def mean_return(env: Any, act: Any, episodes: int, seed: int = 1_000_003) -> tuple[float, float | None]:
    """The mean raw return of `episodes` episodes, one after another on `env` (the same loop for every side), and
    its standard error (None for one episode). The env is seeded alike in every run, so a side is always scored on
    the same episodes of its env: with 100 of them on ViZDoom's basic, where the monster's place sets the return,
    Sample Factory's first 100 were 1.7 points easier than its first 1,000 (2026-12-07), under two standard errors
    (1.0-1.1 there with 100 episodes, hpcrl's and Sample Factory's alike): a bias the error shows and a mean alone
    hides."""
    returns = []
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        done, ret = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            ret += float(reward)
            done = terminated or truncated
        returns.append(ret)
        obs, _ = env.reset()
    return statistics.fmean(returns), statistics.stdev(returns) / math.sqrt(len(returns)) if len(returns) > 1 else None
