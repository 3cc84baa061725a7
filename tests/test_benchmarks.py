"""Every script in benchmarks/ runs in the suite at a tiny size (issue 37), so a move or a renamed module
that breaks one fails here and not months later: collect_scale.py and status_scale.py had both died on
modules the stage-folder move renamed, and nothing had run them since.

Each runs as a user runs it (`python benchmarks/X.py ...`, its own process), for seconds, and must exit 0;
the figures it prints are not judged here. Scripts that need what a machine may lack (a cluster, Redis,
cosmic-ray, OpenSpiel's JAX AlphaZero, a GPU) carry its marker or skip with the reason; what can be checked
without it (that mutation.py's targets and gpu_node.sh's paths still exist) is checked always.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from factories import own_shm
from test_conformance import process_table

from hpcrl.leftovers import HELD_FOR_LIFE, in_session, process_stat, processes, shared_memory_of

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"

TINY: dict[str, tuple[list[str], tuple[pytest.MarkDecorator, ...]]] = {
    "algos.py": (["--scale", "0.002", "--skip-vizdoom", "--no-ftz-reference", "--algos", "ppo"], (pytest.mark.slow,)),
    "alphazero.py": (["--games", "2", "--set", "train.total_steps=64", "train.simulations=2", "train.eval_simulations=2"], (pytest.mark.slow,)),
    "alphazero_jobs.py": (["--total-steps", "64", "--actors", "1", "--timeout", "240", "--output", "{tmp}/azjobs"], (pytest.mark.slurm, pytest.mark.redis, pytest.mark.e2e)),
    "collect_scale.py": (["--runs", "20", "--settings", "4", "--rows", "10", "--repeat", "1"], (pytest.mark.e2e,)),
    "ddppo.py": (["--ranks", "2", "--envs", "2", "--num-steps", "8", "--steps", "64", "--epochs", "1", "--repeats", "1", "--raw-seconds", "0"], (pytest.mark.slow,)),
    "distributed.py": (["pipe", "--actors", "1", "--seconds", "0.5"], (pytest.mark.redis, pytest.mark.e2e)),
    "mutation.py": (["--only", "templates", "--max-mutants", "1", "--budget-minutes", "3"], (pytest.mark.slow,)),
    "openspiel_alphazero.py": (["--game", "tic_tac_toe", "--minutes", "0.1", "--games", "2", "--simulations", "2", "--curve", "1", "--sides", "hpcrl", "openspiel-jitted", "--at-once", "--path", "{tmp}/az"], (pytest.mark.slow,)),
    "periodic_eval.py": (["--steps", "1024"], (pytest.mark.slow,)),
    "stats_scale.py": (["--settings", "2", "--seeds", "2", "--points", "10", "--repeats", "1"], (pytest.mark.e2e,)),
    "status_scale.py": (["--runs", "20", "--settings", "2", "--repeat", "1", "--schedulers"], (pytest.mark.e2e,)),
    "study_storage.py": (["--trials", "4", "--reports", "2", "--workers", "1", "--repeats", "1"], (pytest.mark.e2e,)),
    "submit_scale.py": (["--runs", "10", "--loop-max", "10", "--schedulers", "slurm", "sge"], (pytest.mark.slurm, pytest.mark.sge, pytest.mark.e2e)),
    "vizdoom_speed.py": (["--sides", "random", "sample-factory", "--num-envs", "2", "--seconds", "1", "--out", "{tmp}/speed"], (pytest.mark.e2e,)),
    "vizdoom_start.py": (["2", "--steps", "5"], (pytest.mark.e2e,)),
}
"""A tiny run of each script: arguments (`{tmp}`: the test's directory) and markers."""
NEEDS = {"mutation.py": "cosmic_ray", "openspiel_alphazero.py": "pyspiel", "vizdoom_speed.py": "vizdoom", "vizdoom_start.py": "vizdoom"}
"""A package a script needs that hpcrl's environment may not have: the test skips without it. (A reference
side in a venv of its own, benchmarks/_venvs.py, is built by the script, or skipped by it with pip's reason.)"""
SLOW_START = {"openspiel_alphazero.py", "vizdoom_speed.py"}
"""Their reference sides run in a venv of their own and start JAX or Sample Factory's processes: a longer bound."""
FIXTURES = {"alphazero_jobs.py": ("slurm_cluster", "redis_installed"), "distributed.py": ("redis_installed",), "submit_scale.py": ("slurm_cluster", "sge_cluster")}


def test_every_benchmark_has_a_tiny_run() -> None:
    scripts = {p.name for p in BENCHMARKS.iterdir() if p.suffix == ".py" and not p.name.startswith("_")}  # _x.py: a module the benchmarks share
    assert scripts == set(TINY), f"benchmarks without a tiny run here: {sorted(scripts - set(TINY))}; gone: {sorted(set(TINY) - scripts)}"


USER_CACHES = ("torchinductor_", "sf2_")
"""Folders in the temporary directory that a library keeps for its user and reuses in every run, rather than
leaves behind: torch's compile cache, Sample Factory's env-info cache."""


@pytest.mark.parametrize("script", [pytest.param(name, marks=marks) for name, (_, marks) in TINY.items()])
def test_a_benchmark_runs_at_a_tiny_size(script: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if script in NEEDS and importlib.util.find_spec(NEEDS[script]) is None:
        pytest.skip(f"{script} needs {NEEDS[script]}, which is not installed here")
    for fixture in FIXTURES.get(script, ()):
        request.getfixturevalue(fixture)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in TINY[script][0]]
    # A reference side's venv is used where a run of the benchmark built it, and is a SKIPPED row elsewhere (a fresh
    # CI machine): building one is minutes of pip; HPCRL_BENCH_BUILD=1 in the environment builds it here too.
    scratch = tmp_path / "tmp"  # the benchmark's temporary directory: what it leaves there is named below
    scratch.mkdir()
    env = {"HPCRL_BENCH_BUILD": "0", **os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    with subprocess.Popen([sys.executable, str(BENCHMARKS / script), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env) as bench:
        try:
            stdout, stderr = bench.communicate(timeout=900 if script in SLOW_START else 420)
        finally:
            bench.kill()
    proc = subprocess.CompletedProcess(bench.args, bench.returncode, stdout, stderr)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith(USER_CACHES))
    assert left == [], f"{script} left these in its temporary directory"
    assert "FAILED" not in proc.stdout, proc.stdout[-3000:]  # a side that failed is a row of the table, not an exit code
    assert "DIFFERENT" not in proc.stdout, proc.stdout[-3000:]  # results that should match a reference's did not
    if script == "vizdoom_speed.py":  # its measurements' folders: under /tmp whatever TMPDIR says, named for its process
        assert not list(Path("/tmp").glob(f"vzd-*-{bench.pid}-*")), f"{script} left a measurement's folder in /tmp"
        check_episodes_counted(json.loads((tmp_path / "speed" / "speed.json").read_text())["rows"])


def test_episodes_ended_in_one_step_count_each_env_once_however_it_ended() -> None:
    """vizdoom_speed.py's random-action sides count episodes by the step: two envs ending in the same step are two
    episodes, an env both terminated and cut is one."""
    import numpy as np

    ended = load_benchmark("_window").episodes_ended
    assert ended(np.array([True, False, True, False]), np.array([False, False, True, True])) == 3
    assert ended(np.array([True, True]), np.array([False, False])) == 2
    assert ended(np.zeros(3, bool), np.zeros(3, bool)) == 0


def test_a_final_return_comes_with_its_standard_error_over_the_episodes_played() -> None:
    """Every side's return at equal steps is scored by one loop (benchmarks/_window.py's mean_return): the episodes'
    mean and its standard error, so that a difference between two sides smaller than the error reads as one; none
    for a single episode. Episodes of 1, 2 and 3 steps of reward 1, 2, 3 each: returns 1, 4, 9."""
    import gymnasium as gym

    class Steps(gym.Env):
        observation_space = gym.spaces.Discrete(1)
        action_space = gym.spaces.Discrete(1)

        def __init__(self) -> None:
            self.episode, self.step_in = -1, 0

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
            super().reset(seed=seed)
            self.episode, self.step_in = (0 if seed is not None else self.episode + 1), 0
            return 0, {}

        def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
            self.step_in += 1
            length = self.episode % 3 + 1
            return 0, float(length), self.step_in == length, False, {}

    mean_return = load_benchmark("_window").mean_return
    mean, se = mean_return(Steps(), lambda obs: 0, 3)
    assert mean == pytest.approx(14 / 3) and se == pytest.approx(statistics.stdev([1, 4, 9]) / 3**0.5)
    assert mean_return(Steps(), lambda obs: 0, 1) == (1.0, None)


def test_the_table_gives_each_return_with_its_standard_error_in_one_column() -> None:
    """vizdoom_speed.py's table at equal steps: `return ± se` for a side scored on several episodes, the mean alone for
    one, an unlearned policy's wide figures apart from the column before them, and the column where it is for a FAILED row, so the rows of two sides read against each other."""
    bench = load_benchmark("vizdoom_speed")
    row = {"num_envs": 8, "sps": 2500.0, "steps": 48640, "seconds": 19.5, "cpu_ms_own": 0.16, "cpu_ms_all": 0.7, "episodes": 10}
    lines = bench.table([
        {**row, "side": "hpcrl-async", "final_return": 79.24, "final_return_se": 1.04},
        {**row, "side": "sample-factory", "final_return": 80.9, "final_return_se": None},
        {**row, "side": "sb3", "x_sf": 1.51, "final_return": -197.04, "final_return_se": 108.52},
        {"num_envs": 8, "side": "sb3", "error": "SKIPPED: no venv"},
    ]).splitlines()  # fmt: skip
    column = lines[0].index("return ± se") + len("return ± se")
    assert lines[1][:column].endswith("79.2 ± 1.0") and lines[2][:column].endswith(" 80.9")
    assert lines[3][:column].endswith(" -197.0 ± 108.5")  # apart from the column before it, however wide
    assert lines[4].index("SKIPPED") == lines[0].index("note") and lines[4][:column].rstrip().endswith("-")


def test_a_window_gives_cpu_per_step_between_its_two_readings_and_nothing_for_no_steps() -> None:
    """Every side's row (vizdoom_speed.py, benchmarks/_window.py): steps per second, and CPU milliseconds per step as
    the difference of two `cpu_seconds()` readings divided by the window's steps, for the measuring process, all
    processes and each part (a part that used nothing in the window is left out). A window that counted no step
    (Sample Factory's learner trained on none) has rates but no CPU per step, rather than a division by zero."""
    window = load_benchmark("_window").window
    before = (1.0, 3.0, {"main": 1.0, "env workers": 1.5, "engines": 0.5})
    after = (1.5, 5.0, {"main": 1.5, "env workers": 2.5, "engines": 0.5, "rollout": 0.5})
    row = window(1000, 2.0, 7, (before, after))
    assert row["sps"] == 500 and row["steps"] == 1000 and row["episodes"] == 7
    assert row["cpu_ms_own"] == pytest.approx(0.5) and row["cpu_ms_all"] == pytest.approx(2.0)
    assert row["cpu_ms_parts"] == pytest.approx({"main": 0.5, "env workers": 1.0, "rollout": 0.5})
    empty = window(0, 1.0, 0, (before, after))
    assert empty["sps"] == 0 and "cpu_ms_all" not in empty and "cpu_ms_parts" not in empty


def test_step_waits_time_each_vector_step_by_the_episodes_that_ended_in_it() -> None:
    """vizdoom_speed.py's third table: on a real vector env (CartPole, episodes ending often under random actions)
    each bucket's steps, episodes and mean wall time add up to what the loop saw; begin() starts a window afresh;
    the table groups 3 or more and weighs each bucket's mean by its steps."""
    import gymnasium as gym
    import numpy as np

    bench = load_benchmark("vizdoom_speed")
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    waits = load_benchmark("_window").StepWaits(envs)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    envs.step(rng.integers(0, 2, 4))
    waits.begin()
    ended, start = 0, time.perf_counter()
    for _ in range(300):
        _, _, terminated, truncated, _ = envs.step(rng.integers(0, 2, 4))
        ended += int((terminated | truncated).sum())
    elapsed = time.perf_counter() - start
    buckets = {int(k): v for k, v in waits.fields()["step_waits"].items()}
    assert sum(n for n, _ in buckets.values()) == 300 and sum(k * n for k, (n, _) in buckets.items()) == ended > 0
    assert 0 < sum(n * ms for n, ms in buckets.values()) / 1000 <= elapsed  # means, not sums: together no more than the loop took
    assert waits.env_steps == 301 * 4 and waits.episodes == ended  # (the warm-up step ended none: CartPole's episodes are longer)
    envs.close()
    rows = [{"num_envs": 8, "side": "random", "step_waits": {"0": [8, 2.0], "1": [2, 4.0], "3": [1, 6.0], "4": [1, 8.0]}}]
    line = bench.waits_table(rows).splitlines()[1]
    assert line.split()[2:] == ["2.00", "ms", "67%", "4.00", "ms", "17%", "-", "7.00", "ms", "17%"], line


BASIC_LONGEST = 75
"""Environment steps of ViZDoom basic's longest episode: its time limit, 300 tics at frame skip 4."""


def check_episodes_counted(rows: list[dict]) -> None:
    """vizdoom_speed.py's episodes per side, whose steps per episode explain a side's engine CPU (a start of
    an episode costs about five steps): random actions end episodes within a second (a learner's tiny window
    may end none), and no more steps can pass than the envs' episodes allow (each env's steps in the window fit
    in the episodes it ended there and the one it is in, at most BASIC_LONGEST steps each). And each side
    measured steps: Sample Factory's learner, given a minibatch shorter than its rollout, trained on none and
    the table said 0 steps/s. The random-action side's vector steps by the episodes ended in them add up to its
    window: its steps and its episodes."""
    for row in rows:
        if "error" in row:
            continue
        assert row["steps"] > 0, row
        if row["side"] == "random":  # every vector step of the window is in its waits, with the episodes that ended in it
            waits = {int(k): n for k, (n, _) in row["step_waits"].items()}
            assert sum(waits.values()) * row["num_envs"] == row["steps"] and sum(k * n for k, n in waits.items()) == row["episodes"] > 0, row
        assert row["steps"] <= (row["episodes"] + row["num_envs"]) * BASIC_LONGEST, row


def test_a_measurement_killed_at_its_timeout_says_where_it_was(tmp_path: Path) -> None:
    """vizdoom_speed.py's FAILED row for a measurement that never answered carries the last line it wrote (Sample
    Factory's runner that waits for its inference worker for ever logs where it is every few seconds), and the
    measurement's whole process group goes with it."""
    bench = load_benchmark("vizdoom_speed")
    stuck = tmp_path / "stuck"
    stuck.write_text(f'#!/bin/sh\nprintf "\\033[36m[12:00] Total num frames: 0\\033[0m\\n\\n" >&2\necho $$ > {tmp_path}/pid\nexec sleep 60\n')
    stuck.chmod(0o755)
    result = bench.run_child([], "sample-factory", 2, timeout=2.0, python=str(stuck))
    assert result == {"error": "no result within 2 s: killed; its last line: [12:00] Total num frames: 0"}
    assert not Path(f"/proc/{(tmp_path / 'pid').read_text().strip()}").exists()


def test_a_failed_measurement_names_the_first_error_of_a_process_that_died_before_it(tmp_path: Path) -> None:
    """Where a side's process died and the rest went on (Sample Factory's runner outlives its rollout workers, which
    died of numpy 2 under its 2.1.1 at their first step: "0 frames" was all its last line said), the FAILED row
    names that first error beside the last line, and a last line that is itself the first error once."""
    bench = load_benchmark("vizdoom_speed")
    worker_died = tmp_path / "worker_died"
    worker_died.write_text(
        "#!/bin/sh\nprintf 'Traceback (most recent call last):\\n  File \"x.py\", line 1\\n"
        "\\033[33mValueError: setting an array element with a sequence.\\033[0m\\n[12:00] Total num frames: 0\\n"
        "RuntimeError: the runner gave up\\n' >&2\nexit 1\n"
    )
    worker_died.chmod(0o755)
    result = bench.run_child([], "sample-factory", 2, timeout=30.0, python=str(worker_died))
    assert result == {"error": "RuntimeError: the runner gave up; its first error: ValueError: setting an array element with a sequence."}
    alone = tmp_path / "alone"
    alone.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named pygame' >&2\nexit 1\n")
    alone.chmod(0o755)
    assert bench.run_child([], "sample-factory", 2, timeout=30.0, python=str(alone)) == {"error": "ModuleNotFoundError: No module named pygame"}


def test_a_gpu_torch_does_not_see_is_one_line_before_any_side_runs(tmp_path: Path) -> None:
    """--device cuda:N past the GPUs torch sees here: exit 2 and one line, before any side is measured (each side used
    to fail its own way: Sample Factory's learner died of it and its runner waited out the timeout, 240 s)."""
    import torch

    missing = f"cuda:{torch.cuda.device_count()}"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "vizdoom_speed.py"), "--device", missing, "--sides", "random", "sample-factory", "--seconds", "1"],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
    assert proc.stderr.strip().splitlines()[-1] == f"vizdoom_speed.py: error: argument --device: {missing} is not among the {torch.cuda.device_count()} GPU(s) torch sees here"


