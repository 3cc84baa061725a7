"""ViZDoom scenarios as pixel environments, built by ViZDoom's own gymnasium wrapper.

`env.id` is a registered id (`VizdoomBasic-v1`, `VizdoomDefendCenter-v1`, ...; ViZDoom 1.3 has
no `-v0`) or a scenario name (`basic`, `defend_the_center`, `health_gathering`). `env.kwargs`
go to the game (`frame_skip`, `screen_resolution`, `screen_format`, any DoomGame config key: checked
first, hpcrl.rl.vizdoom_settings) except `downsample`, an integer factor applied here by averaging pixel blocks (the smallest
resolution ViZDoom renders is 160x120; 80x60 learns as well at a quarter of the CNN's cost).

The adapter turns the wrapper's Dict observation into the screen alone, channel-first uint8
(C, H, W), which the Nature CNN and frame stacking take directly; game variables (ammo, health)
are dropped. The wrapper builds the game, its spaces and its buttons; a discrete action's step then
goes to the game itself (`ScreenObservation`): the same frames and rewards at less of a worker's
CPU. The adapter also fixes two things the learner needs at episode ends:
- ViZDoom reports a timeout as terminated *and* truncated; here it is truncation only, so the
  value of the cut-off state is bootstrapped as for any time limit;
- the final observation of an episode is all zeros (the game has no state after it ends); here
  it is the last real frame, so that bootstrap reads a real image.

Runs headless: the wrapper never opens a window unless asked, and needs no display or Xvfb.

Each game keeps its files in a private temporary directory (`OwnDirectory`): ViZDoom's engine
creates `./_vizdoom/` in its working directory (checking, then creating it) and reads and rewrites
`./_vizdoom.ini` there; games started at the same instant in one directory (a vector env's workers on
a many-core node, the runs of a local sweep) race on both, and a loser's engine dies with
`Failed to create ./_vizdoom/ directory: File exists`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import numpy as np

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.vizdoom_settings import settings_fault

DEFAULTS = {"frame_skip": 4, "screen_resolution": "RES_160X120", "screen_format": "GRAY8"}
"""The game settings most ViZDoom RL work uses, unless the config says otherwise."""


def _import_wrapper() -> None:
    """Registers the Vizdoom*-v1 ids. Each AsyncVectorEnv worker is a fresh process whose gymnasium
    registry lacks them, so this runs inside every env factory call, not once in the parent."""
    try:
        import vizdoom.gymnasium_wrapper  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"env.backend vizdoom needs the vizdoom package: pip install 'hpcrl[vizdoom]' ({exc})") from exc


def resolve_id(name: str) -> str:
    """A registered gymnasium id for `name` (an id, or a scenario file name without `.cfg`)."""
    _import_wrapper()
    if name in gym.registry:
        return name
    for env_id, spec in gym.registry.items():
        if spec.kwargs.get("scenario_config_file") == f"{name}.cfg" and spec.kwargs.get("max_buttons_pressed") == 1:
            return env_id
    known = sorted(i for i in gym.registry if i.startswith("Vizdoom") and "MultiBinary" not in i)
    hint = " (ViZDoom 1.3 ids end in -v1)" if name.endswith("-v0") else ""
    raise ValueError(f"unknown ViZDoom scenario {name!r}{hint}; known: {', '.join(known)}")


def block_mean(screen: np.ndarray, factor: int) -> np.ndarray:
    """The mean of each `factor` x `factor` block of a (C, H, W) uint8 screen, rounded down: the
    screen downsampled by `factor` (H and W divisible by it).

    Summed in integers, first the `factor` rows of each block, then the columns: numpy's
    `reshape(...).mean(axis=(2, 4))` gives the same bytes (an integer sum of at most 255 * factor**2,
    divided exactly and floored) but reduces over strided axes, and took 120 us of a 160x120 grey
    frame at factor 2 against 11 us here: 40% of a ViZDoom worker's own CPU per step."""
    c, h, w = screen.shape
    dtype = np.uint16 if 255 * factor * factor < 2**16 else np.uint32
    rows = np.zeros((c, h // factor, w), dtype=dtype)
    for i in range(factor):
        rows += screen[:, i::factor]
    total = rows[:, :, 0::factor].copy()
    for j in range(1, factor):
        total += rows[:, :, j::factor]
    total //= factor * factor
    return total.astype(np.uint8)


def _wrappers(env: gym.Env) -> Iterator[gym.Wrapper]:
    """`env` and every wrapper under it, outermost first, down to the game's env."""
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


class ScreenObservation(gym.Wrapper):
    """Dict observation -> channel-first screen; timeouts as truncation; a real last frame.

    With a discrete action space and no render mode (every training and evaluation env but a
    video's) a step goes to the game directly: the action's buttons (the wrapper's own
    `button_map`), `make_action` with the frame skip, the episode's end, and the screen of the new
    state. That is what the wrapper's step does, without its per-step action-space check, its
    action array built anew, its Dict of every buffer and the two wrappers gymnasium.make adds:
    101-103 against 125-129 us of CPU a step here, of which 75 are ViZDoom's own `make_action` and
    `get_state` (basic, 80x60 grey, random actions; an env worker's CPU per env step fell from 0.23
    to 0.21 ms in PPO, 0.19 to 0.16 with random actions: benchmarks/vizdoom_speed.py).
    The wrapper's `state` attribute is then not kept; nothing here reads it.

    That direct step passes by every wrapper between this one and the game, so it is taken only where
    each of them is one whose step adds nothing after the first (`STEP_BLIND_WRAPPERS`); under any
    other (gymnasium's TimeLimit, which `env.max_episode_steps` added there until 2026-12-06 and the
    direct step silently ignored) steps go through the wrappers."""

    def __init__(self, env: gym.Env, downsample: int = 1) -> None:
        super().__init__(env)
        height, width, channels = env.observation_space["screen"].shape
        if height % downsample or width % downsample:
            raise ValueError(f"env.kwargs.downsample: {downsample} does not divide the screen {width}x{height}")
        self.factor = downsample
        shape = (channels, height // downsample, width // downsample)
        self.observation_space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)
        self._last: np.ndarray | None = None
        base = env.unwrapped
        self._game = base.game
        self._buttons: list[list[float]] | None = None
        """Each discrete action's buttons, as make_action takes them; None: steps go through the wrapper."""
        button_map = getattr(base, "button_map", None)  # ViZDoom 1.3's; another version without it steps through the wrapper
        direct = isinstance(env.action_space, gym.spaces.Discrete) and base.render_mode is None and button_map is not None and len(button_map) == env.action_space.n
        if direct and all(isinstance(w, STEP_BLIND_WRAPPERS) for w in _wrappers(env)):
            self._buttons = [[float(b) for b in buttons] for buttons in button_map]
            self._skip = int(base.frame_skip)
            self._timeouts_truncate = bool(base.treat_episode_timeout_as_truncation)

    def _screen(self, screen: np.ndarray) -> np.ndarray:
        """ViZDoom's (H, W) grey or (H, W, C) screen -> (C, H', W'), downsampled."""
        screen = screen[None] if screen.ndim == 2 else screen.transpose(2, 0, 1)
        return block_mean(screen, self.factor) if self.factor > 1 else np.ascontiguousarray(screen)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._last = self._screen(obs["screen"])
        return self._last, info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._buttons is None:
            obs, reward, terminated, truncated, info = self.env.step(action)
            finished = self._game.is_episode_finished()
            screen = obs["screen"]
        else:
            if self._last is None:
                raise gym.error.ResetNeeded("Cannot call env.step() before calling env.reset()")
            if isinstance(action, np.ndarray) and action.shape == () and action.dtype.kind in "iu":
                action = int(action)  # a 0-d array, as the wrapper's Discrete space takes it
            if not (isinstance(action, (int, np.integer)) and 0 <= action < len(self._buttons)):
                raise ValueError(f"{action!r} ({type(action)}) invalid: expected an integer action in 0..{len(self._buttons) - 1}")
            reward = self._game.make_action(self._buttons[action], self._skip)
            finished = terminated = self._game.is_episode_finished()
            truncated = self._timeouts_truncate and self._game.is_episode_timeout_reached()
            info = {}
            screen = None if finished else self._game.get_state().screen_buffer
        if truncated:
            terminated = False
        if not finished:  # else the game has no frame: keep the last
            self._last = self._screen(screen)
        return self._last, reward, terminated, truncated, info


class OwnDirectory(gym.Wrapper):
    """A game whose engine runs in a directory of its own, removed when the env closes.

    The engine's config file is set there; its `./_vizdoom/` is relative to the working directory
    the engine process inherits, which no DoomGame setting moves, so the game is started (its first
    reset) from inside the directory. In a vector-env worker, a process of its own, that changes
    nothing else; in a process with other threads their relative paths would see the directory for
    that moment (hpcrl's training process has none)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.directory = tempfile.mkdtemp(prefix="hpcrl-vizdoom-")
        game = env.unwrapped.game
        self._remove = weakref.finalize(self, _close_and_remove, game, self.directory)  # also at exit, for an env never closed
        if not game.get_doom_config_path():  # a path the config gave stays as given
            game.set_doom_config_path(os.path.join(self.directory, "_vizdoom.ini"))

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.unwrapped.game.is_running():
            return self.env.reset(**kwargs)
        with _working_directory(self.directory):  # the engine starts here, and keeps this directory
            return self.env.reset(**kwargs)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._remove()


STEP_BLIND_WRAPPERS = (OwnDirectory, gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)
"""The wrappers ScreenObservation's direct step may pass by: the game's directory, and the two gymnasium.make adds
(a reset before the first step, which ScreenObservation enforces itself, and a check of the first step's output,
which CheckedOutput makes at every step)."""


def _close_and_remove(game: Any, directory: str) -> None:
    game.close()  # first: the engine rewrites its config file as it quits
    shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def _working_directory(path: str) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def make_vizdoom_env(spec: EnvConfig, render_mode: str | None) -> gym.Env:
    """One headless ViZDoom env from an `env:` section (called inside each vector-env worker); ValueError, naming the
    key, for `env.kwargs` the game cannot take (`settings_fault`)."""
    fault = settings_fault(spec.kwargs)
    if fault is not None:
        raise ValueError(fault)
    env_id = resolve_id(spec.id)
    kwargs = {**DEFAULTS, **spec.kwargs}
    downsample = kwargs.pop("downsample", 1)
    # Game settings naming files (`doom_scenario_path`, ...) mean the directory the run started in,
    # not the game's own (OwnDirectory).
    kwargs = {k: os.path.abspath(v) if k.endswith("_path") and isinstance(v, str) else v for k, v in kwargs.items()}
    env: gym.Env = ScreenObservation(OwnDirectory(gym.make(env_id, render_mode=render_mode, **kwargs)), downsample)
    if spec.max_episode_steps:  # outside the adapter, whose direct step would pass it by
        env = gym.wrappers.TimeLimit(env, spec.max_episode_steps)
    return env
