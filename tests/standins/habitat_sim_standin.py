"""A STAND-IN for habitat-sim, for tests only: NOT the simulator, and no physics or rendering.

habitat-sim has no Linux wheel (it installs with conda inside the image), so hpcrl's Habitat
adapter is tested here against this module, which implements the part of habitat-sim's Python API
the adapter calls, with the same names and call shapes (SimulatorConfiguration, CameraSensorSpec,
agent.AgentConfiguration / ActionSpec / ActuationSpec, Configuration, Simulator with its
pathfinder, ShortestPath, NavMeshSettings, AgentState, utils.common.quat_from_coeffs /
quat_to_coeffs), over a toy world:

- the floor is a 10 m x 10 m square at y = 0 (x and z in [0, 10]), agents keep their radius
  from its edges and slide along them;
- geodesic distances are city-block (|dx| + |dz|), so tests can tell a pathfinder answer from a
  straight line;
- the depth camera sees the distance to the edge straight ahead in every pixel, the colour camera
  an RGBA image whose red channel encodes x;
- a scene file must exist; one whose name ends in `-nonavmesh.glb` has no navmesh until
  `recompute_navmesh` builds it.
"""

from __future__ import annotations

import math
import os
from enum import Enum
from types import SimpleNamespace
from typing import Any

import numpy as np

SIZE = 10.0
IS_STANDIN = True


class SensorType(Enum):
    COLOR = 1
    DEPTH = 2


class SimulatorConfiguration:
    def __init__(self) -> None:
        self.scene_id = ""
        self.scene_dataset_config_file = "default"
        self.gpu_device_id = 0
        self.random_seed = 0
        self.allow_sliding = True
        self.enable_physics = False


class CameraSensorSpec:
    def __init__(self) -> None:
        self.uuid = ""
        self.sensor_type = SensorType.COLOR
        self.resolution = [128, 128]
        self.position = [0.0, 1.5, 0.0]


class _ActuationSpec:
    def __init__(self, amount: float) -> None:
        self.amount = amount


class _ActionSpec:
    def __init__(self, name: str, actuation: _ActuationSpec) -> None:
        self.name = name
        self.actuation = actuation


class _AgentConfiguration:
    def __init__(self) -> None:
        self.height = 1.5
        self.radius = 0.1
        self.sensor_specifications: list[CameraSensorSpec] = []
        self.action_space: dict[str, _ActionSpec] = {}


class AgentState:
    def __init__(self) -> None:
        self.position = np.zeros(3, dtype=np.float32)
        self.rotation = np.array([0.0, 0.0, 0.0, 1.0])


def quat_from_coeffs(coeffs: Any) -> np.ndarray:
    return np.asarray(coeffs, dtype=np.float64).copy()


def quat_to_coeffs(quat: np.ndarray) -> np.ndarray:
    return np.asarray(quat, dtype=np.float64).copy()


agent = SimpleNamespace(AgentConfiguration=_AgentConfiguration, ActionSpec=_ActionSpec, ActuationSpec=_ActuationSpec, AgentState=AgentState)
utils = SimpleNamespace(common=SimpleNamespace(quat_from_coeffs=quat_from_coeffs, quat_to_coeffs=quat_to_coeffs))


class Configuration:
    def __init__(self, sim_cfg: SimulatorConfiguration, agents: list[_AgentConfiguration]) -> None:
        self.sim_cfg = sim_cfg
        self.agents = agents


class ShortestPath:
    def __init__(self) -> None:
        self.requested_start = np.zeros(3)
        self.requested_end = np.zeros(3)
        self.geodesic_distance = math.inf
        self.points: list[np.ndarray] = []


class NavMeshSettings:
    def __init__(self) -> None:
        self.agent_height = 0.0
        self.agent_radius = 0.0

    def set_defaults(self) -> None:
        self.agent_height, self.agent_radius = 1.5, 0.1


def _on_floor(p: Any) -> bool:
    return 0.0 <= float(p[0]) <= SIZE and 0.0 <= float(p[2]) <= SIZE


class PathFinder:
    def __init__(self, loaded: bool) -> None:
        self.is_loaded = loaded
        self.rng = np.random.default_rng(0)
        self.agent_radius = 0.1

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def get_random_navigable_point(self) -> np.ndarray:
        r = self.agent_radius
        return np.array([self.rng.uniform(r, SIZE - r), 0.0, self.rng.uniform(r, SIZE - r)], dtype=np.float32)

    def island_radius(self, point: Any) -> float:
        return SIZE / 2

    def find_path(self, path: ShortestPath) -> bool:
        a, b = np.asarray(path.requested_start, np.float64), np.asarray(path.requested_end, np.float64)
        if not (self.is_loaded and _on_floor(a) and _on_floor(b)):
            path.geodesic_distance, path.points = math.inf, []
            return False
        path.geodesic_distance = abs(a[0] - b[0]) + abs(a[2] - b[2])
        path.points = [a, np.array([b[0], a[1], a[2]]), b]
        return True