def test_sample_factory_sees_the_one_gpu_hpcrl_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sample Factory's learner takes the first GPU it sees: for hpcrl's cuda:N its side sees only the Nth GPU
    this process sees, so both sides measure on the same card; none it cannot see is one line."""
    sf_gpu = load_benchmark("vizdoom_speed").sf_gpu
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert (sf_gpu("cpu"), sf_gpu("cuda"), sf_gpu("cuda:3")) == (None, "0", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6")
    assert (sf_gpu("cuda"), sf_gpu("cuda:1")) == ("4", "6")
    with pytest.raises(SystemExit, match=r"--device cuda:2: CUDA_VISIBLE_DEVICES='4, 6' shows 2 GPU\(s\)"):
        sf_gpu("cuda:2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SystemExit, match="shows 0 GPU"):
        sf_gpu("cuda")


@pytest.mark.skipif(importlib.util.find_spec("vizdoom") is None, reason="the scenario file is ViZDoom's")
def test_sample_factory_learns_with_hpcrl_s_ppo_numbers_and_learning_rate_schedule() -> None:
    """Sample Factory's side at equal steps runs hpcrl's PPO numbers, its learning rate's schedule included: the
    bundled config anneals it, and Sample Factory's own linear decay does the same (its constant default gave it
    twice hpcrl's mean rate at 49k steps); a config with a constant rate gives it a constant rate."""
    import argparse

    settings = load_benchmark("vizdoom_speed").sf_settings
    args = lambda *overrides: argparse.Namespace(config=str(REPO / "configs" / "vizdoom_ppo.yaml"), overrides=list(overrides), device="cpu", sf_workers=0, seed=3)  # noqa: E731
    s = settings(args("train.lr=7e-4"), 8)
    assert (s["rollout"], s["minibatch"], s["minibatches"], s["epochs"], s["lr"], s["lr_schedule"]) == (64, 64, 8, 2, 7e-4, "linear_decay")
    assert (s["vf_coef"], s["clip"], s["clip_value"], s["reward_scale"], s["seed"]) == (0.25, 0.2, 0.2, 0.01, 3)
    assert settings(args("train.anneal_lr=false"), 8)["lr_schedule"] == "constant"


