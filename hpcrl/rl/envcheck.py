"""Checks of a config's environments that can run on a login node, at sweep time.

An unknown `env.id`, or DQN on an env with continuous actions, would otherwise fail inside every
job after its queue wait. What is checked costs milliseconds: gymnasium's registry (no env is
built, except the few pure-Python ones below, whose action space cannot be known otherwise) and
ViZDoom's registered scenarios (read from its registry; no game is started) and settings, and
Habitat's settings (its simulator, and the scenes it loads, live only in the image).

Imports gymnasium, never torch: `hpcrl sweep` on a login node must not pay for torch.
"""

from __future__ import annotations

import difflib
import importlib
import random
import sys
from pathlib import Path

import gymnasium as gym

from hpcrl import games
from hpcrl.config.experiment import EnvConfig, Experiment
from hpcrl.config.load import apply_settings
from hpcrl.config.schema import ConfigError
from hpcrl.games.minimax import PerfectPlayer
from hpcrl.games.openspiel_params import GameParameterError
from hpcrl.submit.jobplan import executable

_CHEAP = ("gymnasium.envs.classic_control", "gymnasium.envs.toy_text")
"""Entry points whose envs are built in microseconds without any simulator: made to read their
action space (and to try `env.kwargs` on them)."""


def check_environment(exp: Experiment) -> None:
    """Raise ConfigError (naming the key path) for an env the runs of `exp` could not use.

    Checks the config's own env and, for each grid key under `env`, each of its values; for a
    user's program, that its command exists.
    """
    if exp.program is not None:
        check_program(exp)
        return
    algos = exp.sweep.grid.get("algo", [exp.algo])
    envs: list[tuple[str, EnvConfig]] = [("", exp.env)]
    for key, values in exp.sweep.grid.items():
        if key == "env" or key.startswith("env."):
            for value in values:
                point = apply_settings(exp, {key: value}, exp.sweep.seeds[0])
                envs.append((f"sweep.grid.{key}={value!r}: ", point.env))
    for algo in algos:  # DQN needs discrete actions: each algorithm of the grid with each env
        for where, spec in envs:
            try:
                _check_one(spec, algo)
            except ConfigError as exc:
                raise ConfigError(f"{where}{'algo=' + repr(algo) + ': ' if len(algos) > 1 else ''}{exc}") from None
    if exp.algo == "alphazero":
        _check_alphazero(exp)


def check_program(exp: Experiment) -> None:
    """The program's command must exist where it will run. Without a container that is this
    machine (a cluster's login and compute nodes share their software), and the job script shows
    it by its absolute path (hpcrl.submit.jobplan.located); inside an image it cannot be checked here.
    `python script.py` also checks the script, the most common typo. A working directory with
    placeholders exists only once its run does: what is relative to it is not checked."""
    program = exp.program
    if program is None or exp.container.image:
        return
    fixed = "{" not in (program.workdir or "")
    cwd = Path(program.workdir or ".")
    if fixed and not cwd.is_dir():
        raise ConfigError(f"program.workdir: {cwd} is not a directory")
    first = program.command[0]
    if "{" in first or ("/" in first and not fixed and not Path(first).is_absolute()):
        return  # a placeholder (a path inside the run directory) exists only once the run does
    if executable(first, cwd) is None:
        raise ConfigError(f"program.command[0]: {first!r} is not found" + (f" in {cwd}" if "/" in first else " on the PATH") + " (no container is set, so the jobs run it on this machine)")
    if fixed and Path(first).name.startswith("python") and len(program.command) > 1:
        script = program.command[1]
        if script.endswith(".py") and "{" not in script and not (cwd / script).is_file():
            raise ConfigError(f"program.command[1]: {script!r} is not found in {cwd} (program.workdir: where the program runs)")


def _check_one(spec: EnvConfig, algo: str) -> None:
    if spec.backend == "gymnasium":
        _check_gymnasium(spec, algo)
    elif spec.backend == "vizdoom":
        _check_vizdoom(spec)
    elif spec.backend == "habitat":
        _check_habitat(spec)
    elif spec.backend in games.GAME_BACKENDS:
        _check_game_class(spec)


