"""ViZDoom through its own gymnasium wrapper: ids, headless pixels from the config, episode ends
as the learner needs them, the worker groups a rollout pipelines (the same steps as one
AsyncVectorEnv), the three bundled configs running end to end (tiny budgets), and PPO learning
`basic` with the bundled config (slow)."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("vizdoom")

from factories import alive, own_shm  # noqa: E402

from hpcrl.config.experiment import EnvConfig  # noqa: E402
from hpcrl.config.load import load_experiment  # noqa: E402
from hpcrl.leftovers import process_stat, processes, shared_memory_of  # noqa: E402
from hpcrl.rl import envs as envs_module  # noqa: E402
from hpcrl.rl.envs import GroupedVectorEnv, final_observations, make_env, make_vec_env  # noqa: E402
from hpcrl.rl.evaluate import evaluate_run  # noqa: E402
from hpcrl.rl.train import algorithm_class, seed_everything, train_run  # noqa: E402
from hpcrl.rl.vizdoom_env import OwnDirectory, ScreenObservation, block_mean, resolve_id  # noqa: E402
from hpcrl.store.rundir import RunError  # noqa: E402
from hpcrl.sweep.runs import expand  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
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
        "from hpcrl.config.experiment import EnvConfig\n"
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


def test_settings_the_game_cannot_take_stop_the_env_before_it_starts() -> None:
    """An env built where `hpcrl sweep` could not check its settings (ViZDoom in the image only) refuses them
    itself, in one line naming the key, before a game starts: ViZDoom's own config printed a warning and went on
    as if they were unset. Through the workers too, where the spaces probe builds the first env."""
    for kwargs, says in [
        ({"screen_resolutoin": "RES_160X120"}, "env.kwargs.screen_resolutoin: not a setting of ViZDoom's game config"),
        ({"episode_timeout": -5}, r"env.kwargs.episode_timeout: ViZDoom cannot take -5 \(Unsigned int value expected"),
        ({"doom_map": "map01\nepisode_timeout = 5"}, "env.kwargs.doom_map: .* has a line break"),
        ({"frame_skip": 0}, "env.kwargs.frame_skip: expected a positive integer"),
        ({"available_game_variables": ["AMMO2", "NOPE"]}, r"env.kwargs.available_game_variables: ViZDoom cannot take .* \(Unsupported value: nope\)$"),
    ]:
        with pytest.raises(ValueError, match=says):
            make_env(EnvConfig(backend="vizdoom", id="basic", kwargs=kwargs))
    with pytest.raises(ValueError, match="env.kwargs.living_reward: expected a finite number") as caught:
        make_vec_env(EnvConfig(backend="vizdoom", id="basic", num_envs=2, kwargs={"living_reward": float("inf")}))
    assert "\n" not in str(caught.value)


def test_the_settings_check_stands_where_stderr_is_closed() -> None:
    """A job started with its stderr closed: ViZDoom's reason is lost (it writes it there), not the check."""
    code = "from hpcrl.rl.vizdoom_settings import settings_fault as f; print(f({'bogus': 1})); print(f({'episode_timeout': 300}))"
    run = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.close(2), text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.splitlines() == ["env.kwargs.bogus: ViZDoom cannot take 1 (ViZDoom's warning went to no stderr)", "None"]