@pytest.mark.e2e
@pytest.mark.parametrize(("overrides", "final_lr"), [((), 0.0), (("-p", "train.anneal_lr=false"), 7e-4)], ids=["annealed", "constant"])
def test_sample_factory_s_learner_ends_at_the_learning_rate_hpcrl_s_schedule_ends_at(overrides: tuple[str, ...], final_lr: float, tmp_path: Path) -> None:
    """The schedule reaches Sample Factory's learner, not only its settings: at equal steps its checkpoint's rate
    ends at 0 where hpcrl's anneals (its parser would have refused the decay by name), and at train.lr where not."""
    if importlib.util.find_spec("vizdoom") is None or not _sample_factory_venv_built():
        pytest.skip("needs vizdoom and Sample Factory's venv (a run of vizdoom_speed.py builds it)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HPCRL_BENCH_BUILD": "0"}
    argv = ["--sides", "sample-factory", "--num-envs", "2", "--learn", "512", "--eval-episodes", "1", "--out", str(tmp_path / "out"), "-p", "train.lr=7e-4", *overrides]
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "vizdoom_speed.py"), *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "FAILED" not in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = json.loads((tmp_path / "out" / "speed.json").read_text())["rows"]
    assert row["total_steps"] >= 512 and row["final_lr"] == pytest.approx(final_lr, abs=1e-12), row


def test_sample_factory_s_last_checkpoint_is_read_with_its_best_return_a_numpy_float(tmp_path: Path) -> None:
    """Past its --save_best_after steps Sample Factory's learner stores its best return as a numpy float in every
    checkpoint, which torch.load's default weights_only refuses (at 200k steps the side failed so). The side reads
    the last of them (the names sort by training step), whole, and says where none was written."""
    import numpy as np
    import torch

    last_checkpoint = load_benchmark("_sample_factory").last_checkpoint
    with pytest.raises(RuntimeError, match="saved no checkpoint in"):
        last_checkpoint(str(tmp_path))
    for step, lr in ((9, 1e-3), (10, 5e-4)):  # 9 before 10 only as the zero-padded names sort
        state = {"model": {"w": torch.full((2,), float(step))}, "curr_lr": lr, "best_performance": np.float64(80.5), "train_step": step}
        torch.save(state, tmp_path / f"checkpoint_{step:09d}_{step * 512}.pth")
    (tmp_path / "milestones").mkdir()  # its other entries there are not checkpoints
    checkpoint = last_checkpoint(str(tmp_path))
    assert (checkpoint["train_step"], checkpoint["curr_lr"], checkpoint["best_performance"]) == (10, 5e-4, 80.5)
    assert torch.equal(checkpoint["model"]["w"], torch.full((2,), 10.0))