def _check_gymnasium(spec: EnvConfig, algo: str) -> None:
    module, _, name = spec.id.rpartition(":")
    if module:  # gymnasium's `module:EnvId` form imports the module that registers the id
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"env.id: cannot import {module!r}, which should register {name!r}: {exc}{games.own_module_hint(module, exc)}") from None
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"env.id: {name!r} is not a registered gymnasium environment{hint}")
    entry = gym.registry[name].entry_point
    if isinstance(entry, str) and entry.startswith(_CHEAP):
        try:
            env = gym.make(name, **spec.kwargs)
        except Exception as exc:  # whatever the env's constructor says about the config's kwargs
            raise ConfigError(f"env.kwargs: {name} refuses them: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        try:
            _check_spaces(env, name, algo)
        finally:
            env.close()


def _check_habitat(spec: EnvConfig) -> None:
    """PointNav's id and settings, as each env checks them (no simulator is built: its scenes are in the image)."""
    from hpcrl.rl.habitat_env import PointNavSettings

    try:
        PointNavSettings.from_spec(spec)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_game_class(spec: EnvConfig) -> None:
    """A two-player game: it loads, and a few random games keep to the protocol (hpcrl.games)."""
    try:
        game = games.load(spec)
        warnings = games.check_game(game)
    except games.GameError as exc:
        raise ConfigError(f"env.id: {exc}") from None
    except GameParameterError as exc:  # its line starts with the key path
        raise ConfigError(str(exc)) from None
    for warning in warnings:
        print(f"hpcrl: warning: env.id: {warning}", file=sys.stderr)


def _check_alphazero(exp: Experiment) -> None:
    """What joins the game and train.*: board planes for a resnet, a move limit that OpenSpiel's own
    longest game fits in, a game small enough for `perfect`."""
    cfg = exp.train
    game = games.load(exp.env)
    if getattr(cfg, "network", "mlp") == "resnet" and len(game.observation_shape) != 3:
        raise ConfigError(f"train.network: resnet needs board planes (channels, height, width); {game.name}'s observation has shape {game.observation_shape}")
    longest = game.openspiel_game.max_game_length() if game.openspiel_game is not None else 0
    if longest > cfg.max_moves:  # type: ignore[attr-defined]  # the experiment's AlphaZeroConfig
        raise ConfigError(f"train.max_moves: {game.name}'s games last up to {longest:,} moves (OpenSpiel's max_game_length), more than {cfg.max_moves:,}: raise it")  # type: ignore[attr-defined]
    if "perfect" in getattr(cfg, "opponents", ()):
        try:
            PerfectPlayer(game, random.Random(0)).value(game.new_initial_state())
        except games.GameError as exc:
            raise ConfigError(f"train.opponents: {exc}") from None
        except RecursionError:
            raise ConfigError(f"train.opponents: {game.name}'s games are too long for the 'perfect' opponent (minimax recursion)") from None


def _check_vizdoom(spec: EnvConfig) -> None:
    """Scenario names and ids, from ViZDoom's own registrations, and `env.kwargs` as its game takes them (no
    engine started). Skipped when vizdoom is not installed where `hpcrl sweep` runs (it may be installed in the
    image only: each env then checks its settings as it is built)."""
    try:
        from hpcrl.rl.vizdoom_env import resolve_id

        env_id = resolve_id(spec.id)
    except ImportError:
        return
    except ValueError:
        ids = [i for i, spec_ in gym.registry.items() if i.startswith("Vizdoom") and spec_.kwargs.get("max_buttons_pressed") == 1]
        scenarios = [str(gym.registry[i].kwargs.get("scenario_config_file", "")).removesuffix(".cfg") for i in ids]
        close = difflib.get_close_matches(spec.id, ids + scenarios, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else f" (scenarios: {', '.join(sorted(set(scenarios)))})"
        raise ConfigError(f"env.id: {spec.id!r} is not a ViZDoom scenario or registered id{hint}") from None
    from hpcrl.rl.vizdoom_settings import settings_fault

    fault = settings_fault(spec.kwargs)
    if fault is not None:
        raise ConfigError(fault)
    if spec.kwargs.get("max_buttons_pressed", gym.registry[env_id].kwargs.get("max_buttons_pressed")) == 0:
        raise ConfigError(f"env.id: {env_id} with max_buttons_pressed 0 has MultiBinary actions; hpcrl's policies take Discrete or Box")


def _check_spaces(env: gym.Env, env_id: str, algo: str) -> None:
    """What hpcrl's networks take (hpcrl/rl/networks.py): Box or Dict-of-Box observations, Discrete
    or Box actions, and Discrete actions for DQN's Q-values."""
    obs = env.observation_space
    parts = obs.spaces.values() if isinstance(obs, gym.spaces.Dict) else [obs]
    if not all(isinstance(part, gym.spaces.Box) for part in parts):
        raise ConfigError(f"env.id: {env_id} has {type(obs).__name__} observations; hpcrl's networks take Box or a Dict of Box")
    space = env.action_space
    if algo == "dqn" and not isinstance(space, gym.spaces.Discrete):
        raise ConfigError(f"env.id: algo dqn needs Discrete actions, {env_id} has {space}")
    if not isinstance(space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise ConfigError(f"env.id: {env_id} has {type(space).__name__} actions; hpcrl's policies take Discrete or Box")