@pytest.mark.parametrize(("shape", "factor"), [((1, 120, 160), 2), ((3, 120, 160), 4), ((1, 240, 320), 5), ((3, 480, 640), 16), ((1, 6, 4), 2)])
def test_downsampling_is_the_floored_mean_of_each_block(shape: tuple[int, int, int], factor: int) -> None:
    """The downsampled frame is each block's mean rounded down, for grey and RGB, up to blocks whose sum
    overflows 16 bits (16 x 16 x 255), and at the extremes (all 255, and 254s beside 255s that must not
    round up)."""
    rng = np.random.default_rng(factor)
    c, h, w = shape
    frames = [rng.integers(0, 256, shape, dtype=np.uint8), np.full(shape, 255, np.uint8), np.where(rng.random(shape) < 0.9, 255, 254).astype(np.uint8)]
    for frame in frames:
        expected = np.floor(frame.reshape(c, h // factor, factor, w // factor, factor).astype(np.float64).mean(axis=(2, 4))).astype(np.uint8)
        got = block_mean(frame, factor)
        assert got.dtype == np.uint8 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, expected)
    transposed = rng.integers(0, 256, (h, w, c), dtype=np.uint8).transpose(2, 0, 1)  # ViZDoom's HWC screen, as the adapter sees it
    np.testing.assert_array_equal(block_mean(transposed, factor), block_mean(np.ascontiguousarray(transposed), factor))


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


def test_max_episode_steps_cuts_episodes_as_truncations() -> None:
    """`env.max_episode_steps: 5` ends every episode of the run's envs after 5 steps, as a truncation, while
    the adapter still steps the game itself. A time limit under the adapter (where gymnasium.make puts one),
    which that direct step would pass by, sends the steps through the wrappers instead."""
    limited = dataclasses.replace(BASIC, max_episode_steps=5)
    envs = make_vec_env(limited)
    one = make_env(limited)
    under = ScreenObservation(OwnDirectory(gym.make(resolve_id("basic"), max_episode_steps=3)))
    try:
        envs.reset(seed=0)
        for _ in range(2):  # and again after the autoreset
            ends = [envs.step(np.zeros(2, dtype=np.int64)) for _ in range(5)]
            assert [(bool(e[2].any()), bool(e[3].any())) for e in ends] == [(False, False)] * 4 + [(False, True)]
            assert ends[-1][3].all() and ends[-1][4]["episode"]["l"].tolist() == [5, 5]
        assert one.get_wrapper_attr("_buttons") is not None  # the direct step, as without a limit
        under.reset(seed=0)
        assert [under.step(0)[2:4] for _ in range(3)] == [(False, False), (False, False), (False, True)]
        assert under.get_wrapper_attr("_buttons") is None
    finally:
        envs.close()
        one.close()
        under.close()


@pytest.mark.parametrize("screen_format", ["GRAY8", "RGB24"])
def test_a_step_straight_to_the_game_is_the_wrappers_step(screen_format: str) -> None:
    """The adapter steps the game itself (ScreenObservation's direct path): from the same seed and
    actions, every frame, reward and episode end is what ViZDoom's own gymnasium wrapper gives,
    through kills (terminated), timeouts (truncated only) and the resets after them; and so does
    the adapter's path through the wrapper, which an env with a render mode (a video's) takes.
    Actions it cannot take are refused in one line, as is a step before the first reset."""
    kwargs = {"frame_skip": 4, "screen_resolution": "RES_160X120", "screen_format": screen_format}
    spec = EnvConfig(backend="vizdoom", id="basic", kwargs={**kwargs, "downsample": 2})
    ours, rendered = make_env(spec), make_env(spec, render_mode="rgb_array")
    theirs = OwnDirectory(gym.make(resolve_id("basic"), **kwargs))  # its engine's files in a folder of its own, not the working directory
    try:
        with pytest.raises(gym.error.ResetNeeded):
            ours.step(1)
        rng = np.random.default_rng(0)
        ends = {"terminated": 0, "truncated": 0}
        obs, _ = ours.reset(seed=5)
        expected, _ = theirs.reset(seed=5)
        rendered.reset(seed=5)
        for step in range(900):
            np.testing.assert_array_equal(obs, block_mean(expected["screen"].transpose(2, 0, 1), 2), err_msg=f"step {step}")
            action = np.int64(rng.integers(4) if step % 200 < 100 else 0)  # idle stretches run into the 75-step timeout
            obs, reward, terminated, truncated, info = ours.step(np.array(action) if step % 2 else action)  # a 0-d array is an action too
            # (not to ViZDoom's wrapper, which presses every button with a 0-d array's value)
            expected, their_reward, their_terminated, their_truncated, _ = theirs.step(action)
            assert (reward, terminated, truncated, info) == (their_reward, their_terminated and not their_truncated, their_truncated, {}), f"step {step}"
            through_wrapper = rendered.step(action)
            np.testing.assert_array_equal(through_wrapper[0], obs, err_msg=f"step {step}")
            assert through_wrapper[1:4] == (reward, terminated, truncated), f"step {step}"
            if terminated or truncated:
                ends["terminated" if terminated else "truncated"] += 1
                obs, _ = ours.reset()
                expected, _ = theirs.reset()
                rendered.reset()
        assert ends["terminated"] >= 2 and ends["truncated"] >= 2, ends  # both ends met (2 and 10 here)
        for bad in (4, -1, 1.0, "1", None, np.array([1]), np.array(1.0)):
            with pytest.raises(ValueError, match="invalid: expected an integer action in 0..3"):
                ours.step(bad)
    finally:
        ours.close()
        rendered.close()
        theirs.close()


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["vizdoom_ppo", "vizdoom_a2c", "vizdoom_dqn"])
def test_bundled_configs_train_and_evaluate(name: str, tmp_path: Path) -> None:
    overrides = ["env.num_envs=2", "train.torch_threads=1", "train.device=cpu", "eval.episodes=2", "sweep.seeds=[0]"]
    if name == "vizdoom_dqn":
        overrides += ["train.total_steps=96", "train.learning_starts=64", "train.buffer_size=200", "train.checkpoint_every=10"]
    else:
        overrides += ["train.total_steps=80", "train.num_steps=10"] + (["train.num_minibatches=4"] if name == "vizdoom_ppo" else [])  # 2 x 10 in 4 minibatches of 5
    exp = load_experiment(ROOT / "configs" / f"{name}.yaml", overrides + [f"output={tmp_path}"])
    (run,) = expand(exp)
    experiment_dir = tmp_path / name
    assert train_run(experiment_dir, run) == 0
    assert evaluate_run(experiment_dir, run) == 0
    rd = experiment_dir / "runs" / run.run_id
    rows = (rd / "eval.csv").read_text().splitlines()
    assert rows[0].startswith("episode,return,length") and len(rows) == 3


