"""Habitat PointNav as a gymnasium env, written against habitat-sim's Python API.

The task is habitat-lab's PointNav (Anderson et al. 2018; Savva et al. 2019) rebuilt on
habitat-sim alone, because habitat-lab pins numpy 1.26 and the old `gym`:
- agent: a cylinder 1.5 m tall, radius 0.1 m, with depth and/or RGB cameras at 1.25 m (90 deg);
- actions, Discrete(4): STOP, MOVE_FORWARD 0.25 m, TURN_LEFT 10 deg, TURN_RIGHT 10 deg;
- observations, a Dict: `depth` (1, H, W) float32 in [0, 1] (metres / max_depth), `rgb`
  (3, H, W) uint8, and `pointgoal` (2,) float32, the distance and angle to the goal in the
  agent's frame (habitat-lab's PointGoalWithGPSCompass; habitat-sim has no goal sensor, so it is
  computed here from the agent's state);
- reward: decrease in geodesic distance to the goal, -0.01 per step, +2.5 on success;
- end: STOP (a success within `success_distance` geodesic metres) or `max_episode_steps`
  (a truncation); `info["episode_metrics"]` then holds success, SPL (success x shortest path /
  max(shortest, path taken)) and distance_to_goal, which evaluation writes to eval.csv;
- episodes: from a PointNav v1 dataset (`episodes: .../train.json.gz`; per-scene files under
  `content/` as in the Gibson and MP3D releases, scene ids resolved against `scenes_dir`), or
  sampled on the navmesh of `scene` (start and goal on one island, geodesic distance within
  [min_geodesic, max_geodesic]); each env switches scene every `scene_repeat_steps` steps;
- navmesh: the scene's own `.navmesh`, recomputed for the agent's height and radius if absent.

habitat-sim has no Linux wheel (see the notes): it is installed with conda inside the Singularity
image, and importing it anywhere else fails with a message naming that fix.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import gymnasium as gym
import numpy as np

from hpcrl.config.experiment import EnvConfig
from hpcrl.config.schema import build, public_fields, setting

MISSING = "habitat-sim is not installed; build the image with `hpcrl build-image`"
ACTIONS = ("stop", "move_forward", "turn_left", "turn_right")
SCENE_PREFIX = "data/scene_datasets/"
"""Dataset scene ids start with this (habitat-lab's convention); `scenes_dir` replaces it."""


def import_habitat_sim() -> Any:
    try:
        import habitat_sim
        import habitat_sim.utils.common  # noqa: F401  (the quaternion helpers used below)
    except ImportError as exc:
        raise ImportError(f"{MISSING} (import failed: {exc})") from exc
    return habitat_sim


MAX_SIDE = 4096
"""The largest sensor side in pixels: a frame of a larger one would not fit a rollout of any size."""


@dataclass
class PointNavSettings:
    """The `env.kwargs` of a habitat env, each with its rules (hpcrl.config.schema, as the config's own sections);
    unknown keys are an error (a typo would change the task)."""

    scene: Optional[str] = None
    episodes: Optional[str] = None
    scenes_dir: str = "data/scene_datasets"
    scene_dataset_config: Optional[str] = None
    sensors: list[Literal["depth", "rgb"]] = setting(factory=lambda: ["depth"], min_items=1)
    resolution: list[int] = setting(factory=lambda: [256, 256], min_items=2, max_items=2, ge=1, le=MAX_SIDE)
    """[height, width] in pixels."""
    max_depth: float = setting(10.0, gt=0)
    sensor_height: float = setting(1.25, ge=0)
    agent_height: float = setting(1.5, gt=0)
    agent_radius: float = setting(0.1, gt=0)
    forward_step: float = setting(0.25, gt=0)
    turn_angle: float = setting(10.0, gt=0)
    success_distance: float = setting(0.2, gt=0)
    success_reward: float = 2.5
    slack_reward: float = -0.01
    max_episode_steps: int = setting(500, ge=1)
    min_geodesic: float = setting(1.0, ge=0)
    max_geodesic: float = setting(30.0, gt=0)
    scene_repeat_steps: int = setting(10_000, ge=1)
    gpu_device_id: int = setting(0, ge=0)

    def check(self) -> list[tuple[str, str]]:
        if bool(self.scene) == bool(self.episodes):
            return [("scene", "give either `scene` (episodes sampled on its navmesh) or `episodes` (a PointNav dataset)")]
        if self.min_geodesic > self.max_geodesic:
            return [("min_geodesic", f"{self.min_geodesic:g} is above max_geodesic {self.max_geodesic:g}")]
        return []

    @classmethod
    def from_spec(cls, spec: EnvConfig) -> PointNavSettings:
        """The settings of `spec`, or ValueError naming its id or the first key the simulator could not take.
        Checked where they are read (and by `hpcrl sweep`, which needs no habitat-sim for it): a string, a negative
        step or a NaN reached the simulator, or its arithmetic, inside a job after its queue wait."""
        if spec.id != "PointNav":
            raise ValueError(f"env.id: the habitat backend runs PointNav, got {spec.id!r}")
        names = sorted(public_fields(cls))
        unknown = sorted(set(spec.kwargs) - set(names))
        if unknown:
            raise ValueError(f"env.kwargs: unknown habitat setting(s) {', '.join(unknown)} (known: {', '.join(names)})")
        settings = build(cls, dict(spec.kwargs), "env.kwargs")
        if spec.max_episode_steps:
            settings.max_episode_steps = spec.max_episode_steps
        return settings


@dataclass
class Episode:
    scene: str
    start: np.ndarray
    rotation: np.ndarray
    """Quaternion coefficients [x, y, z, w], habitat's order."""
    goal: np.ndarray


def rotate_by_inverse(coeffs: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v expressed in the frame of a body with rotation `coeffs` ([x, y, z, w], unit): q^-1 v q."""
    u, w = -np.asarray(coeffs[:3], dtype=np.float64), float(coeffs[3])
    t = 2.0 * np.cross(u, v)
    return v + w * t + np.cross(u, t)


def pointgoal(position: np.ndarray, rotation: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """(distance, angle) to the goal in the agent's frame, as habitat-lab's PointGoalWithGPSCompass:
    the agent looks along -z; a positive angle is to its left."""
    local = rotate_by_inverse(rotation, np.asarray(goal, np.float64) - np.asarray(position, np.float64))
    forward, right = -local[2], local[0]
    return np.array([math.hypot(forward, right), -math.atan2(right, forward)], dtype=np.float32)


def read_dataset(path: str) -> dict[str, list[dict[str, Any]] | Path]:
    """Scene id -> its episodes, or -> the per-scene file holding them (read when first needed)."""
    with gzip.open(path, "rt") as f:
        episodes = json.load(f)["episodes"]
    by_scene: dict[str, list[dict[str, Any]] | Path] = {}
    for ep in episodes:
        by_scene.setdefault(ep["scene_id"], []).append(ep)
    content = Path(path).parent / "content"
    if not by_scene and content.is_dir():
        # v1 train splits: the top file is an index, each scene's episodes live in content/<scene>.json.gz.
        by_scene = {p.name[: -len(".json.gz")]: p for p in sorted(content.glob("*.json.gz"))}
    if not by_scene:
        raise ValueError(f"env.kwargs.episodes: {path} holds no episodes (and no content/ directory beside it)")
    return by_scene


class PointNavEnv(gym.Env):
    """One habitat-sim simulator running PointNav episodes. `sim_module` is habitat_sim itself, or a
    stand-in with the same API for tests on machines without it."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, settings: PointNavSettings, render_mode: str | None = None, sim_module: Any = None) -> None:
        self.settings = settings
        self.hs = sim_module if sim_module is not None else import_habitat_sim()
        self.render_mode = render_mode
        h, w = settings.resolution
        spaces: dict[str, gym.Space] = {}
        if "depth" in settings.sensors:
            spaces["depth"] = gym.spaces.Box(0.0, 1.0, (1, h, w), dtype=np.float32)
        if "rgb" in settings.sensors or render_mode == "rgb_array":
            spaces["rgb"] = gym.spaces.Box(0, 255, (3, h, w), dtype=np.uint8)
        spaces["pointgoal"] = gym.spaces.Box(-np.inf, np.inf, (2,), dtype=np.float32)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Discrete(len(ACTIONS))
        self.dataset = read_dataset(settings.episodes) if settings.episodes else None
        self.sim: Any = None
        self.scene: str | None = None
        self.scene_episodes: list[dict[str, Any]] = []
        self.scene_steps = 0
        self.episode: Episode | None = None
        self._sensor_obs: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------ simulator set-up
    def _configuration(self, scene: str) -> Any:
        hs, s = self.hs, self.settings
        sim_cfg = hs.SimulatorConfiguration()
        sim_cfg.scene_id = scene
        if s.scene_dataset_config:
            sim_cfg.scene_dataset_config_file = s.scene_dataset_config
        sim_cfg.gpu_device_id = s.gpu_device_id
        sim_cfg.allow_sliding = True  # habitat-lab's default: a collision slides along the wall
        sim_cfg.enable_physics = False
        sensors = []
        for uuid, sensor_type in (("depth", hs.SensorType.DEPTH), ("rgb", hs.SensorType.COLOR)):
            if uuid in self.observation_space.spaces:
                spec = hs.CameraSensorSpec()
                spec.uuid = uuid
                spec.sensor_type = sensor_type
                spec.resolution = list(s.resolution)
                spec.position = [0.0, s.sensor_height, 0.0]
                sensors.append(spec)
        agent_cfg = hs.agent.AgentConfiguration()
        agent_cfg.height = s.agent_height
        agent_cfg.radius = s.agent_radius
        agent_cfg.sensor_specifications = sensors
        agent_cfg.action_space = {
            "move_forward": hs.agent.ActionSpec("move_forward", hs.agent.ActuationSpec(amount=s.forward_step)),
            "turn_left": hs.agent.ActionSpec("turn_left", hs.agent.ActuationSpec(amount=s.turn_angle)),
            "turn_right": hs.agent.ActionSpec("turn_right", hs.agent.ActuationSpec(amount=s.turn_angle)),
        }
        return hs.Configuration(sim_cfg, [agent_cfg])

    def _load_scene(self, scene: str) -> None:
        config = self._configuration(scene)
        if self.sim is None:
            self.sim = self.hs.Simulator(config)
        else:
            self.sim.reconfigure(config)
        if not self.sim.pathfinder.is_loaded:
            settings = self.hs.NavMeshSettings()
            settings.set_defaults()
            settings.agent_height = self.settings.agent_height
            settings.agent_radius = self.settings.agent_radius
            if not self.sim.recompute_navmesh(self.sim.pathfinder, settings):
                raise RuntimeError(f"habitat-sim could not build a navmesh for {scene}")
        seed = int(self.np_random.integers(2**31))
        self.sim.seed(seed)
        self.sim.pathfinder.seed(seed)
        self.sim.initialize_agent(0)
        self.scene, self.scene_steps = scene, 0

    def _scene_path(self, scene_id: str) -> str:
        if scene_id.startswith(SCENE_PREFIX):
            scene_id = scene_id[len(SCENE_PREFIX) :]
        return scene_id if os.path.isabs(scene_id) else os.path.join(self.settings.scenes_dir, scene_id)

    # ------------------------------------------------------------ episodes
    def _next_episode(self) -> Episode:
        if self.dataset is None:
            if self.sim is None:
                self._load_scene(self.settings.scene)
            return self._sampled_episode()
        if self.sim is None or self.scene_steps >= self.settings.scene_repeat_steps or not self.scene_episodes:
            scenes = list(self.dataset)
            key = scenes[int(self.np_random.integers(len(scenes)))]
            entry = self.dataset[key]
            if isinstance(entry, Path):
                with gzip.open(entry, "rt") as f:
                    entry = json.load(f)["episodes"]
            self.scene_episodes = list(entry)
            self._load_scene(self._scene_path(self.scene_episodes[0]["scene_id"]))
        ep = self.scene_episodes[int(self.np_random.integers(len(self.scene_episodes)))]
        return Episode(self.scene, np.asarray(ep["start_position"], np.float32), np.asarray(ep["start_rotation"], np.float64), np.asarray(ep["goals"][0]["position"], np.float32))

    def _sampled_episode(self, tries: int = 100) -> Episode:
        s, pathfinder = self.settings, self.sim.pathfinder
        for _ in range(tries):
            start = np.asarray(pathfinder.get_random_navigable_point(), np.float32)
            goal = np.asarray(pathfinder.get_random_navigable_point(), np.float32)
            if pathfinder.island_radius(start) < 1.5:  # a table top or a closet: habitat-lab's limit
                continue
            if s.min_geodesic <= self._geodesic(start, goal) <= s.max_geodesic:
                yaw = float(self.np_random.uniform(0, 2 * np.pi))
                return Episode(self.scene, start, np.array([0.0, math.sin(yaw / 2), 0.0, math.cos(yaw / 2)]), goal)
        raise RuntimeError(f"no start/goal pair {s.min_geodesic}-{s.max_geodesic} m apart found on the navmesh of {self.scene} in {tries} tries")

    def _geodesic(self, a: np.ndarray, b: np.ndarray) -> float:
        path = self.hs.ShortestPath()
        path.requested_start = a
        path.requested_end = b
        found = self.sim.pathfinder.find_path(path)
        return float(path.geodesic_distance) if found else math.inf

    # ------------------------------------------------------------ gymnasium API
    def _agent_pose(self) -> tuple[np.ndarray, np.ndarray]:
        state = self.sim.get_agent(0).get_state()
        return np.asarray(state.position, np.float64), np.asarray(self.hs.utils.common.quat_to_coeffs(state.rotation), np.float64)

    def _observe(self, sensor_obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._sensor_obs = sensor_obs
        obs: dict[str, np.ndarray] = {}
        if "depth" in self.observation_space.spaces:
            depth = np.clip(np.asarray(sensor_obs["depth"], np.float32), 0.0, self.settings.max_depth) / self.settings.max_depth
            obs["depth"] = depth.reshape(1, *depth.shape[:2])
        if "rgb" in self.observation_space.spaces:
            obs["rgb"] = np.ascontiguousarray(np.asarray(sensor_obs["rgb"])[..., :3].transpose(2, 0, 1))  # RGBA -> CHW
        position, rotation = self._agent_pose()
        obs["pointgoal"] = pointgoal(position, rotation, self.episode.goal)
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self.episode = self._next_episode()
        state = self.hs.AgentState()
        state.position = self.episode.start
        state.rotation = self.hs.utils.common.quat_from_coeffs(self.episode.rotation)
        self.sim.get_agent(0).set_state(state)
        self.steps, self.path_length = 0, 0.0
        self.shortest = self._geodesic(self.episode.start, self.episode.goal)
        self.distance = self.shortest
        return self._observe(self.sim.get_sensor_observations()), {}

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        s = self.settings
        before, _ = self._agent_pose()
        stop = ACTIONS[int(action)] == "stop"
        sensor_obs = self.sim.get_sensor_observations() if stop else self.sim.step(ACTIONS[int(action)])
        self.steps += 1
        self.scene_steps += 1
        position, _ = self._agent_pose()
        self.path_length += float(np.linalg.norm(position - before))
        distance = self._geodesic(position, self.episode.goal)
        if not math.isfinite(distance):  # off the navmesh (rare): fall back to the straight line
            distance = float(np.linalg.norm(position - self.episode.goal))
        success = stop and distance <= s.success_distance
        reward = (self.distance - distance) + s.slack_reward + (s.success_reward if success else 0.0)
        self.distance = distance
        terminated = stop
        truncated = not terminated and self.steps >= s.max_episode_steps
        info: dict[str, Any] = {}
        if terminated or truncated:
            spl = float(success) * self.shortest / max(self.shortest, self.path_length, 1e-9)
            info["episode_metrics"] = {"success": float(success), "spl": spl, "distance_to_goal": distance}
        return self._observe(sensor_obs), float(reward), terminated, truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode == "rgb_array":
            return np.asarray(self._sensor_obs["rgb"])[..., :3]
        return None

    def close(self) -> None:
        if self.sim is not None:
            self.sim.close()
            self.sim = None


def make_habitat_env(spec: EnvConfig, render_mode: str | None) -> gym.Env:
    """One PointNav env from an `env:` section; fails at once, naming the fix, without habitat-sim."""
    settings = PointNavSettings.from_spec(spec)
    return PointNavEnv(settings, render_mode, import_habitat_sim())