@pytest.mark.e2e
def test_a_reference_side_whose_venv_cannot_be_built_is_skipped_with_the_reason(tmp_path: Path) -> None:
    """No registry (pip pointed at a closed port, no local wheels): Sample Factory's side is one SKIPPED row
    naming pip's failure, the rest of the table stands, the exit is 0; and no half-built venv is left. Without
    --out (the docs' commands), the tables are printed and no file is written."""
    if importlib.util.find_spec("vizdoom") is None:
        pytest.skip("vizdoom_speed.py needs vizdoom, which is not installed here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0", PIP_TIMEOUT="2")  # no config: no local wheels either
    env.update(PYTHONPATH=str(REPO), HPCRL_BENCH_VENVS=str(tmp_path / "venvs"), OMP_NUM_THREADS="1")
    argv = ["--sides", "random", "sample-factory", "--num-envs", "1", "--seconds", "1"]
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "vizdoom_speed.py"), *argv], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (skipped,) = [line for line in proc.stdout.splitlines() if line.strip().startswith("1  sample-factory")]
    assert "SKIPPED: could not build the venv sample-factory-" in skipped and "ERROR:" in skipped, skipped
    assert re.search(r"^\s+1  random\s+\d+", proc.stdout, re.MULTILINE), proc.stdout
    assert [p.name for p in (tmp_path / "venvs").iterdir() if not p.name.endswith(".lock")] == []
    assert [p.name for p in tmp_path.iterdir()] == ["venvs"] and "wrote " not in proc.stdout, proc.stdout[-500:]


def test_a_python_named_for_a_reference_side_is_used_as_given_and_a_bad_one_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HPCRL_BENCH_PYTHON_SAMPLE_FACTORY (a GPU node with no registry, its wheels carried): that Python runs the side,
    and no venv is built or looked for; a path that is no executable is the side's one SKIPPED line, not a build."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _venvs
    finally:
        sys.path.remove(str(BENCHMARKS))
    monkeypatch.setattr(_venvs, "CACHE", tmp_path / "venvs")
    wrapper = tmp_path / "sf-python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("HPCRL_BENCH_PYTHON_SAMPLE_FACTORY", str(wrapper))
    assert _venvs.venv_python("sample-factory", ["no-such-package==0"]) == wrapper
    assert not (tmp_path / "venvs").exists()
    assert _venvs.given_python("openspiel") is None  # each side its own variable
    for bad in (tmp_path / "missing", tmp_path):
        monkeypatch.setenv("HPCRL_BENCH_PYTHON_SAMPLE_FACTORY", str(bad))
        with pytest.raises(_venvs.Unavailable, match=r"^HPCRL_BENCH_PYTHON_SAMPLE_FACTORY='.*': not an executable file$"):
            _venvs.venv_python("sample-factory", ["no-such-package==0"])


def test_the_mutation_audits_targets_and_test_selections_exist() -> None:
    """What mutation.py mutates and the tests it runs: a module or a test moved or renamed is named here,
    where cosmic-ray (not in the test environment) would only report it when someone runs the audit."""
    mutation = load_benchmark("mutation")
    problems = []
    for target in mutation.TARGETS:
        module = REPO / target.module
        if not module.is_file():
            problems.append(f"{target.name}: no {target.module}")
            continue
        problems += [f"{target.name}: no function {f} in {target.module}" for f in sorted(set(target.functions) - mutation.function_names(module))]
        for node in target.tests:
            path, _, name = node.partition("::")
            if not (REPO / path).is_file():
                problems.append(f"{target.name}: no {path}")
            elif name and not re.search(rf"^(async )?def {re.escape(name.split('[')[0])}\(", (REPO / path).read_text(), re.MULTILINE):
                problems.append(f"{target.name}: no test {name} in {path}")
    assert not problems, "; ".join(problems)


def load_benchmark(name: str):
    """A benchmark script as a module (its own folder first on sys.path, as when it runs)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while they are made
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_cpu_by_part_gives_each_thread_and_process_its_own_time_and_the_parts_add_up() -> None:
    """benchmarks/vizdoom_speed.py's "where the time goes" table: a thread named by its native id gets its
    own CPU time, not the main thread's; a named child process gets its time and its own child's; an
    unnamed child is `rest`; and the parts add up to the tree's total. (Deltas where the test's process may
    have other children: an xdist worker's from earlier tests.)"""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _cpu
    finally:
        sys.path.remove(str(BENCHMARKS))

    before = _cpu.cpu_by_part(os.getpid(), rest="other")
    burned, release = threading.Event(), threading.Event()

    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        burned.set()
        release.wait(60)

    spin = "import subprocess, sys, time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\nprint('burned', flush=True)\n"
    grandchild = spin.format(s=0.3) + "time.sleep(30)"
    named = subprocess.Popen([sys.executable, "-c", spin.format(s=0.4) + f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])\ntime.sleep(30)"], start_new_session=True, stdout=subprocess.PIPE, text=True)
    unnamed = subprocess.Popen([sys.executable, "-c", spin.format(s=0.2) + "time.sleep(30)"], start_new_session=True, stdout=subprocess.PIPE, text=True)
    burner = threading.Thread(target=burn, args=(0.5,))
    try:
        burner.start()
        assert burned.wait(60)
        assert [named.stdout.readline(), named.stdout.readline(), unnamed.stdout.readline()] == ["burned\n"] * 3  # they have burned their share and sleep
        parts = _cpu.cpu_by_part(os.getpid(), {burner.native_id: "burner"}, {named.pid: "named"}, rest="other")
        total = _cpu.tree_cpu_seconds(os.getpid())[1]
    finally:
        release.set()
        burner.join()
        for proc in (named, unnamed):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert parts["burner"] >= 0.45, parts
    assert parts["main"] - before["main"] < 0.3, parts  # the thread's time is not the main thread's
    assert 0.65 <= parts["named"] <= 1.5, parts  # itself and its child
    assert parts["other"] - before.get("other", 0.0) >= 0.15, (parts, before)
    assert abs(sum(parts.values()) - total) < 0.05, (parts, total)


def test_collect_scale_names_a_moved_figure_and_only_a_format_change_as_one() -> None:
    """Against the reference (collect before issue 17), improvement.csv gained a column and the reports their
    notes and markup on purpose: that is a format change, but one figure moved in a cell is DIFFERENT."""
    verdict = load_benchmark("collect_scale").verdict
    theirs = {"improvement.csv": "x,y,p\na,b,0.5\n", "report.html": "<td>0.5</td><td class='num'>3/3</td>", "terminal": "t"}
    ours = {"improvement.csv": "x,y,p,no_ci\na,b,0.5,\n", "report.html": "<td data-label='p'>0.5</td><td class='num'>3/3</td>", "terminal": "t"}
    assert verdict(ours, theirs, True).startswith("the same figures (format changed since, on purpose: improvement.csv, report.html;")
    assert verdict(ours, theirs, False) == "DIFFERENT: improvement.csv, report.html"  # against a recent commit: byte for byte
    assert verdict({**ours, "improvement.csv": "x,y,p,no_ci\na,b,0.51,\n"}, theirs, True) == "DIFFERENT figures: improvement.csv"
    assert verdict({**ours, "report.html": "<td>0.5</td><td>2/3</td>"}, theirs, True) == "DIFFERENT figures: report.html"
    assert verdict(theirs, theirs, True).startswith("byte-identical")