class _StartTogether(gym.Wrapper):
    """Holds an env's first reset, where its game starts, until every worker has reached it."""

    def __init__(self, env: gym.Env, barrier: threading.Barrier) -> None:
        super().__init__(env)
        self.barrier: threading.Barrier | None = barrier

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.barrier is not None:
            self.barrier.wait(timeout=90)
            self.barrier = None
        return self.env.reset(**kwargs)


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_32_workers_starting_at_the_same_instant_all_reset_and_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """32 ViZDoom workers of one env each, whose games start at one instant (a barrier before each first reset) all
    reset and step, and leave nothing behind: not in the working directory they share, not in the
    temporary directory.

    Their engines used to share the working directory: each checks for `./_vizdoom/`, then creates
    it, and rewrites `./_vizdoom.ini` there. On a 16-core node, games started together lose that
    race (`Failed to create ./_vizdoom/ directory: File exists`, the worker crashes or hangs); on 2
    cores their starts are serialised and the window between check and create is too short to hit
    (0 failures in 3 tries of 32 raw games behind a barrier). So the shared directory here holds the
    loser's view for every worker: a `./_vizdoom` the engine did not make, which gave each engine
    that very error (and each worker a segfault) before games had directories of their own."""
    shared, private = tmp_path / "shared", tmp_path / "tmp"
    shared.mkdir()
    private.mkdir()
    (shared / "_vizdoom").write_text("")
    monkeypatch.chdir(shared)
    monkeypatch.setattr(tempfile, "tempdir", str(private))  # the workers are forked: theirs too
    barrier = multiprocessing.get_context("fork").Barrier(32)
    make = envs_module.BACKENDS["vizdoom"]
    monkeypatch.setitem(envs_module.BACKENDS, "vizdoom", lambda spec, render_mode: _StartTogether(make(spec, render_mode), barrier))
    began = time.monotonic()
    envs = make_vec_env(EnvConfig(backend="vizdoom", id="basic", num_envs=32, envs_per_worker=1, worker_timeout_s=120, kwargs={"downsample": 2}))
    try:
        obs, _ = envs.reset(seed=0)
        started = time.monotonic() - began
        assert obs.shape == (32, 1, 60, 80) and all(frame.std() > 5 for frame in obs)  # 32 rendered rooms
        for _ in range(3):
            obs, reward, *_ = envs.step(np.full(32, 2))  # attack
        assert obs.shape == (32, 1, 60, 80) and reward.shape == (32,)
    finally:
        envs.close()
    print(f"32 ViZDoom workers started and reset in {started:.1f} s")
    assert sorted(p.name for p in shared.iterdir()) == ["_vizdoom"] and (shared / "_vizdoom").read_text() == ""
    assert list(private.iterdir()) == []  # each game's directory removed as it closed


