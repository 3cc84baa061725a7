"""ViZDoom through its own gymnasium wrapper: ids, headless pixels from the config, episode ends
as the learner needs them, and the three bundled configs running end to end (tiny budgets)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vizdoom")

from hpcrl.config import EnvConfig, load_experiment  # noqa: E402
from hpcrl.rl.envs import final_observations, make_env, make_vec_env  # noqa: E402
from hpcrl.rl.evaluate import evaluate_run  # noqa: E402
from hpcrl.rl.train import train_run  # noqa: E402
from hpcrl.rl.vizdoom_env import resolve_id  # noqa: E402
from hpcrl.sweep import expand  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASIC = EnvConfig(backend="vizdoom", id="basic", num_envs=2, kwargs={"downsample": 2})


def test_scenario_names_resolve_to_v1_ids() -> None:
    assert resolve_id("basic") == "VizdoomBasic-v1"
    assert resolve_id("defend_the_center") == "VizdoomDefendCenter-v1"
    assert resolve_id("health_gathering") == "VizdoomHealthGathering-v1"
    assert resolve_id("VizdoomTakeCover-v1") == "VizdoomTakeCover-v1"
    with pytest.raises(ValueError, match="ids end in -v1"):
        resolve_id("VizdoomBasic-v0")


def test_env_factory_registers_the_ids_itself() -> None:
    """A fresh process (as an AsyncVectorEnv worker started by spawn or forkserver) has no
    Vizdoom ids registered until the factory imports vizdoom.gymnasium_wrapper."""
    code = (
        "import gymnasium as gym\n"
        "assert 'VizdoomBasic-v1' not in gym.registry\n"
        "from hpcrl.config import EnvConfig\n"
        "from hpcrl.rl.envs import make_env\n"
        "env = make_env(EnvConfig(backend='vizdoom', id='VizdoomBasic-v1'))\n"
        "print(env.reset(seed=0)[0].shape)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(1, 120, 160)"


def test_screen_is_channel_first_uint8_at_the_configured_resolution_and_format() -> None:
    env = make_env(EnvConfig(backend="vizdoom", id="basic", kwargs={"screen_format": "RGB24", "screen_resolution": "RES_160X120", "downsample": 4}))
    try:
        obs, _ = env.reset(seed=0)
        assert env.observation_space.shape == obs.shape == (3, 30, 40) and obs.dtype == np.uint8
        assert obs.std() > 5  # a rendered room, not a blank frame
    finally:
        env.close()
    stacked = make_env(EnvConfig(backend="vizdoom", id="basic", frame_stack=4, kwargs={"downsample": 2}))
    try:
        assert stacked.reset(seed=0)[0].shape == (4, 60, 80)
    finally:
        stacked.close()
    with pytest.raises(ValueError, match="does not divide"):
        make_env(EnvConfig(backend="vizdoom", id="basic", kwargs={"downsample": 7}))


def test_timeouts_are_truncations_and_final_frames_are_real() -> None:
    """Doing nothing in `basic` runs into its 300-tic timeout (75 steps at frame skip 4): that must
    arrive as truncation (bootstrapped), with a real last frame in final_obs, not the zeros the game
    returns after an episode ends."""
    envs = make_vec_env(BASIC)
    try:
        envs.reset(seed=0)
        for step in range(1, 80):  # noqa: B007 (read after the loop)
            obs, _, terminated, truncated, info = envs.step(np.zeros(2, dtype=np.int64))  # action 0: no button
            if truncated.any() or terminated.any():
                break
        assert step == 75 and truncated.all() and not terminated.any()
        last = final_observations(obs, info)
        assert all(last[i].std() > 5 for i in range(2))
        assert info["episode"]["r"][info["_episode"]].tolist() == [-300.0, -300.0]  # -1 per tic
    finally:
        envs.close()


@pytest.mark.parametrize("name", ["vizdoom_ppo", "vizdoom_a2c", "vizdoom_dqn"])
def test_bundled_configs_train_and_evaluate(name: str, tmp_path: Path) -> None:
    overrides = ["env.num_envs=2", "train.torch_threads=1", "train.device=cpu", "eval.episodes=2", "sweep.seeds=[0]"]
    if name == "vizdoom_dqn":
        overrides += ["train.total_steps=96", "train.learning_starts=64", "train.buffer_size=200", "train.checkpoint_every=10"]
    else:
        overrides += ["train.total_steps=80", "train.num_steps=10"]
    exp = load_experiment(ROOT / "configs" / f"{name}.yaml", overrides + [f"output={tmp_path}"])
    (run,) = expand(exp)
    experiment_dir = tmp_path / name
    assert train_run(experiment_dir, run) == 0
    assert evaluate_run(experiment_dir, run) == 0
    rd = experiment_dir / "runs" / run.run_id
    rows = (rd / "eval.csv").read_text().splitlines()
    assert rows[0].startswith("episode,return,length") and len(rows) == 3