def test_collect_scale_takes_an_interval_withheld_since_the_reference_for_the_same_figure() -> None:
    """Since issue 38 hpcrl withholds an interval that says nothing (a side under 3 seeds, or no spread: `1 [1, 1]`)
    and shows one seed's zero-width interval as `-`: with 2 seeds a setting, or by chance with 5, the comparison
    called every such experiment DIFFERENT. The value beside a withheld interval, and every interval shown, must
    still match."""
    verdict = load_benchmark("collect_scale").verdict
    theirs = {
        "improvement.csv": "x,y,p,ci_low,ci_high\na,b,1,1,1\nb,a,0.6,0.2,1\n",
        "terminal": "P(X > Y)  a           b\na         -           1 [1, 1]\nb         0.6 [0.2, 1]  -\nmean  20.1  [20.1, 20.1]",
    }
    ours = {
        "improvement.csv": "x,y,p,ci_low,ci_high,no_ci\na,b,1,,,no spread\nb,a,0.6,0.2,1,\n",
        "terminal": "P(X > Y)  a             b\na         -             1 (no CI: no spread)\nb         0.6 [0.2, 1]  -\nmean  20.1  -",
    }
    assert verdict(ours, theirs, True).startswith("the same figures (format changed since, on purpose: improvement.csv, terminal;")
    moved = {"improvement.csv": ours["improvement.csv"].replace("a,b,1,", "a,b,0.9,"), "terminal": ours["terminal"].replace("1 (no", "0.9 (no")}
    assert verdict(moved, theirs, True) == "DIFFERENT figures: improvement.csv, terminal"
    shown = {"improvement.csv": ours["improvement.csv"].replace("0.2,1,", "0.3,1,"), "terminal": ours["terminal"].replace("[0.2, 1]", "[0.3, 1]")}
    assert verdict(shown, theirs, True) == "DIFFERENT figures: improvement.csv, terminal"
    assert verdict({**ours, "terminal": ours["terminal"].replace("20.1  -", "20.2  -")}, theirs, True) == "DIFFERENT figures: terminal"


GPU_NODE = BENCHMARKS / "gpu_node.sh"


def test_the_gpu_node_script_parses_and_what_it_names_exists() -> None:
    """gpu_node.sh runs only on a lent GPU machine: here it is parsed (`bash -n`), and every repository
    file it names (configs, tests, benchmarks) must still be where it says."""
    assert subprocess.run(["bash", "-n", str(GPU_NODE)], capture_output=True).returncode == 0
    named = set(re.findall(r"\b((?:configs|tests|benchmarks)/[\w./-]+\.(?:py|yaml|sh))", GPU_NODE.read_text()))
    assert named and not [p for p in sorted(named) if not (REPO / p).is_file()]