def _one_async_vector_env(spec: EnvConfig) -> gym.vector.VectorEnv:
    """What make_vec_env built before the worker groups: one AsyncVectorEnv of all the envs."""
    workers = gym.vector.AsyncVectorEnv([lambda: make_env(spec) for _ in range(spec.num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return gym.wrappers.vector.RecordEpisodeStatistics(workers)


def test_worker_groups_step_as_one_async_vector_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 envs in groups of 2 and 1: the same observations, rewards, episode ends, final frames and
    episode statistics as one AsyncVectorEnv with the same seeds and actions. (Two cores, as CI has:
    on one, 3 workers are more than twice the cores and form one group, which would compare nothing.)"""
    monkeypatch.setattr(envs_module, "usable_cores", lambda: 2)
    spec = EnvConfig(backend="vizdoom", id="basic", num_envs=3, vectorization="async", kwargs={"downsample": 2})
    grouped, one = make_vec_env(spec, pipelined=True), _one_async_vector_env(spec)
    try:
        assert isinstance(grouped, GroupedVectorEnv) and [g.num_envs for g in grouped.groups] == [2, 1]
        assert grouped.observation_space == one.observation_space and grouped.action_space == one.action_space
        np.testing.assert_array_equal(grouped.reset(seed=5)[0], one.reset(seed=5)[0])
        rng = np.random.default_rng(0)
        episodes = 0
        for _ in range(160):  # attacking ends episodes early; doing nothing runs into the timeout
            actions = rng.choice([0, 2], size=3, p=[0.9, 0.1])
            mine, theirs = grouped.step(actions), one.step(actions)
            for a, b in zip(mine[:4], theirs[:4]):
                np.testing.assert_array_equal(a, b)
            info, expected = mine[4], theirs[4]
            assert ("_episode" in info) == ("_episode" in expected)
            if "_episode" in expected:
                np.testing.assert_array_equal(info["_episode"], expected["_episode"])
                for key in ("r", "l"):
                    np.testing.assert_array_equal(info["episode"][key], expected["episode"][key])
                np.testing.assert_array_equal(final_observations(mine[0], info), final_observations(theirs[0], expected))
                episodes += int(expected["_episode"].sum())
        assert episodes >= 3
    finally:
        grouped.close()
        one.close()


@pytest.mark.e2e
@pytest.mark.parametrize("recurrent_size", [0, 16])
def test_pipelined_rollout_is_the_batched_rollout(recurrent_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollout over worker groups (each group's forward pass while the other group steps, as on a
    GPU; pipelined here on the CPU) gives every env the observations, actions, episode starts and
    episodes that one batched forward pass per vector step gives, from the same seed. Log-probabilities, values and rewards (a timeout's
    bootstrap value) may differ in the last bit: the CNN's kernels sum in another order for a
    smaller batch or another thread count."""
    monkeypatch.setattr(envs_module, "usable_cores", lambda: 2)  # 2 workers of 2 envs, in two groups
    exp = load_experiment(ROOT / "configs" / "vizdoom_ppo.yaml", ["env.num_envs=4", "train.num_steps=90", "train.num_minibatches=4", f"train.recurrent_size={recurrent_size}"])
    results = []
    for envs in (make_vec_env(exp.env, pipelined=True), _one_async_vector_env(exp.env)):
        seed_everything(0)
        torch.set_num_threads(2)
        try:
            agent = algorithm_class("ppo")(exp.train, envs, torch.device("cpu"), 0)
            agent.pipelined = isinstance(envs, GroupedVectorEnv)
            assert not agent.pipelined or len(envs.groups) == 2
            agent.collect()  # 90 steps: past the 75-step timeout of the envs that never shoot
            results.append((agent.obs, agent.actions, agent.logprobs, agent.values, agent.firsts, agent.episodes, agent.rewards, agent.state))
        finally:
            envs.close()
        assert torch.get_num_threads() == min(2, len(os.sched_getaffinity(0)))  # the update's threads are back
    (obs, actions, logprobs, values, firsts, episodes, rewards, state), expected = results
    torch.testing.assert_close(obs, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(actions, expected[1], rtol=0, atol=0)
    torch.testing.assert_close(logprobs, expected[2], rtol=0, atol=1e-6)
    torch.testing.assert_close(values, expected[3], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(firsts, expected[4])
    assert episodes == expected[5] and len(episodes) > 0
    np.testing.assert_allclose(rewards, expected[6], rtol=0, atol=1e-6)
    if recurrent_size:
        torch.testing.assert_close(state, expected[7])


@pytest.mark.slow
def test_ppo_learns_basic_with_the_bundled_config(tmp_path: Path) -> None:
    """configs/vizdoom_ppo.yaml as bundled, on the CPU, for 49,152 steps (96 updates): a random policy scores
    about -190 and a trained one 70-90; the final evaluation (20 episodes of the last checkpoint) must reach 70.
    Seeds 0/1/2 scored 77.65/80.15/71.65 at 49,152 steps with the 8 workers in one group on 2 cores (the test's
    own code path; at 40,960 they scored 67.05/72.75/55.45, which CI's seed 0 failed: 40,960 had been
    calibrated with two worker groups, 77.9/81.2/80.9, and a run's last bits differ between the two, so its
    trajectory does). With 2 workers of 4 envs (the same trajectories, one batched forward pass a step) and the
    evaluation's actions drawn from a generator of its seed: 78.15/81.25/75.25 (2026-12-02); with the first
    convolution trained as a GEMM (first_conv.patch_conv, an AVX2 EPYC): 76.80/77.65/78.45; on a Xeon with AMX, the
    first convolution in float32 under bf16: 76.65/75.95/78.60; space-to-depth in bf16 (first_conv.FirstConv2d):
    81.45/81.05/78.25; at the config's learning rate of 1.5e-3 (was 5e-4): 82.8/82.8/79.9 (2026-12-07). About 1-2
    minutes on 2 cores."""
    exp = load_experiment(ROOT / "configs" / "vizdoom_ppo.yaml", ["train.total_steps=49152", "train.device=cpu", "sweep.seeds=[0]", f"output={tmp_path}"])
    (run,) = expand(exp)
    experiment_dir = tmp_path / exp.name
    assert train_run(experiment_dir, run) == 0
    assert evaluate_run(experiment_dir, run) == 0
    rows = (experiment_dir / "runs" / run.run_id / "eval.csv").read_text().splitlines()
    returns = [float(row.split(",")[1]) for row in rows[1:]]
    assert len(returns) == exp.eval.episodes
    assert np.mean(returns) >= 70, returns


def _descendants(pid: int) -> list[int]:
    """Every process under `pid`, from /proc's children lists."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            children = [int(c) for c in open(f"/proc/{pid}/task/{task}/children").read().split()]
        except FileNotFoundError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"), reason="needs /proc's children lists")
def test_games_whose_workers_are_killed_leave_nothing_in_shared_memory() -> None:
    """Workers killed with their games (a worker that timed out or died, a close by force): each game's screen
    buffer (10.6 MB at 160x120) and message queues leave /dev/shm with them. They stayed for ever before, in the
    node's RAM (47 objects here after one session of killed benchmark measurements)."""
    envs = make_vec_env(EnvConfig(backend="vizdoom", id="basic", num_envs=2, vectorization="async", kwargs={"downsample": 2}))
    try:
        envs.reset(seed=0)
        base = envs.unwrapped
        workers = [p.pid for group in getattr(base, "groups", [base]) for p in group.unwrapped.processes]
        held = shared_memory_of([*workers, *(d for w in workers for d in _descendants(w))])
        assert len([p for p in held if "ViZDoomSM" in p]) == 2, held  # a screen buffer a game
    finally:
        envs.close(terminate=True)
    assert not [p for p in held if os.path.exists(p)]


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"), reason="needs /proc's children lists")
def test_a_worker_killed_from_outside_takes_its_game_and_its_files_with_it() -> None:
    """A worker SIGKILLed by someone else (the OOM killer, a user's kill): the step names it, and its game's engine,
    orphaned at once, goes with the other worker and its game, as do both games' files. The engine, left to init,
    waited for its controller for ever, holding its screen buffer and queues in /dev/shm."""
    envs = make_vec_env(EnvConfig(backend="vizdoom", id="basic", num_envs=2, vectorization="async", kwargs={"downsample": 2}))
    try:
        envs.reset(seed=0)
        base = envs.unwrapped
        workers = [p.pid for group in getattr(base, "groups", [base]) for p in group.unwrapped.processes]
        engines = [d for w in workers for d in _descendants(w)]
        held = shared_memory_of([*workers, *engines])
        assert len([p for p in held if "ViZDoomSM" in p]) == 2, held
        os.kill(workers[1], signal.SIGKILL)
        with pytest.raises(RunError, match=r"env basic: worker 1 was killed by SIGKILL during step"):
            for _ in range(20):
                envs.step(np.zeros(2, dtype=np.int64))
    finally:
        envs.close()
    live = [pid for pid in engines if alive(pid)]
    assert not live, f"engines still running: {live}"
    assert not [p for p in held if os.path.exists(p)]


OWNER = """
import numpy as np
from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.envs import make_vec_env
envs = make_vec_env(EnvConfig(backend="vizdoom", id="basic", num_envs=2, vectorization="async", kwargs={"downsample": 2}))
envs.reset(seed=0)
print("ready", flush=True)
while True:
    envs.step(np.zeros(2, dtype=np.int64))
"""


def test_a_process_stepping_games_killed_with_9_leaves_no_engine_and_no_file(tmp_path: Path) -> None:
    """`kill -9` of what owns the vector env (an evaluation, a benchmark, a user's script, a trainer outside a task):
    its workers die with it (their death signal), and each worker's watch ends its game and removes the game's files,
    in /dev/shm and in the temporary directory. Before, the engines ran on for ever, reparented to init, each with its
    screen and queues in /dev/shm; and later each worker's directory of game directories stayed in /tmp."""
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    tmp.mkdir()
    prefix = own_shm(shm)  # a /dev/shm of its own where it can, so that only its own games' files are counted
    env = {**os.environ, "TMPDIR": str(tmp)}
    owner = subprocess.Popen([*(prefix or []), sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
    session: list[int] = []
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "ready\n"
        session = [pid for pid in _session(owner.pid) if pid != owner.pid]
        assert len([pid for pid in session if open(f"/proc/{pid}/comm").read().strip() == "vizdoom"]) == 2, session
        time.sleep(0.2)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(5)
        deadline = time.monotonic() + 15
        while _session(owner.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _session(owner.pid), f"left running: {_session(owner.pid)}"
        if prefix:
            assert sorted(p.name for p in shm.iterdir()) == []
        assert sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")) == []
    finally:
        for pid in session:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _session(session: int) -> list[int]:
    """The live processes of `session`."""
    return [pid for pid in processes() if (stat := process_stat(pid)) is not None and stat.live and stat.session == session]


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"), reason="needs /proc's children lists")
def test_a_warning_or_ctrl_c_sent_to_every_process_of_the_job_leaves_the_games_running() -> None:
    """Grid Engine signals every process of a job at its warnings (USR1, USR2), Slurm's cancel every process of a
    step (TERM), a terminal its foreground group (SIGINT). The trainer checkpoints on them; its env workers and
    their ViZDoom engines, which died of them ("Unexpected ViZDoom instance crash" at the next step: a run failed
    where it was asked to save), step on."""
    envs = make_vec_env(EnvConfig(backend="vizdoom", id="basic", num_envs=2, vectorization="async", kwargs={"downsample": 2}))
    try:
        envs.reset(seed=0)
        base = envs.unwrapped
        workers = [p.pid for group in getattr(base, "groups", [base]) for p in group.unwrapped.processes]
        helpers = [*workers, *(d for w in workers for d in _descendants(w))]
        assert any(open(f"/proc/{p}/comm").read().strip() == "vizdoom" for p in helpers), "no ViZDoom engine under the trainer"
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
            for pid in helpers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        time.sleep(0.5)
        for _ in range(20):
            envs.step(np.zeros(2, dtype=np.int64))
        assert all(alive(p) for p in helpers)
    finally:
        envs.close()
