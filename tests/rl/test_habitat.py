"""The Habitat PointNav adapter, tested against tests/standins/habitat_sim_standin.py: a STAND-IN
for habitat-sim (which has no Linux wheel), not the simulator. The stand-in's floor is a 10 m
square, its geodesic distance is city-block, so a pathfinder answer is told from a straight line.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import standins.habitat_sim_standin as standin
import torch

from hpcrl.config.experiment import EnvConfig
from hpcrl.config.load import load_experiment
from hpcrl.rl.envs import make_env, make_vec_env
from hpcrl.rl.evaluate import play
from hpcrl.rl.habitat_env import MISSING, PointNavEnv, PointNavSettings, pointgoal
from hpcrl.rl.ppo import PPO
from hpcrl.sweep.runs import expand

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def scene(tmp_path: Path) -> Path:
    path = tmp_path / "scenes" / "room-nonavmesh.glb"  # the stand-in builds its navmesh on request
    path.parent.mkdir()
    path.write_bytes(b"glTF")
    return path


def make(scene: Path, **kwargs: object) -> PointNavEnv:
    spec = EnvConfig(backend="habitat", id="PointNav", kwargs={"scene": str(scene), "resolution": [16, 16], **kwargs})
    return PointNavEnv(PointNavSettings.from_spec(spec), sim_module=standin)


def place(env: PointNavEnv, position: list[float], yaw: float, goal: list[float]) -> dict[str, np.ndarray]:
    """Put the agent at a pose with a goal, as an episode start would; returns the observation."""
    state = standin.AgentState()
    state.position = np.array(position, np.float32)
    state.rotation = np.array([0.0, math.sin(yaw / 2), 0.0, math.cos(yaw / 2)])
    env.sim.get_agent(0).set_state(state)
    env.episode.goal = np.array(goal, np.float32)
    env.episode.start = state.position
    env.shortest = env.distance = env._geodesic(state.position, env.episode.goal)
    env.steps, env.path_length = 0, 0.0
    return env._observe(env.sim.get_sensor_observations())


def test_pointgoal_is_distance_and_angle_in_the_agents_frame() -> None:
    facing_minus_z = np.array([0.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(pointgoal(np.zeros(3), facing_minus_z, np.array([0.0, 0.0, -2.0])), [2.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(pointgoal(np.zeros(3), facing_minus_z, np.array([-3.0, 0.0, 0.0])), [3.0, math.pi / 2], atol=1e-6)
    turned_left = np.array([0.0, math.sin(math.pi / 4), 0.0, math.cos(math.pi / 4)])  # yaw +90 deg: now facing -x
    np.testing.assert_allclose(pointgoal(np.zeros(3), turned_left, np.array([-3.0, 0.0, 0.0])), [3.0, 0.0], atol=1e-6)


def test_observations_come_from_the_simulators_sensors_and_agent_state(scene: Path) -> None:
    env = make(scene, sensors=["depth", "rgb"], max_depth=10.0)
    env.reset(seed=0)
    assert env.sim.navmesh_settings.agent_height == 1.5 and env.sim.navmesh_settings.agent_radius == 0.1
    specs = {s.uuid: s for s in env.sim.config.agents[0].sensor_specifications}
    assert specs["depth"].sensor_type == standin.SensorType.DEPTH and specs["depth"].position == [0.0, 1.25, 0.0]
    obs = place(env, [5.0, 0.0, 5.0], 0.0, [5.0, 0.0, 3.0])
    assert env.observation_space.contains(obs)
    assert obs["depth"].shape == (1, 16, 16) and obs["depth"][0, 0, 0] == pytest.approx(0.5)  # 5 m to the wall / 10 m
    assert obs["rgb"].shape == (3, 16, 16) and obs["rgb"][0, 0, 0] == int(255 * 0.5)
    np.testing.assert_allclose(obs["pointgoal"], [2.0, 0.0], atol=1e-6)


def test_rewards_follow_geodesic_progress_and_success_ends_with_spl(scene: Path) -> None:
    env = make(scene, sensors=["depth"])
    env.reset(seed=0)
    place(env, [5.0, 0.0, 5.0], 0.0, [6.0, 0.0, 4.5])  # geodesic 1.5 m (city-block), straight line 1.12 m
    _, reward, terminated, truncated, _ = env.step(1)  # forward 0.25 m along -z
    assert reward == pytest.approx(0.25 - 0.01) and not (terminated or truncated)
    _, reward, *_ = env.step(2)  # turn left: no progress
    assert reward == pytest.approx(-0.01)
    _, reward, *_ = env.step(3)
    for _ in range(9):
        env.step(3)  # right 90 deg in all: now facing +x
    for _ in range(4):
        env.step(1)
    _, reward, terminated, truncated, info = env.step(0)  # STOP 0.25 m short (geodesic): a failure
    assert terminated and not truncated
    assert info["episode_metrics"]["success"] == 0.0 and info["episode_metrics"]["distance_to_goal"] == pytest.approx(0.25)
    assert reward == pytest.approx(-0.01)

    env.reset(seed=1)
    place(env, [5.0, 0.0, 5.0], 0.0, [5.0, 0.0, 4.0])
    for _ in range(4):
        env.step(1)
    _, reward, terminated, _, info = env.step(0)
    assert terminated and info["episode_metrics"] == {"success": 1.0, "spl": pytest.approx(1.0), "distance_to_goal": pytest.approx(0.0, abs=1e-6)}
    assert reward == pytest.approx(2.5 - 0.01)


def test_time_limit_is_a_truncation(scene: Path) -> None:
    env = make(scene, max_episode_steps=5)
    env.reset(seed=0)
    for _ in range(5):
        _, _, terminated, truncated, info = env.step(2)
    assert truncated and not terminated and info["episode_metrics"]["success"] == 0.0


def test_sampled_episodes_respect_the_geodesic_range(scene: Path) -> None:
    env = make(scene, min_geodesic=2.0, max_geodesic=4.0)
    for seed in range(20):
        env.reset(seed=seed)
        assert 2.0 <= env.shortest <= 4.0
        assert env._geodesic(env.episode.start, env.episode.goal) != pytest.approx(np.linalg.norm(env.episode.start - env.episode.goal))


def test_dataset_episodes_and_scene_paths(tmp_path: Path, scene: Path) -> None:
    """A PointNav v1 split: an index file with content/<scene>.json.gz beside it; scene ids start
    with data/scene_datasets/, which `scenes_dir` replaces."""
    split = tmp_path / "pointnav" / "train"
    (split / "content").mkdir(parents=True)
    with gzip.open(split / "train.json.gz", "wt") as f:
        json.dump({"episodes": []}, f)
    episode = {"scene_id": "data/scene_datasets/room-nonavmesh.glb", "start_position": [2.0, 0.0, 2.0],
               "start_rotation": [0.0, 0.0, 0.0, 1.0], "goals": [{"position": [2.0, 0.0, 1.0]}]}  # fmt: skip
    with gzip.open(split / "content" / "room.json.gz", "wt") as f:
        json.dump({"episodes": [episode]}, f)
    spec = EnvConfig(backend="habitat", id="PointNav", kwargs={"episodes": str(split / "train.json.gz"), "scenes_dir": str(scene.parent), "resolution": [8, 8]})
    env = PointNavEnv(PointNavSettings.from_spec(spec), sim_module=standin)
    obs, _ = env.reset(seed=0)
    assert env.sim.scene == str(scene)
    np.testing.assert_allclose(obs["pointgoal"], [1.0, 0.0], atol=1e-6)


def test_settings_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="unknown habitat setting.*scene_dataset\\b"):
        PointNavSettings.from_spec(EnvConfig(backend="habitat", id="PointNav", kwargs={"scene": "a.glb", "scene_dataset": "x"}))
    with pytest.raises(ValueError, match="either `scene`"):
        PointNavSettings.from_spec(EnvConfig(backend="habitat", id="PointNav", kwargs={}))


def test_without_habitat_sim_the_error_names_the_fix() -> None:
    assert "habitat_sim" not in sys.modules
    with pytest.raises(ImportError, match="habitat-sim is not installed; build the image with `hpcrl build-image`"):
        make_env(EnvConfig(backend="habitat", id="PointNav", kwargs={"scene": "a.glb"}))
    assert MISSING.startswith("habitat-sim is not installed")


def test_bundled_config_uses_the_adapter_with_valid_settings() -> None:
    exp = load_experiment(ROOT / "configs" / "habitat_ppo.yaml")
    assert exp.env.backend == "habitat" and exp.algo == "ppo"
    settings = PointNavSettings.from_spec(exp.env)
    assert settings.episodes and settings.sensors == ["depth"]


def test_ppo_trains_and_evaluation_reports_success_and_spl(scene: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through make_vec_env and evaluation, with the stand-in installed as `habitat_sim` for this
    test only: the episode metrics of finished episodes reach eval's results."""
    monkeypatch.setitem(sys.modules, "habitat_sim", standin)
    monkeypatch.setitem(sys.modules, "habitat_sim.utils", standin.utils)
    monkeypatch.setitem(sys.modules, "habitat_sim.utils.common", standin.utils.common)
    exp = load_experiment(
        ROOT / "configs" / "habitat_ppo.yaml",
        [f"env.kwargs={json.dumps({'scene': str(scene), 'resolution': [36, 36], 'max_episode_steps': 20})}", "env.num_envs=2",
         "env.vectorization=sync", "train.total_steps=64", "train.num_steps=16", "train.device=cpu", f"output={tmp_path}"],
    )  # fmt: skip
    (run,) = expand(exp)[:1]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as `hpcrl train` does with train.torch_threads; 2 threads on 2 busy cores crawl
    envs = make_vec_env(exp.env)
    agent = PPO(exp.train, envs, torch.device("cpu"), 0)
    while not agent.finished:
        agent.train_iteration()
    envs.close()
    assert agent.global_step == 64
    results = play(agent.policy, run, episodes=3, deterministic=False, device=torch.device("cpu"))
    torch.set_num_threads(threads)
    assert len(results) == 3
    for _ret, length, metrics in results:
        assert set(metrics) == {"success", "spl", "distance_to_goal"} and 1 <= length <= 20