@pytest.mark.parametrize(("var", "value", "said"), [
    ("SF_SIDES", "random\ntouch {tmp}/ran", "SF_SIDES takes words"),
    ("SF_ENVS", "32; touch {tmp}/ran", "SF_ENVS takes words"),
    ("PYTHON", "python3 -c 'open(\"{tmp}/ran\", \"w\")'", "a path of letters"),
    ("OUT", "{tmp}/an out", "a path of letters"),
])  # fmt: skip
def test_the_gpu_node_script_refuses_a_value_that_would_be_a_command_in_one_line(var: str, value: str, said: str, tmp_path: Path) -> None:
    """Its settings are words in the steps' command lines: a line break, a `;` or a space in a path would run as a
    command or split a path. Exit 2, one line, nothing made and nothing run."""
    value = value.replace("{tmp}", str(tmp_path))
    out = value if var == "OUT" else str(tmp_path / "out")
    env = {**os.environ, "SF_ONLY": "1", **({} if var == "OUT" else {var: value})}
    proc = subprocess.run(["bash", str(GPU_NODE), out], capture_output=True, text=True, cwd=REPO, timeout=60, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_gpu_node_script_stopped_with_term_leaves_no_temporary_files(tmp_path: Path) -> None:
    """bash runs its EXIT trap for a signal only where it traps that signal: stopped with TERM mid-step (a
    lent machine's time running out), the script ends the step's processes at once and removes its temporary
    directory, and the step's games their shared memory (killed at once, they left 10.6 MB a game in /dev/shm)."""
    before = set(os.listdir("/dev/shm"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    bundle = tmp_path / "bundle.tar.xz"  # a stand-in that unpacks: the script's wrapper is made, the step starts
    (tmp_path / "bundle" / "sf").mkdir(parents=True)
    subprocess.run(["tar", "-C", str(tmp_path), "-cJf", str(bundle), "bundle"], check=True)
    env = {**os.environ, "SF_ONLY": "1", "BUNDLE": str(bundle), "TMPDIR": str(scratch), "DEVICE": "cpu", "SF_SECONDS": "60", "SF_SIDES": "random", "PYTHON": sys.executable}
    with subprocess.Popen(["bash", str(GPU_NODE), str(tmp_path / "out")], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True) as script:
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / "out" / "speed_sf.log").exists():
                assert script.poll() is None and time.monotonic() < deadline, "the script never started its step"
                time.sleep(0.05)
            time.sleep(3)  # the step's benchmark and its games under way
            script.terminate()
            stopped = time.monotonic()
            script.wait(timeout=30)  # at once: not when the step's 60 s window ends
            stopped = time.monotonic() - stopped  # 1.6 s by hand; over 10 s while the script waited on a child of its own
            left = in_session(script.pid)  # the step's benchmark, its measurement and its games
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(script.pid, signal.SIGKILL)
    assert sorted(p.name for p in scratch.iterdir() if not p.name.startswith(USER_CACHES)) == [], "gpu_node.sh left its temporary files"
    assert not left, f"the step outlived the script: {left}"
    assert _unheld_games_files(before) == [], "the step's games left their shared memory"
    assert stopped < 9, f"the script took {stopped:.1f} s to stop: its wait for the steps ran to its end"


def _unheld_games_files(before: set[str]) -> list[str]:
    """ViZDoom's files in /dev/shm that were not there `before` and that no process holds: left by games that are
    gone (another test's live games hold theirs)."""
    held = {Path(path).name for path in shared_memory_of(processes())}
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(HELD_FOR_LIFE) and n not in before and n not in held)


@pytest.mark.slow
def test_the_gpu_node_script_runs_where_there_is_a_gpu(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("gpu_node.sh needs an NVIDIA GPU (run it on a lent machine: benchmarks/gpu_node.sh OUT_DIR)")
    proc = subprocess.run(["bash", str(GPU_NODE), str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=1200, env={**os.environ, "SKIP_SPEED": "1"})
    summary = (tmp_path / "summary.txt").read_text() if (tmp_path / "summary.txt").exists() else ""
    assert proc.returncode == 0 and summary and "rc=0" in summary, summary + proc.stderr[-2000:]


@pytest.mark.e2e
def test_the_gpu_node_script_measures_sample_factory_with_a_carried_bundle(tmp_path: Path) -> None:
    """The GPU half's path, tried on a CPU at one env: a bundle as device_bundle.sh packs it (here its sf/ is the built
    venv's site-packages, linked; common/ and hpcrl/ empty, this environment having what they carry) gives Sample
    Factory's side its own packages through the wrapper. Its side alone (SF_SIDES): the others are the benchmark's
    own, run at a tiny size above, and the suite's minutes are few."""
    if importlib.util.find_spec("vizdoom") is None or not _sample_factory_venv_built():
        pytest.skip("needs vizdoom and Sample Factory's venv (a run of vizdoom_speed.py builds it)")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _venvs
    finally:
        sys.path.remove(str(BENCHMARKS))
    site = next(_venvs.CACHE.glob("sample-factory-*/lib/python3*/site-packages"))
    for part in ("common", "hpcrl"):
        (tmp_path / "bundle" / part).mkdir(parents=True)
    (tmp_path / "bundle" / "sf").symlink_to(site)
    subprocess.run(["tar", "-C", str(tmp_path), "-cJf", str(tmp_path / "bundle.tar.xz"), "bundle"], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCRL_BENCH_PYTHON_")}
    scratch = tmp_path / "tmp"  # the script's temporary directory: the bundle unpacked there goes with it (386 MB whole)
    scratch.mkdir()
    env.update(BUNDLE=str(tmp_path / "bundle.tar.xz"), SF_ONLY="1", DEVICE="cpu", SF_ENVS="1", SF_SECONDS="2", SF_SIDES="sample-factory", PYTHON=sys.executable, TMPDIR=str(scratch))
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(GPU_NODE), str(out)], capture_output=True, text=True, cwd=REPO, timeout=400, env=env)
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
    assert proc.returncode == 0 and summary.startswith("speed_sf rc=0"), summary + proc.stderr[-2000:]
    assert sorted(p.name for p in scratch.iterdir() if not p.name.startswith(USER_CACHES)) == [], "gpu_node.sh left its temporary files"
    rows = {row["side"]: row for row in json.loads((out / "speed_sf" / "speed.json").read_text())["rows"]}
    assert set(rows) == {"sample-factory"}, rows
    assert all("error" not in row and row["sps"] > 0 for row in rows.values()), rows


@pytest.mark.parametrize(
    "script,argv,line",
    [
        ("vizdoom_speed.py", ["--out", "{tmp}", "--seconds", "nan"], "argument --seconds: expected finite seconds > 0, at most 3600, got nan"),
        ("distributed.py", ["pipe", "--seconds", "0"], "argument --seconds: expected finite seconds > 0, at most 3600, got 0"),
        ("vizdoom_speed.py", ["--out", "{tmp}", "--num-envs", "0"], "argument --num-envs: expected an integer >= 1, got 0"),
        ("vizdoom_speed.py", ["--out", "{tmp}", "--device", "cuda:x"], "argument --device: expected cpu, cuda or cuda:N, got cuda:x"),
        ("vizdoom_speed.py", ["--out", "{tmp}", "--device", "cuda\n"], "argument --device: expected cpu, cuda or cuda:N, got 'cuda\\n'"),
        ("vizdoom_speed.py", ["--out", "/dev/null"], "argument --out: cannot make a directory there (File exists): '/dev/null'"),
        ("vizdoom_speed.py", ["--out", "/dev/null/speed\nx"], "argument --out: cannot make a directory there (Not a directory): '/dev/null/speed\\nx'"),
        ("vizdoom_speed.py", ["--out", "{tmp}", "--learn", "-5"], "argument --learn: expected an integer >= 0, got -5"),
        ("vizdoom_speed.py", ["--child", "x/../../y"], "argument --child: invalid choice: 'x/../../y'"),
        ("openspiel_alphazero.py", ["--path", "{tmp}", "--cpus", "99999"], "argument --cpus: expected a core this process may use"),
        ("openspiel_alphazero.py", ["--path", "{tmp}", "--minutes", "inf"], "argument --minutes: expected finite minutes >= 0, got inf"),
        ("openspiel_alphazero.py", ["--path", "{tmp}", "--at-once", "--cpus", "0"], "--at-once gives each side a core of its own: 3 sides need 3 of --cpus, not 1"),
        ("openspiel_alphazero.py", ["--path", "{tmp}", "--cpus", "0", "0"], "argument --cpus: each core once (--at-once would put two sides on one), got 0 0"),
        ("openspiel_alphazero.py", ["--path", "{tmp}", "--sides", "hpcrl", "hpcrl"], "argument --sides: each side once (they would train into the same folder)"),
        ("collect_scale.py", ["--before", "no-such-commit"], "argument --before: 'no-such-commit' is no commit of"),
        ("vizdoom_speed.py", ["--out", "{tmp}", "--seed", "-1"], "argument --seed: expected a seed in [0, 4294967295], got -1"),
        ("vizdoom_speed.py", ["--out", "{tmp}", "--seed", "1\n2"], "argument --seed: expected a seed in [0, 4294967295], got '1\\n2'\n"),
        ("algos.py", ["--seeds", "0", "4294967296"], "argument --seeds: expected a seed in [0, 4294967295], got 4294967296"),
        ("collect_scale.py", ["--seeds", "0"], "argument --seeds: expected an integer >= 1, got 0"),
        ("collect_scale.py", ["--runs", "20", "1e9"], "argument --runs: expected a number of runs in [1, 100000], got 1e9"),
        ("stats_scale.py", ["--seeds", "0"], "argument --seeds: expected an integer >= 1, got 0"),
        ("ddppo.py", ["--raw-seconds", "nan"], "argument --raw-seconds: expected finite seconds > 0, at most 3600, got nan"),
        ("mutation.py", ["--timeout-factor", "0"], "argument --timeout-factor: expected a finite number > 0, got 0"),
        ("study_storage.py", ["--reports", "0"], "argument --reports: expected an integer >= 1, got 0"),
        ("alphazero_jobs.py", ["--slack", "nan"], "distributed.ratio_slack: expected a number, got 'nan'"),
        ("alphazero_jobs.py", ["--slack", "2", "--output", "{tmp}/az"], "distributed.ratio_slack: expected a number in [0, 1], got 2"),
        ("algos.py", ["--algos", "ppo", "sac"], "argument --algos: invalid choice: 'sac'"),
        ("distributed.py", ["learning", "--output", "{tmp}"], "is not an empty folder (in one that holds an earlier run, nothing would be trained anew)"),
        ("distributed.py", ["learning", "--output", "{tmp}/a\nb"], "argument --output: expected a folder's path on one line, got"),
        ("distributed.py", ["learning", "--output", "/dev/null/x"], "argument --output: cannot make a directory there (Not a directory): '/dev/null/x'"),
        ("alphazero.py", ["--set", "train.simulations=0"], "tictactoe_alphazero.yaml: train.simulations: expected"),
        ("vizdoom_speed.py", ["--out", "{tmp}/speed", "-p", "nokey=1"], "vizdoom_ppo.yaml: -p nokey: unknown key"),
        ("openspiel_alphazero.py", ["--path", "{tmp}/az", "--set", "nokey=1"], "connect4_alphazero.yaml: -p nokey: unknown key"),
    ],
)
def test_a_benchmark_refuses_a_figure_that_would_measure_nothing_in_one_line(script: str, argv: list[str], line: str, tmp_path: Path) -> None:
    """NaN seconds never ended a measurement, 0 envs divided by zero, a revision that is no commit was a git
    traceback, a config override with a typo a ConfigError traceback (or, in vizdoom_speed.py, a FAILED row per
    side, and in openspiel_alphazero.py minutes of building OpenSpiel's venv first): each is one argparse line and
    exit 2, before anything is built or measured, with no folder made for it (alphazero_jobs.py made its default
    output folder in the temporary directory before the config refused its arguments; vizdoom_speed.py, --out)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(scratch)}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), *(a.replace("{tmp}", str(tmp_path)) for a in argv)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and line in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not any(scratch.iterdir()), sorted(p.name for p in scratch.iterdir())
    made = [a for a in argv if a.startswith("{tmp}/") and Path(a.replace("{tmp}", str(tmp_path))).exists()]
    assert not made, f"refused, yet made {made}"


def test_every_numeric_option_of_a_benchmark_is_checked_by_a_shared_type() -> None:
    """A bare `type=int` took a seed of -1 (each side then failed in numpy) and `--seeds 0` (a division by zero,
    or figures compared against nothing): every numeric option goes through benchmarks/_args.py instead."""
    bare = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                for keyword in node.keywords:
                    if keyword.arg == "type" and isinstance(keyword.value, ast.Name) and keyword.value.id in ("int", "float"):
                        bare.append(f"{path.name}:{node.lineno} {ast.unparse(node.args[0]) if node.args else ''} type={keyword.value.id}")
    assert not bare, "options without a checked type (benchmarks/_args.py):\n" + "\n".join(bare)


def test_two_comparisons_into_one_path_are_refused_in_one_line(tmp_path: Path) -> None:
    """Each run of openspiel_alphazero.py empties its sides' folders under --path: a second run there while the
    first trains would delete the first's snapshots. It is refused before anything is trained or deleted."""
    import fcntl

    with open(tmp_path / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a run in progress holds it
        (tmp_path / "hpcrl").mkdir()
        proc = subprocess.run([sys.executable, str(BENCHMARKS / "openspiel_alphazero.py"), "--path", str(tmp_path), "--sides", "hpcrl", "--minutes", "0.1"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and f"argument --path: another run of this benchmark is using {tmp_path}" in proc.stderr, proc.stderr
    assert (tmp_path / "hpcrl").exists()


@pytest.mark.slow
def test_a_benchmark_killed_with_9_at_once_leaves_no_side_training(tmp_path: Path) -> None:
    """openspiel_alphazero.py --at-once trains its sides in pool workers, each side's training a process of
    its own: kill -9 of the benchmark must take them all down (they would train on for --minutes)."""
    if importlib.util.find_spec("pyspiel") is None:
        pytest.skip("openspiel_alphazero.py needs pyspiel, which is not installed here")
    path = tmp_path / "az"
    argv = ["--game", "tic_tac_toe", "--minutes", "2", "--games", "2", "--simulations", "2", "--sides", "hpcrl", "--at-once", "--path", str(path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    bench = subprocess.Popen([sys.executable, str(BENCHMARKS / "openspiel_alphazero.py"), *argv], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ours() -> dict[int, str]:
        return {pid: line[:120] for pid, line in process_table(str(path)).items() if pid != bench.pid}

    try:
        deadline = time.monotonic() + 120
        while not any("--train-hpcrl" in line for line in ours().values()):  # the side's training has started, under its pool worker
            assert bench.poll() is None and time.monotonic() < deadline, "the hpcrl side never started training"
            time.sleep(0.5)
        bench.kill()
        bench.wait()
        deadline = time.monotonic() + 15
        while ours() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = ours()
    finally:
        bench.kill()
        for pid in ours():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not left, left


def _sample_factory_venv_built() -> bool:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _venvs
    finally:
        sys.path.remove(str(BENCHMARKS))
    return any(_venvs.CACHE.glob("sample-factory-*/.ready"))  # a venv is complete once it has .ready


def _measurement_of(bench: subprocess.Popen, side: str) -> int | None:
    """The pid of `bench`'s measurement of `side` (its child), once it runs. Another test's benchmark may measure
    the same side beside it: the CI run of eabd5f4 ran both cases of the Sample Factory test below at once, each
    took the first measurement it saw for its own, and each killed a process of the other's (both waited 60 s)."""
    return next((pid for pid, line in process_table(str(BENCHMARKS / "vizdoom_speed.py")).items()
                 if f"--child {side}" in line and (stat := process_stat(pid)) is not None and stat.parent == bench.pid), None)  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize(("side", "when"), [("random", "games"), ("sb3", "games"), ("sample-factory", "games"), ("sample-factory", "start")],
                         ids=["random", "sb3", "sample-factory", "sample-factory-in-its-start"])  # fmt: skip
def test_the_vizdoom_benchmark_killed_with_9_leaves_no_env_or_game_engine(side: str, when: str, tmp_path: Path) -> None:
    """vizdoom_speed.py measures each side in a child of its own session: kill -9 of the benchmark must end the
    child, its env workers and the ViZDoom engines under them, which outlived their workers and waited for ever.
    Sample Factory's side works in a folder of its own under /tmp, which the benchmark removes after the
    measurement: killed midway, the measurement removes it as it ends its session (its lifeline's SIGTERM).
    The benchmark runs with a /dev/shm of its own (a mount namespace): whatever it leaves there is its own, the
    semaphores of Sample Factory's queues too (sem.mp-*, which no /proc listing names; a SIGKILL of the whole
    group left them, and the CI run of eabd5f4 a game's message queues). Killed once its games run, or in its
    start (Sample Factory's, once it has made a semaphore: one only its maker maps yet, which a listing misses).
    A game's queue that nobody holds, made since the measurement started (its worker killed from outside), goes
    too, as the benchmark's own end would have removed it."""
    if importlib.util.find_spec("vizdoom") is None:
        pytest.skip("vizdoom_speed.py needs vizdoom, which is not installed here")
    if side == "sb3" and importlib.util.find_spec("stable_baselines3") is None:
        pytest.skip("SB3 is not installed here")
    if side == "sample-factory" and not _sample_factory_venv_built():
        pytest.skip("Sample Factory's venv is not built here (a run of vizdoom_speed.py builds it)")
    (tmp_path / "tmp").mkdir()  # the benchmark's temporary directory: the killed measurement must empty what it made there
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp"), "HPCRL_BENCH_BUILD": "0"}
    log = tmp_path / "bench.log"  # what the benchmark said, should it end before it was killed
    shm = tmp_path / "shm"  # its /dev/shm
    with open(log, "w") as out:
        bench = subprocess.Popen([*_own_shm(shm), sys.executable, str(BENCHMARKS / "vizdoom_speed.py"), "--sides", side, "--num-envs", "2", "--seconds", "120"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    child = None
    try:
        deadline = time.monotonic() + 180
        while child is None or not (any(shm.glob("sem.mp-*")) if when == "start" else sum("vizdoom/vizdoom" in line for _, line in in_session(child)) >= 2):
            assert bench.poll() is None and time.monotonic() < deadline, f"the measurement never started its games (exit {bench.poll()}):\n{log.read_text()[-2000:]}"
            child = _measurement_of(bench, side)
            time.sleep(0.2)
        measuring = list(Path("/tmp").glob(f"vzd-{side}-{bench.pid}-*"))  # this measurement's folder (another test's may be beside it)
        held = shared_memory_of(pid for pid, _ in in_session(child))  # its games' screen buffers and message queues
        (shm / "ViZDoomMQCtr-of-a-worker-killed-alone").touch()  # made since it started, held by nobody: its own too
        bench.kill()
        bench.wait()
        deadline = time.monotonic() + 15
        while in_session(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = in_session(child)  # the measurement is the leader of its own session
    finally:
        _end_all(bench, child)
    assert not left, left
    deadline = time.monotonic() + 10  # removed by a process of its own once the session is gone
    while list(shm.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert when == "start" or len([p for p in held if "ViZDoomMQ" in p]) >= 2, held  # its games ran, and made their files there
    assert sorted(p.name for p in shm.iterdir()) == [], f"held while it ran: {sorted(held)}"  # they stayed in /dev/shm for ever
    # SB3's SubprocVecEnv workers left their games' folders in TMPDIR: each measurement now has a scratch folder of its own.
    assert [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith(USER_CACHES)] == []
    assert not list(Path("/tmp").glob(f"vzd-*-{bench.pid}-*")), "the killed measurement left its scratch folder"
    if side == "sample-factory":
        assert measuring, "no folder of its own while it measured"
        assert not any(folder.exists() for folder in measuring), "the killed measurement left its folder"


@pytest.mark.parametrize("when", ["at-its-start", "games"])
def test_the_vizdoom_benchmark_stopped_with_term_leaves_no_folder_or_process(when: str, tmp_path: Path) -> None:
    """TERM is how a job's time limit or gpu_node.sh's stop ends the benchmark. It unwinds through the measurement's
    cleanup: nothing of the measurement is left running, and no scratch folder in /tmp. TERMed the moment its
    measurement started (before the child had set its own SIGTERM handler), the folder the benchmark had made for it
    stayed in /tmp, one a suite run on CI."""
    if importlib.util.find_spec("vizdoom") is None:
        pytest.skip("vizdoom_speed.py needs vizdoom, which is not installed here")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    bench = subprocess.Popen([sys.executable, str(BENCHMARKS / "vizdoom_speed.py"), "--sides", "random", "--num-envs", "2", "--seconds", "120"],
                             cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    child = None
    try:
        deadline = time.monotonic() + 120
        while child is None or (when == "games" and sum("vizdoom/vizdoom" in line for _, line in in_session(child)) < 2):
            assert bench.poll() is None and time.monotonic() < deadline, "the measurement never started its games"
            child = _measurement_of(bench, "random")
            time.sleep(0.01 if child is None else 0.2)
        bench.terminate()
        assert bench.wait(timeout=30) != 0
        left = in_session(child)
    finally:
        _end_all(bench, child)
    assert not left, left
    assert not list(Path("/tmp").glob(f"vzd-*-{bench.pid}-*")), "the stopped measurement left its scratch folder"


def _end_all(bench: subprocess.Popen, child: int | None) -> None:
    """The benchmark and its measurement's session, whatever the test found of them."""
    bench.kill()
    if child is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)


def _own_shm(shm: Path) -> list[str]:
    """`factories.own_shm`, or the test skipped where it cannot be had."""
    if (prefix := own_shm(shm)) is None:
        pytest.skip("needs root and unshare(1) to give the benchmark a /dev/shm of its own")
    return prefix


def _sample_factory_process(session: int, which: str) -> int | None:
    """The pid of Sample Factory's `which` process in the measurement's session, once it runs: its env_info
    process (the first it spawns, alone, before its runner starts) or a rollout worker (the parent of a game
    engine once two engines run at once: the env_info process's game runs alone, and is gone before the workers start)."""
    table = in_session(session)
    if which == "env_info":
        return next((pid for pid, line in table if "spawn_main" in line), None)
    engines = [pid for pid, line in table if "vizdoom/vizdoom" in line]
    parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in engines if Path(f"/proc/{pid}/stat").exists()}
    return min(parents) if len(parents) >= 2 else None


@pytest.mark.e2e
@pytest.mark.parametrize(("which", "stuck", "said"), [
    ("rollout_worker", False, r"rollout_proc\d \(killed by SIGKILL\) died mid-run"),
    ("rollout_worker", True, r"rollout_proc\d \(killed by SIGKILL\) died mid-run, and its runner did not stop within 15 s"),
    ("env_info", False, r"env_info process \(killed by SIGKILL\) died before its run started"),
], ids=["rollout_worker", "rollout_worker-beside-stuck-peers", "env_info"])  # fmt: skip
def test_sample_factory_s_side_fails_at_once_when_one_of_its_processes_dies(tmp_path: Path, which: str, stuck: bool, said: str) -> None:
    """Sample Factory's runner outlives a rollout worker that died and goes on with the other workers' envs (at half
    its rate with two; with numpy 2 under it, or its games' start race, it trained on nothing and waited out the
    timeout), and its init waits for ever on an env_info process that died (the CI run of 534bb1a killed that one,
    under load, taking its game for a worker's): the benchmark ends the side at once, FAILED, naming the process and
    how it ended. Its runner's stop waits for every live process: one that hangs (stopped here: under a load of 7, in
    the fresh suite at 1be43f4, a killed worker's runner had not stopped 60 s later) has the side end 15 s after.
    Nothing is left in its /dev/shm: a process killed in its game's start alone held the game's message queues, and
    one game's stayed there for ever (after the fresh suites at 74e653c and fbaf44e, and CI's run of fbaf44e)."""
    if importlib.util.find_spec("vizdoom") is None or not _sample_factory_venv_built():
        pytest.skip("needs vizdoom and Sample Factory's venv (a run of vizdoom_speed.py builds it)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HPCRL_BENCH_BUILD": "0"}
    log = tmp_path / "bench.log"
    shm = tmp_path / "shm"  # its /dev/shm: a process killed in its game's start left that game's message queues
    with open(log, "w") as out:
        bench = subprocess.Popen([*_own_shm(shm), sys.executable, str(BENCHMARKS / "vizdoom_speed.py"), "--sides", "sample-factory", "--num-envs", "2", "--seconds", "120", "--timeout", "150"],
                                 cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline, victim = time.monotonic() + 120, None
        while victim is None:
            assert bench.poll() is None and time.monotonic() < deadline, f"its {which} never started (exit {bench.poll()}):\n{log.read_text()[-2000:]}"
            child = _measurement_of(bench, "sample-factory")
            victim = _sample_factory_process(child, which) if child else None
            time.sleep(0.05)
        if stuck:  # every other process of Sample Factory's hangs: its runner, the measurement, alone goes on
            for pid, _ in in_session(child):
                if pid not in (child, victim):
                    os.kill(pid, signal.SIGSTOP)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            bench.wait(timeout=60)
    finally:
        bench.kill()
    text = log.read_text()
    assert time.monotonic() - killed_at < 60 and re.search(f"FAILED: RuntimeError: Sample Factory's {said}", text), text[-2000:]
    assert not in_session(child), in_session(child)
    assert sorted(p.name for p in shm.iterdir()) == []


def test_sides_at_once_get_disjoint_cores_that_cover_all_given() -> None:
    """--at-once promises each side a share of --cpus of its own ("one core each on two"); in turn, every side gets all."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from openspiel_alphazero import core_shares
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert core_shares([0, 1], 2, True) == [[0], [1]]
    assert core_shares([0, 1, 2, 3, 4], 2, True) == [[0, 2, 4], [1, 3]]
    assert core_shares([0, 1], 2, False) == [[0, 1], [0, 1]]