class Agent:
    def __init__(self, config: _AgentConfiguration) -> None:
        self.config = config
        self.state = AgentState()
        self.state.position = np.array([SIZE / 2, 0.0, SIZE / 2], dtype=np.float32)

    def get_state(self) -> AgentState:
        state = AgentState()
        state.position, state.rotation = self.state.position.copy(), self.state.rotation.copy()
        return state

    def set_state(self, state: AgentState, reset_sensors: bool = True) -> None:
        rotation = np.asarray(state.rotation, np.float64)
        if abs(rotation[0]) > 1e-9 or abs(rotation[2]) > 1e-9:
            raise ValueError("the stand-in only supports rotations about the up (y) axis")
        self.state.position = np.asarray(state.position, np.float32).copy()
        self.state.rotation = rotation / np.linalg.norm(rotation)

    @property
    def yaw(self) -> float:
        return 2.0 * math.atan2(self.state.rotation[1], self.state.rotation[3])

    def forward(self) -> np.ndarray:
        """habitat agents look along -z; a positive yaw turns them left (towards -x)."""
        return np.array([-math.sin(self.yaw), 0.0, -math.cos(self.yaw)])


class Simulator:
    def __init__(self, config: Configuration) -> None:
        self.closed = False
        self.reconfigure(config)

    def reconfigure(self, config: Configuration) -> None:
        scene = config.sim_cfg.scene_id
        if not os.path.exists(scene):
            raise FileNotFoundError(f"stand-in habitat-sim: scene {scene} does not exist")
        self.config = config
        self.scene = scene
        self.pathfinder = PathFinder(loaded=not scene.endswith("-nonavmesh.glb"))
        self.agents = [Agent(a) for a in config.agents]
        self.previous_step_collided = False
        self.navmesh_settings: NavMeshSettings | None = None

    def seed(self, seed: int) -> None:
        self.seeded = seed

    def recompute_navmesh(self, pathfinder: PathFinder, settings: NavMeshSettings) -> bool:
        self.navmesh_settings = settings
        pathfinder.is_loaded = True
        pathfinder.agent_radius = settings.agent_radius
        return True

    def initialize_agent(self, agent_id: int) -> Agent:
        self.agents[agent_id] = Agent(self.config.agents[agent_id])
        return self.agents[agent_id]

    def get_agent(self, agent_id: int) -> Agent:
        return self.agents[agent_id]

    def step(self, action: str) -> dict[str, np.ndarray]:
        body = self.agents[0]
        amount = body.config.action_space[action].actuation.amount
        if action == "move_forward":
            r = body.config.radius
            target = body.state.position + amount * body.forward()
            clipped = np.clip(target, [r, 0.0, r], [SIZE - r, 0.0, SIZE - r])
            self.previous_step_collided = bool(np.any(np.abs(clipped - target) > 1e-9))
            body.state.position = clipped.astype(np.float32)
        elif action in ("turn_left", "turn_right"):
            yaw = body.yaw + math.radians(amount) * (1 if action == "turn_left" else -1)
            body.state.rotation = np.array([0.0, math.sin(yaw / 2), 0.0, math.cos(yaw / 2)])
            self.previous_step_collided = False
        else:
            raise KeyError(action)
        return self.get_sensor_observations()

    def get_sensor_observations(self) -> dict[str, np.ndarray]:
        body = self.agents[0]
        out = {}
        for spec in body.config.sensor_specifications:
            h, w = spec.resolution
            if spec.sensor_type == SensorType.DEPTH:
                out[spec.uuid] = np.full((h, w), self._distance_ahead(body), dtype=np.float32)
            else:
                rgba = np.zeros((h, w, 4), dtype=np.uint8)
                rgba[..., 0] = int(255 * body.state.position[0] / SIZE)
                rgba[..., 3] = 255
                out[spec.uuid] = rgba
        return out

    @staticmethod
    def _distance_ahead(body: Agent) -> float:
        p, d = body.state.position.astype(np.float64), body.forward()
        hits = [((SIZE if d[i] > 0 else 0.0) - p[i]) / d[i] for i in (0, 2) if abs(d[i]) > 1e-9]
        return float(min(hits))

    def close(self) -> None:
        self.closed = True
