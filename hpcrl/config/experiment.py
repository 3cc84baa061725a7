"""YAML -> a typed, validated `Experiment`.

Every error is raised before anything is written or submitted, as one line naming the file and the
key path (`cartpole.yaml: train.lr: expected a number, got 'fast'`), because a typo discovered
after 500 jobs have queued costs a day. Each field declares its own rules (`hpcrl.config.schema.setting`);
the `check()` methods hold only rules that join several fields; the sweep's rules (what may be
swept, how many runs, duplicate points) are at the end of this file.

The sections a config shares with other parts of hpcrl have modules of their own (`sweep_spec`,
`resources_spec`, `container_spec`, `distributed_spec`, `program_spec`, `hparams` for `train:`);
this one holds the `Experiment` that joins them, `env:`, `eval:`, `tracking:` and `results:`,
and what reads a file into it: dotted keys and overrides, and the rules that need the whole config.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import difflib
import errno
import itertools
import math
import os
import re
import stat
import tempfile
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from hpcrl.config import strict_yaml, tasks
from hpcrl.config.container_spec import ContainerConfig, CudaConfig, ImageConfig
from hpcrl.config.distributed_spec import DistributedConfig
from hpcrl.config.hparams import ALGORITHMS, NATURE_CNN, DQNConfig, OnPolicyConfig, PPOConfig, TrainConfig, minibatch_problem
from hpcrl.config.limits import MAX_ENVS, MAX_RUNS
from hpcrl.config.program_spec import ProgramConfig, anchored_workdir
from hpcrl.config.resources_spec import Resources, parse_mem_mb
from hpcrl.config.schema import (
    ConfigError,
    Problems,
    Verbatim,
    build,
    choice_problem,
    did_you_mean,
    field_rules,
    hints,
    key_path,
    no_spaces_problem,
    non_empty_problem,
    plain,
    public_fields,
    setting,
)
from hpcrl.config.sweep_spec import SweepConfig, WhenRule

__all__ = ["ConfigError", "Experiment", "load_experiment", "experiment_from_dict", "apply_settings"]

MAX_NAME = 200
"""Bytes of an experiment name: a directory name may have 255, and job names and job logs add
suffixes such as `-aggregate`."""
MAX_ROLLOUT = 1_000_000
"""Transitions of one on-policy rollout (train.num_steps x env.num_envs), held in memory at once."""
NETWORK_KEYS = ("train.hidden_sizes", "train.recurrent_size", "train.network")
"""The keys that size a network (`Experiment._network_memory_problem`): a grid joins them (JOINED_KEYS), a
search checks each value it can draw (`_check_network_memory`)."""


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    """The environment: a gymnasium id (`module:Id` imports its module first), a ViZDoom scenario, Habitat's
    task, an OpenSpiel game's name, or a game class `module:Class`."""
    backend: Literal["gymnasium", "vizdoom", "habitat", "openspiel", "game"] = "gymnasium"
    """`openspiel` (a game by name) and `game` (a class, `module:Class`) are two-player games for algo alphazero."""
    num_envs: int = setting(8, ge=1, le=MAX_ENVS)
    """Environments one run steps together (one batched forward pass per step); each is a simulator."""
    vectorization: Literal["auto", "sync", "async"] = setting("auto", learned=False)
    """`auto`: sync for cheap envs (IPC dominates), async for simulators."""
    envs_per_worker: Optional[int] = setting(None, ge=1, le=MAX_ENVS, learned=False)
    """Envs each worker process steps in turn (`vectorization: async`); null: two workers per usable
    core, each with its share. A worker per env costs a process wake-up and a message each way per
    env and step."""
    worker_affinity: Literal["auto", "pinned", "free"] = setting("auto", learned=False)
    """Where env worker processes run (`vectorization: async`). `pinned`: each worker, and the simulators
    it starts, on one core of those the run may use, round the cores, as Sample Factory's
    `set_workers_cpu_affinity`: a worker and its game engine hand each step to each other on one core
    instead of waking each other across two. `free`: wherever the kernel puts them. `auto`: pinned for
    ViZDoom (one single-threaded engine per game, in step with its worker) where the workers are at
    least as many as the usable cores, so that every core gets its share and runs sharing a node spread
    alike; free otherwise (Habitat's simulator runs threads of its own)."""
    worker_timeout_s: float = setting(120.0, gt=0, le=86400, learned=False)
    """The longest wait on one env worker process (its start, a reset, a step, its close), or on one
    call into a user's env in the trainer's own process (`vectorization: sync`): a worker that does
    not answer in time is killed, a call is interrupted, and the run fails in one line, instead of
    holding the job (and its GPU) until the time limit."""
    kwargs: dict[str, Any] = setting(factory=dict)
    """Keyword arguments of the environment's constructor (`gymnasium.make(id, **kwargs)`, the game class); for ViZDoom its game's settings, checked before a game starts."""
    frame_stack: int = setting(1, ge=1, le=64)
    """Observations stacked along a new first axis (Box observations only); 1: none."""
    normalize_obs: bool = False
    """Refused when the run starts: set train.normalize_obs, which keeps the statistics in the policy
    (so evaluation uses them)."""
    max_episode_steps: Optional[int] = setting(None, ge=1)
    """Truncate episodes after this many steps (gymnasium's TimeLimit; a ViZDoom step is `frame_skip` tics); null: the env's own limit. Not for two-player games (AlphaZero's train.max_moves)."""


@dataclass
class EvalConfig:
    episodes: int = setting(10, ge=1, le=1_000_000)
    """Episodes (for a game: games against each opponent) the eval stage plays per run, on held-out seeds."""
    deterministic: bool = True
    """Act with the most likely action rather than sampling from the policy."""
    threshold: Optional[float] = None
    """Skip evaluating runs whose final training return is below this."""
    video: bool = False
    """Record videos of evaluation episodes into the run's `videos/` (`pip install 'hpcrl[video]'`)."""
    video_episodes: int = setting(1, ge=0, le=1000)
    """Episodes recorded when `video` is on."""
    gpus: int = setting(0, ge=0, sweepable=False)
    """GPUs of each eval task (evaluation rarely needs one)."""
    every_steps: Optional[int] = setting(None, ge=1)
    """Evaluate inside the training process every N environment steps (and at the end), on held-out
    seeds, without changing what is learned; null: only the eval stage evaluates, once at the end."""
    periodic_episodes: int = setting(5, ge=1, le=10_000)
    """Episodes of each evaluation during training (deterministic when `deterministic` is)."""
    checkpoint: Literal["last", "best"] = "last"
    """Which policy the eval stage evaluates: the final one, or the best of the evaluations during
    training (`best` needs `every_steps`)."""

    def check(self) -> list[tuple[str, str]]:
        if self.checkpoint == "best" and self.every_steps is None:
            return [("checkpoint", "'best' needs eval.every_steps: the best policy is the one the evaluations during training found")]
        return []


@dataclass
class TrackingConfig:
    """Where training metrics go besides train.csv, which stays the source of truth. Nothing here
    changes what is learned, and a tracker that fails never fails the run."""

    tensorboard: Union[bool, Literal["auto"]] = "auto"
    """Event files under `<experiment>/tensorboard/<setting>/<run id>/`, so `tensorboard --logdir
    logs/<experiment>` groups runs by setting and seed. `auto`: when the package is installed
    (`pip install hpcrl[tensorboard]`); true: required (refused at sweep time when missing)."""
    wandb: bool = False
    """Weights & Biases in offline mode (jobs have no network); `wandb sync` the run directories'
    `wandb/` folders later from a login node."""
    wandb_project: str = setting("hpcrl", valid=no_spaces_problem)
    """W&B project of the offline runs."""
    wandb_entity: Optional[str] = setting(None, valid=no_spaces_problem)
    """W&B entity (user or team); null: W&B's default."""


@dataclass
class ScoreReference:
    """A task's random and reference scores: normalised score = (score - random) / (reference - random)."""

    random: float
    """A uniformly random policy's mean return on the task."""
    reference: float
    """The return that counts as 1 (solved, or a published score)."""

    def check(self) -> list[tuple[str, str]]:
        if self.reference == self.random:
            return [("reference", f"must differ from random ({self.random:g}): the normalised score divides by their difference")]
        return []


@dataclass
class ResultsConfig:
    """How `collect` and `compare` score runs across tasks (environments)."""

    normalize: bool = False
    """Score each task as (score - random) / (reference - random) before aggregating across tasks."""
    scores: dict[str, ScoreReference] = setting(factory=dict)
    """Random and reference scores per env id; hpcrl ships them for the classic-control envs."""
    task: Optional[str] = setting(None, valid=no_spaces_problem)
    """The task (env id) the runs are scored on when hpcrl cannot tell (algo: program): the key that
    `compare` joins experiments on."""


def _name_problem(name: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", name):
        return (
            "expected a letter, then letters, digits, '.', '_' or '-' (it names a directory and the jobs; "
            f"Grid Engine refuses job names that start with a digit), got {name!r}"
        )
    if len(name) > MAX_NAME:
        return f"expected at most {MAX_NAME} characters (it names a directory and its jobs), got {len(name)}"
    return None


@dataclass
class Experiment:
    """A config file: what runs learn (algo, env, train), which runs there are (sweep), where and how they
    run (resources, container, cuda, image), and how they are evaluated and reported (eval, tracking, results)."""

    name: str = setting(valid=_name_problem, learned=False)
    """The experiment's name: its directory `<output>/<name>/` and its jobs' names. A letter, then letters,
    digits, `.`, `_` or `-`."""
    algo: Literal["ppo", "a2c", "dqn", "alphazero", "program"] = "ppo"
    """`program`: the user's own trainer (the `program:` section) instead of hpcrl's PPO, A2C or DQN."""
    env: EnvConfig = setting(factory=EnvConfig)
    """The environment (or game) each run learns."""
    train: TrainConfig = setting(factory=TrainConfig)
    sweep: SweepConfig = setting(factory=SweepConfig, learned=False)
    """Which runs the experiment holds: seeds, a grid, rules per grid point, a search."""
    resources: Resources = setting(factory=Resources, learned=False)
    container: ContainerConfig = setting(factory=ContainerConfig, learned=False)
    """The Singularity/Apptainer image the jobs run in; none: the host's Python."""
    cuda: CudaConfig = setting(factory=CudaConfig, learned=False)
    """What a GPU job sets up before it starts."""
    eval: EvalConfig = setting(factory=EvalConfig, learned=False, sweepable=True)
    """The eval stage and the evaluations during training."""
    image: Optional[ImageConfig] = setting(None, learned=False)
    """How `hpcrl build-image` builds the image of this config (and names it for container.image)."""
    output: str = setting("logs", valid=non_empty_problem, learned=False)
    """Root under which `<output>/<name>/` is created."""
    python: Optional[str] = setting(None, valid=non_empty_problem, learned=False)
    """Interpreter the job scripts run when no image is set; defaults to the one running `hpcrl sweep`."""
    distributed: Optional[DistributedConfig] = None
    """Decoupled learner and actor jobs (Ape-X style) instead of one train job per run."""
    program: Optional[ProgramConfig] = None
    """The user's own trainer, for `algo: program` (hpcrl.config.program_spec)."""
    tracking: TrackingConfig = setting(factory=TrackingConfig, learned=False)
    results: ResultsConfig = setting(factory=ResultsConfig, learned=False)
    source: Optional[str] = dataclasses.field(default=None, metadata={"internal": True})
    given: Optional[dict[str, Any]] = dataclasses.field(default=None, metadata={"internal": True}, repr=False)
    """The config as the user wrote it (overrides applied): a grid point that changes `algo` starts
    from it, so each algorithm gets its own defaults rather than the first algorithm's."""

    @property
    def dir(self) -> Path:
        return Path(self.output) / self.name

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        data.pop("given")
        if self.algo == "program":
            for key in PROGRAM_UNUSED:
                del data[key]
        else:
            del data["program"]
        return data

    def check(self) -> list[tuple[str, str]]:
        if (self.program is None) == (self.algo == "program"):
            if self.program is None:
                return [("program", "required with algo 'program': the command of your trainer (program.command)")]
            return [("program", f"only used with algo 'program' (algo is {self.algo!r})")]
        if self.container.runs == "program" and self.algo != "program":
            return [("container.runs", f"'program' runs a user's program in the image and needs algo 'program' (algo is {self.algo!r}); hpcrl's own trainer runs in the image with 'hpcrl'")]
        if self.algo == "program" and self.distributed is not None:
            return [("distributed", "not available with algo 'program': your program runs as one job per run")]
        if (self.algo == "alphazero") != (self.env.backend in ("openspiel", "game")):
            if self.algo == "alphazero":
                return [("env.backend", f"algo alphazero plays two-player games: expected 'openspiel' or 'game', got {self.env.backend!r}")]
            if self.algo != "program":
                return [("env.backend", f"{self.env.backend!r} is a two-player game, for algo alphazero (algo is {self.algo!r})")]
        if self.env.backend in ("openspiel", "game"):  # settings of single-agent envs, which a two-player game would ignore
            if self.env.max_episode_steps is not None:
                return [("env.max_episode_steps", "a two-player game ends by its own rules; AlphaZero caps a game's moves with train.max_moves")]
            if self.env.frame_stack != 1:
                return [("env.frame_stack", "a two-player game's observation is its whole position, and nothing stacks it")]
        if self.distributed is not None and self.algo not in ("dqn", "alphazero"):
            return [("distributed", f"needs algo 'dqn' (Ape-X) or 'alphazero' (self-play jobs): {self.algo!r} is on-policy and hpcrl has no off-policy correction (V-trace) for stale actor parameters")]
        if self.distributed is not None and self.algo == "alphazero" and self.distributed.prioritized:
            return [("distributed.prioritized", "not available with algo alphazero: its trainer samples the replay window uniformly")]
        if self.resources.ranks > 1:
            if self.algo in ("dqn", "alphazero", "program"):
                why = {"dqn": "DQN runs in one process, or as Ape-X (distributed:)", "alphazero": "AlphaZero's self-play and training run in one process, or as jobs (distributed:)"}.get(self.algo, "your program starts its own processes (torchrun inside program.command)")
                return [("resources.ranks", f"more than one rank is DD-PPO, for ppo and a2c: {why}")]
            if self.sweep.search is not None and self.sweep.search.method == "optuna":
                return [("resources.ranks", "an Optuna study's workers train one rank each")]
        if (problem := self._gpu_problem()) is not None:
            return [problem]
        if self.eval.gpus > self.resources.max_gpus_per_node:
            return [("eval.gpus", f"expected 0..{self.resources.max_gpus_per_node} GPUs per task, got {self.eval.gpus}")]
        if isinstance(self.train, OnPolicyConfig) and self.train.num_steps * self.env.num_envs > MAX_ROLLOUT:
            return [("train.num_steps", f"a rollout of num_steps x env.num_envs = {self.train.num_steps * self.env.num_envs:,} transitions passes the limit of {MAX_ROLLOUT:,}")]
        return []

    def request_problems(self) -> list[tuple[str, str]]:
        """Rules for a new request (a sweep, a run it makes, a trial), not for a config on disk (`stored_configs`):
        a run that cannot learn or would fail at its first shell line, which hpcrl accepted before it had these
        rules. An experiment written then must still load for `status`, `collect` and its jobs in flight."""
        train = self.train
        if self.algo != "program" and (problem := self._network_memory_problem()) is not None:
            return [problem]
        if isinstance(train, PPOConfig) and (problem := minibatch_problem(train.num_minibatches, train.num_steps, self.env.num_envs, train.recurrent_size > 0, self.resources.ranks)):
            return [("train.num_minibatches", problem)]  # every rank steps env.num_envs envs: each splits its own rollout
        if isinstance(train, DQNConfig):
            # Gradient steps need more than learning_starts env steps and a minibatch in the replay (hpcrl.rl.dqn
            # `learning`; Ape-X's learner earns updates from the same): a run without them ends untrained, as done.
            if train.learning_starts >= train.total_steps:
                return [("train.learning_starts", f"{train.learning_starts} is not below total_steps ({train.total_steps}): gradient steps begin after learning_starts environment steps, so the run would end without one")]
            if train.batch_size > train.total_steps:
                return [("train.batch_size", f"{train.batch_size} is more than total_steps ({train.total_steps}): the replay would never hold one minibatch, so the run would end without a gradient step")]
            if (problem := self._train_freq_problem(train)) is not None:
                return [("train.train_freq", problem)]
        for key, names, line in (("cuda.modules", self.cuda.modules, "module load"), ("container.binds", self.container.binds, "--bind")):
            if (blank := next((i for i, name in enumerate(names) if not name.strip()), None)) is not None:
                return [(f"{key}[{blank}]", f"expected a non-empty value, got {names[blank]!r}: every job would fail at its `{line} {names[blank]!r}`")]
        return []

    def _network_memory_problem(self) -> tuple[str, str] | None:
        """A network whose hidden layers alone outgrow `resources.mem`. Its weights are made in the job's memory (on
        the CPU, before any move to a GPU), in float32, so 4 bytes a weight is a floor under what the job needs: a job
        past it is killed for its memory, or, where nothing enforces the limit, spends the node's memory and its
        time orthogonalising the layers, after its wait in the queue."""
        parts = self.train.sized_weights()
        weights = sum(parts.values())
        need_mb = 4 * weights / 2**20
        if need_mb <= parse_mem_mb(self.resources.mem):
            return None
        key = max(parts, key=parts.__getitem__)  # the key that sizes most of them
        layers = "the hidden layers" + (" and the GRU core" if parts.get("train.recurrent_size") else "")
        return (key, f"{layers} alone hold {weights:,} weights, {need_mb / 1024:.1f} GiB in float32: more than resources.mem ({self.resources.mem}); narrow them, or raise resources.mem")

    def _train_freq_problem(self, train: DQNConfig) -> str | None:
        """A DQN whose training phases fall after total_steps (`hpcrl.rl.dqn`: a phase every train_freq
        env steps, rounded up to whole steps of env.num_envs, and the budget rounded up to whole
        phases: the run would play the phase's steps, past its budget), or an Ape-X learner that earns
        no update (gradient_steps per train_freq transitions accepted after learning_starts)."""
        if self.distributed is None:
            phase = math.ceil(train.train_freq / self.env.num_envs) * self.env.num_envs
            if phase <= train.total_steps:
                return None
            rounded = f" (whole steps of env.num_envs {self.env.num_envs}: {phase})" if phase != train.train_freq else ""
            return f"{train.train_freq} environment steps between training phases{rounded} pass total_steps ({train.total_steps}): the run would play {phase} steps to reach its first training phase"
        after = train.total_steps - train.learning_starts
        if after * train.gradient_steps >= train.train_freq:
            return None
        return f"{train.train_freq} transitions per {train.gradient_steps} update{'s' if train.gradient_steps > 1 else ''} (gradient_steps): the Ape-X learner earns its updates from the transitions after learning_starts, and total_steps - learning_starts = {after} earn none"


    def _gpu_problem(self) -> tuple[str, str] | None:
        """`train.device: cuda[:N]` against the GPUs a task asks for: a scheduler (and the local
        executor) gives a task the GPUs it asks for and hides the rest, so a CUDA device that the
        request does not cover fails every task at its first CUDA call. Caught here, at sweep time."""
        device = getattr(self.train, "device", "auto")
        if not device.startswith("cuda"):
            return None
        res = self.resources
        if res.gpus == 0:
            return ("resources.gpus", f"train.device {device!r} needs a GPU: a task is given the GPUs it asks for and none here (gpus: 0); set resources.gpus or train.device: auto")
        index = int(device.partition(":")[2] or 0)
        if ":" in device and res.ranks > 1:
            return ("train.device", f"{device!r} puts every rank on one GPU; with resources.ranks > 1 use 'cuda' or 'auto' (rank i takes the node's GPU i)")
        if index >= res.gpus:
            return ("train.device", f"{device!r} is GPU {index} of the task, which asks for resources.gpus: {res.gpus} (numbered from 0)")
        return None


# --------------------------------------------------------------------------------------------
# Dotted keys: overrides, grid points and what may be swept.


def _field_type(cls: Any, part: str, algo: str) -> Any:
    tp = ALGORITHMS.get(algo, TrainConfig) if (cls is Experiment and part == "train") else hints(cls)[part]
    if typing.get_origin(tp) in (Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _known_path(dotted: str, algo: str) -> bool:
    """Whether a dotted key names a field of the schema (so `-p` and the grid fail on typos)."""
    cls: Any = Experiment
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if cls is None or not dataclasses.is_dataclass(cls):
            # Inside a free-form mapping (env.kwargs, container.env): any key is allowed.
            return cls is dict
        if part not in public_fields(cls):
            return False
        tp = _field_type(cls, part, algo)
        if typing.get_origin(tp) is dict:
            return True
        cls = tp if dataclasses.is_dataclass(tp) else (None if i < len(parts) - 1 else tp)
    return True


def known_paths(algo: str) -> list[str]:
    """Every dotted key of a setting of the schema for `algo` (`train.lr`, `resources.ranks`, ...)."""
    out: list[str] = []

    def walk(cls: Any, prefix: str) -> None:
        for name in public_fields(cls):
            tp = _field_type(cls, name, algo)
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{name}.")
            else:
                out.append(prefix + name)

    walk(Experiment, "")
    return out


def _unknown(where: str, key: str, algo: str) -> ConfigError:
    """`unknown key`, with the closest known keys when one is close (`train.lrr`: did you mean
    train.lr?), and else the keys whose last part is close to the key's (`lr`, `trian.num_env`: the
    section left out or misspelt: did you mean train.lr?, env.num_envs?)."""
    paths = known_paths(algo)
    hint = did_you_mean(key, paths) or _leaf_hint(key, paths)
    return ConfigError(f"{where}: unknown key" + (f" ({hint})" if hint else ""))


def _leaf_hint(key: str, paths: list[str]) -> str:
    """`did you mean train.lr?` for `lr`: the known keys whose last part is close to the key's last
    part (a key written without its section, or in the wrong one), or ''."""
    leaf = key.rpartition(".")[2]
    close = difflib.get_close_matches(leaf, list(dict.fromkeys(p.rpartition(".")[2] for p in paths)), n=2, cutoff=0.7)
    found = [p for name in close for p in paths if p.rpartition(".")[2] == name][:2]
    return f"did you mean {' or '.join(found)}?" if found else ""


def _check_hydra_sweep(key: str, value: Any, text: str, algo: str) -> None:
    """Hydra's sweep syntax in an override (`train.lr=1e-3,3e-4`, `train.lr=choice(1e-3,3e-4)`):
    hpcrl sweeps what `sweep.grid` lists, so the override is refused with the grid key to write,
    where the key is one a grid may vary and holds one value of the schema (a free-form value,
    such as a program's parameter `--gpus 0,1`, may hold a comma; a list is written in brackets)."""
    if not isinstance(value, str) or "," not in value:
        return
    if key != "algo" and (not _known_path(key, algo) or _free_form(key, algo) or not is_sweepable(key, algo)):
        return
    raw = text.split("=", 1)[1].strip()
    if found := re.fullmatch(r"choice\((.*)\)", raw):
        raw = found.group(1)
    raise ConfigError(
        f"-p {key}={text.split('=', 1)[1].strip()}: Hydra's sweep syntax; hpcrl sweeps the lists in sweep.grid: "
        f"write sweep.grid.{key}=[{raw}]"
    )


def _free_form(dotted: str, algo: str) -> bool:
    """Whether a (known) dotted key holds a free-form value or a list rather than one typed scalar."""
    cls: Any = Experiment
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return True  # inside a free-form mapping (env.kwargs, program.params)
        cls = _field_type(cls, part, algo)
    return cls in (Any, Verbatim) or typing.get_origin(cls) in (list, dict) or dataclasses.is_dataclass(cls)


def _path_rules(dotted: str, algo: str) -> list[Any]:
    """The rules of each field along a (known) dotted key, down to a free-form mapping."""
    cls: Any = Experiment
    out = []
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            break  # inside a free-form mapping, which its field already answered for
        out.append(field_rules(cls)[part])
        cls = _field_type(cls, part, algo)
    return out


def is_learned(dotted: str, algo: str) -> bool:
    """Whether the setting at a (known) dotted key changes what a run learns. Settings that change
    only how or where it runs (`resources.*`, `train.device`, `train.checkpoint_every`, ...) are
    declared `learned=False` on their fields: a run id need not hash them."""
    return all(rules.learned for rules in _path_rules(dotted, algo))


def is_sweepable(dotted: str, algo: str) -> bool:
    """Whether a grid may vary the setting: what is learned, and how runs are evaluated (`eval.*`
    but `eval.gpus`)."""
    return all(rules.in_grid for rules in _path_rules(dotted, algo))


def learned_settings(exp: Experiment) -> dict[str, Any]:
    """The typed values of every setting that changes what is learned (nested like `to_dict()`):
    what a run id should hash, so `1e-3`, `0.001` and a default left out hash alike."""

    def keep(obj: Any) -> Any:
        if not dataclasses.is_dataclass(obj):
            return copy.deepcopy(obj)
        rules = field_rules(type(obj))
        return {name: keep(getattr(obj, name)) for name in public_fields(type(obj)) if rules[name].learned}

    learned = keep(exp)
    if exp.algo == "program":  # hpcrl's own env and trainer settings do not reach the user's program
        del learned["env"], learned["train"]
    else:  # the ids of hpcrl's own runs stay what they were before programs existed
        del learned["program"]
    if exp.resources.ranks > 1:  # every rank steps env.num_envs envs: the batch grows with the ranks
        learned["ranks"] = exp.resources.ranks
    for dotted, before in _LATER_KEYS.items():
        section, key = dotted.split(".")
        values = learned.get(section)
        if isinstance(values, dict) and values.get(key) == before:
            del values[key]
    return learned


_LATER_KEYS: dict[str, Any] = {"train.async_rollout": "auto", "train.cnn_channels": list(NATURE_CNN), "distributed.ratio_slack": 0.0, "train.value_target_q": 0.0}
"""Learned keys added after run ids existed, with the value that trains as runs did before the key:
left out of the hash at that value, so the ids of existing runs stay what they were (`auto` is
hpcrl's own choice per env kind; the Nature CNN was the only CNN; the learner held its ratio exactly)."""


def _merge(old: Any, new: Any) -> Any:
    """A mapping given for a mapping changes only the keys it names; anything else replaces."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for key, value in new.items():
            out[key] = _merge(old.get(key), value)
        return out
    return new


def _set_dotted(data: dict, dotted: str, value: Any, *, merge: bool = False) -> None:
    """Set a dotted key; with `merge` (a grid point), a mapping changes only the keys it names,
    while `-p key=value` sets the key to exactly the value given."""
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part} is not a mapping")
        node = child
    node[parts[-1]] = _merge(node.get(parts[-1]), value) if merge else value


DOTTED_KEY_MAPS = ("sweep.grid", "sweep.search.space")
"""Mappings whose keys are themselves dotted config keys (`train.lr`)."""


def _set_override(data: dict, key: str, value: Any) -> None:
    """`-p key=value`; below a mapping of dotted keys the rest is one key, so
    `-p sweep.grid.train.lr=[...]` sets the grid's `train.lr`, as the same line in the file does."""
    for prefix in DOTTED_KEY_MAPS:
        if key.startswith(prefix + ".") and len(key) > len(prefix) + 1:
            node = _dotted_or_none(data, prefix)
            if node is None:
                _set_dotted(data, prefix, node := {})
            if not isinstance(node, dict):
                raise ConfigError(f"-p {key}: {prefix} is not a mapping")
            node[key[len(prefix) + 1 :]] = value
            return
    _set_dotted(data, key, value)


def _dotted_or_none(data: dict, dotted: str) -> Any:
    """The value at a dotted key of plain data; None where a part is missing or not a mapping."""
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _get_dotted(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=3e-4` -> ('train.lr', 0.0003): the value is read as YAML, then typed by the schema
    (numbers keep their text, so `name=1.10` stays '1.10')."""
    if "=" not in text:
        raise ConfigError(f"-p {text}: expected key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"-p {text}: expected key.path=value")
    if any(c in text for c in "\n\r"):  # YAML would fold it, or read what follows a # as a comment
        raise ConfigError(f"-p {key_path('', key)}: an override is one line, got a line break in {raw!r}")
    flow = raw.strip()[:1] in ("{", "[")
    try:
        value = strict_yaml.load(_hydra_flow(raw) if flow else raw) if raw.strip() else ""
    except ConfigError as exc:
        if flow:  # a mapping or list the user meant, not a string that happens to start with a bracket
            raise ConfigError(f"-p {key_path('', key)}: {re.sub(r'^line [0-9]+: ', '', str(exc))} in {raw!r}") from None
        value = raw
    return key, value


def _hydra_flow(text: str) -> str:
    """Hydra's `{a:1,b:2}` as YAML's `{a: 1, b: 2}`: YAML reads a key and value without a space
    after the colon as one key with no value ('a:1': null), so a space is put after the first colon
    of each key of a flow mapping, at any depth. Quoted text, and colons inside values
    (`{url:http://x}`), are left as written."""
    out: list[str] = []
    stack: list[str] = []  # "{" or "[" per open collection
    in_key = False  # reading a mapping key: its first colon separates it from its value
    quote = ""
    for i, c in enumerate(text):
        out.append(c)
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "{[":
            stack.append(c)
            in_key = c == "{"
        elif c in "}]":
            if stack:
                stack.pop()
            in_key = False
        elif c == ",":
            in_key = bool(stack) and stack[-1] == "{"
        elif c == ":" and in_key:
            in_key = False
            if text[i + 1 : i + 2] not in (" ", ""):
                out.append(" ")
    return "".join(out)


MAX_CONFIG_BYTES = 10 * 2**20
"""The largest config file read. A config is a few kB; a larger file is something else given by
mistake (a log, a checkpoint), and reading a device such as /dev/zero would never end: refused,
rather than read until memory runs out."""


def read_yaml(path: Path) -> dict[str, Any]:
    """A user's config file as data: a regular file of at most MAX_CONFIG_BYTES, UTF-8, strict YAML
    (see `hpcrl.config.strict_yaml`), a mapping. It is opened without blocking and looked at before
    it is read: a FIFO would block the read until a writer came, a device would not end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
                raise ConfigError(f"{path}: not a regular file ({kind}): give the path of a YAML config file")
            with open(fd, "rb", closefd=False) as f:
                raw = f.read(MAX_CONFIG_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than a config file can be ({MAX_CONFIG_BYTES // 2**20} MB): give the path of a YAML config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it as UTF-8") from None
    try:
        data = strict_yaml.load(text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


PROGRAM_UNUSED = ("env", "train")
"""Sections of hpcrl's own trainer that a user's program never sees: refused with algo: program."""


def _algo(data: dict[str, Any]) -> str:
    algo = data.get("algo", "ppo")
    if not isinstance(algo, str) or algo not in (*ALGORITHMS, "program"):
        raise ConfigError(f"algo: {choice_problem(algo, (*ALGORITHMS, 'program'))}")
    return algo


def _unused_by_program(key: str) -> ConfigError:
    return ConfigError(f"{key}: not used with algo 'program' (hpcrl does not train; give your program's settings in program.params or program.args)")


def _nest_params(data: dict[str, Any]) -> None:
    """`program.params` may be written flat with Hydra's dotted keys (`habitat_baselines.rl.ppo.lr: 2.5e-4`):
    stored nested, as the sweep grammar addresses them (`program.params.habitat_baselines.rl.ppo.lr`)."""
    program = data.get("program")
    params = program.get("params") if isinstance(program, dict) else None
    if not isinstance(params, dict) or not any(isinstance(k, str) and "." in k for k in params):
        return
    nested: dict[str, Any] = {}
    for key, value in params.items():
        parts = key.split(".") if isinstance(key, str) else [key]
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"program.params.{key}: {part} is both a value and a mapping")
        if parts[-1] in node:
            raise ConfigError(f"program.params.{key}: given twice (flat and nested)")
        node[parts[-1]] = value
    data["program"] = {**program, "params": nested}


def _build_experiment(data: dict[str, Any], *, request: bool | None = None) -> Experiment:
    """The dataclasses of plain data; `train` takes the class of the chosen algorithm. `request`: whether the rules of
    a request hold (`Experiment.request_problems`); by default, unless configs a sweep wrote are read (`stored_configs`)."""
    data = dict(data)
    algo = _algo(data)
    if algo == "program":
        if unused := [key for key in PROGRAM_UNUSED if key in data]:
            raise ConfigError(*(str(_unused_by_program(key)) for key in unused))
        _nest_params(data)
    train_data = data.pop("train", None)
    image_data = data.pop("image", None)
    problems = Problems()  # the sections are built apart: a problem in one leaves the others looked at
    paths = known_paths(algo)
    with problems.kept():
        exp = build(Experiment, data, "", elsewhere=lambda key: _leaf_hint(key, paths))
    with problems.kept():
        train = build(ALGORITHMS.get(algo, TrainConfig), {} if train_data is None else train_data, "train", elsewhere=lambda key: _leaf_hint(key, [p for p in paths if not p.startswith("train.")]))
    with problems.kept():
        image = None if image_data is None else build(ImageConfig, image_data, "image")
    problems.raise_any()
    exp.train, exp.image = train, image
    if found := exp.check():  # again: train was a TrainConfig when build() checked it first
        raise ConfigError(*(f"{key}: {message}" for key, message in found))
    if (not _STORED.get() if request is None else request) and (found := exp.request_problems()):
        raise ConfigError(*(f"{key}: {message}" for key, message in found))
    return exp


_STORED: contextvars.ContextVar[bool] = contextvars.ContextVar("hpcrl_stored_configs", default=False)


@contextlib.contextmanager
def stored_configs() -> Iterator[None]:
    """Read configs that a sweep wrote (an experiment's and its runs'): each field's own bounds and the rules of
    `Experiment.check` hold for them, the rules of `Experiment.request_problems` do not, so that an experiment
    written before those rules existed still loads for status, collect and its jobs in flight."""
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


def experiment_from_dict(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Validate plain data (with `-p` overrides applied) into an Experiment."""
    data = copy.deepcopy(data)
    problems = Problems()  # every problem of the overrides and the config, then of the sweep: one line each
    for text in overrides:
        with problems.kept():
            key, value = parse_override(text)
            algo = _algo(data)
            if key != "algo" and not _known_path(key, algo):
                raise _unknown(f"-p {key_path('', key)}", key, algo)
            if algo == "program" and key.split(".")[0] in PROGRAM_UNUSED:
                raise _unused_by_program(f"-p {key}")
            _check_hydra_sweep(key, value, text, algo)
            _set_override(data, key, value)
    with problems.kept():
        exp = _build_experiment(data)
    problems.raise_any()
    for check in (_check_grid, _check_search):
        with problems.kept():
            check(exp, data)
    with problems.kept():
        _check_normalize(exp)
    problems.raise_any()
    exp.given = data
    return exp


def _check_normalize(exp: Experiment) -> None:
    """`results.normalize` needs random and reference scores for every env the runs train on: found
    missing at sweep time, not by the aggregate job after the training is spent."""
    if not exp.results.normalize:
        return
    if "env.id" in exp.sweep.grid:
        envs = list(exp.sweep.grid["env.id"])
    elif exp.results.task or exp.algo != "program":
        envs = [exp.results.task or exp.env.id]
    else:
        raise ConfigError("results.normalize: needs results.task with algo 'program' (the env id your program trains on)")
    scores = {task: dataclasses.asdict(ref) for task, ref in exp.results.scores.items()}
    tasks.normalizer(envs, tasks.references({"results": {"scores": scores}}))


def _check_grid(exp: Experiment, data: dict[str, Any]) -> None:
    """What may be swept, how many runs a sweep may have, that no two grid points are one run, and
    that every grid point, with the `sweep.when` settings it matches, is a valid config.

    Each grid value is validated as part of a whole config, and replaced by its typed value (so
    `1e-3` and `0.001` are one value, found to repeat here rather than as one run id twice); so are
    the values `sweep.when` matches on.
    """
    grid = exp.sweep.grid
    problems = Problems()  # each grid key on its own: every misspelt key is named at once
    for key, values in grid.items():
        with problems.kept():
            _check_grid_key(exp, key, values)
    problems.raise_any()
    runs = math.prod(len(v) for v in grid.values()) * len(exp.sweep.seeds)
    if runs > MAX_RUNS:
        raise ConfigError(f"sweep.grid: {runs:,} runs (grid points x seeds) pass the limit of {MAX_RUNS:,}")
    base = copy.deepcopy(data)
    base.pop("sweep", None)
    if "algo" in grid:  # a value of another key is typed under the first algorithm of the grid
        base["algo"] = grid["algo"][0]
    for key, values in grid.items():
        with problems.kept():
            grid[key] = _typed_values(base, key, values, f"sweep.grid.{key}")
    problems.raise_any()
    _check_when(exp, base)


def _check_grid_key(exp: Experiment, key: str, values: list[Any]) -> None:
    """One key of `sweep.grid`: known (or a did-you-mean), sweepable, with values, swept once."""
    where = f"sweep.grid.{key}"
    if key != "algo" and not _known_path(key, exp.algo):
        raise _unknown(where, key, exp.algo)
    if exp.algo == "program" and key.split(".")[0] in PROGRAM_UNUSED + ("algo",):
        raise _unused_by_program(where)
    if key != "algo" and not is_sweepable(key, exp.algo):
        raise ConfigError(f"{where}: cannot be swept: it changes how or where runs execute, not what they learn (set it once, outside the grid)")
    if not values:
        raise ConfigError(f"{where}: expected a non-empty list of values")
    for other in exp.sweep.grid:
        if other.startswith(key + "."):
            raise ConfigError(f"sweep.grid.{other}: overlaps sweep.grid.{key} (sweep each key once)")
    for value in values if key == "algo" else []:
        if not isinstance(value, str) or value not in ALGORITHMS:
            hint = did_you_mean(value, list(ALGORITHMS), quote=True) if isinstance(value, str) else ""
            raise ConfigError(
                f"sweep.grid.algo: expected values among {', '.join(map(repr, ALGORITHMS))} (a user's program is its own experiment), got {_show(value)}"
                + (f" ({hint})" if hint else "")
            )


def _check_search(exp: Experiment, data: dict[str, Any]) -> None:
    """`sweep.search`: what may be searched (as for the grid, and never a key the grid sweeps), each
    distribution's bounds and options typed by the key's own field, and what an Optuna study needs
    (one seed per trial, hpcrl's own trainer, a metric it reports while it trains)."""
    search = exp.sweep.search
    if search is None:
        return
    base = copy.deepcopy(data)
    base.pop("sweep", None)
    for key, dist in search.space.items():
        where = f"sweep.search.space.{key}"
        if key == "algo" or not _known_path(key, exp.algo):
            raise _unknown(where, key, exp.algo) if key != "algo" else ConfigError(f"{where}: sweep algo in sweep.grid instead")
        if not is_sweepable(key, exp.algo):
            raise ConfigError(f"{where}: cannot be searched: it changes how or where runs execute, not what they learn")
        if any(key == g or key.startswith(g + ".") or g.startswith(key + ".") for g in exp.sweep.grid):
            raise ConfigError(f"{where}: also in sweep.grid (search or sweep a key, not both)")
        if dist.type == "choice":
            dist.values = _typed_values(base, key, dist.values, f"{where}.values")
            _check_network_memory(base, key, dist.values, f"{where}.values")
            continue
        low, high = _typed_values(base, key, [dist.low, dist.high], where)
        _check_network_memory(base, key, [high], where)  # the network is largest at the top of the range
        if dist.type != "int" and not isinstance(low, float):
            raise ConfigError(f"{where}: {key} takes integers: use type: int")
        if dist.type == "int" and isinstance(low, float):
            dist.low, dist.high = float(low), float(high)  # an int distribution of a float field: whole numbers
        elif dist.type == "int" and key in SPLIT_KEYS and not _STORED.get():
            _check_split_range(exp, key, low, high, where)
    runs = math.prod(len(v) for v in exp.sweep.grid.values()) * len(exp.sweep.seeds) * (search.samples or search.n_trials or 1)
    if runs > MAX_RUNS:
        raise ConfigError(f"sweep.search: {runs:,} runs (grid points x samples x seeds) pass the limit of {MAX_RUNS:,}")
    if search.method != "optuna":
        return
    if exp.algo == "program" or exp.distributed is not None:
        raise ConfigError("sweep.search.method: optuna trains hpcrl's own PPO, A2C or DQN in its workers (not algo 'program' or a distributed run); use method random")
    if exp.sweep.grid:
        raise ConfigError("sweep.search.method: an Optuna study searches its space alone: move the keys of sweep.grid into sweep.search.space (type: choice)")
    if len(exp.sweep.seeds) != 1:
        raise ConfigError(f"sweep.seeds: an Optuna trial trains one seed, got {len(exp.sweep.seeds)} (the trial's value is that run's metric)")
    if search.metric == "eval" and exp.eval.every_steps is None:
        if search.pruner != "none":
            raise ConfigError(f"sweep.search.pruner: {search.pruner} has no intermediate metric: metric 'eval' needs eval.every_steps (or use metric: train)")
        raise ConfigError("sweep.search.metric: 'eval' needs eval.every_steps (the evaluations during training it reports)")


def _check_network_memory(base: dict[str, Any], key: str, values: list[Any], where: str) -> None:
    """Each value of a searched NETWORK_KEYS key that a search can draw, with the config's other values: a
    network it makes that outgrows resources.mem would fail its run when drawn, after the queue."""
    if key not in NETWORK_KEYS or _STORED.get():
        return
    for value in values:
        point = copy.deepcopy(base)
        _set_dotted(point, key, value, merge=True)
        if (problem := _build_experiment(point, request=False)._network_memory_problem()) is not None:
            raise ConfigError(f"{where}={_show(value)}: {problem[0]}: {problem[1]}")


SPLIT_KEYS = ("env.num_envs", "train.num_steps", "train.num_minibatches", "train.recurrent_size")
"""The keys of PPO's split of a rollout into minibatches (`hparams.minibatch_problem`)."""


def _check_split_range(exp: Experiment, key: str, low: int, high: int, where: str) -> None:
    """Every value an int distribution of a SPLIT_KEYS key can draw, with the config's other values:
    a search draws any of them, and one that does not split the rollout would fail its Optuna trial
    when drawn, or the random search's expansion without naming the space."""
    if not isinstance(exp.train, PPOConfig) or (exp.train.num_minibatches == 1 and key != "train.num_minibatches"):
        return  # one minibatch splits any rollout
    shape = {"env.num_envs": exp.env.num_envs, "train.num_steps": exp.train.num_steps, "train.num_minibatches": exp.train.num_minibatches, "train.recurrent_size": exp.train.recurrent_size}
    for value in range(low, high + 1):
        at = {**shape, key: value}
        if problem := minibatch_problem(at["train.num_minibatches"], at["train.num_steps"], at["env.num_envs"], at["train.recurrent_size"] > 0, exp.resources.ranks):
            raise ConfigError(f"{where}={value} (of {low}..{high}): train.num_minibatches: {problem} (search the values that work, with type: choice)")


def _typed_values(base: dict[str, Any], key: str, values: list[Any], where: str) -> list[Any]:
    """Each value validated as one point on `base` and replaced by its typed value; no repeats."""
    typed_values: list[Any] = []
    given: list[Any] = []
    problems = Problems()  # every bad value of the key, one line each
    for value in values:
        point = copy.deepcopy(base)
        _set_dotted(point, key, value, merge=True)
        try:
            # Typed alone: a request's rules join keys, and _check_when checks them on whole grid points (JOINED_KEYS).
            typed = _canonical(_get_dotted(_build_experiment(point, request=False), key), value)
        except ConfigError as exc:
            problems.errors.append(exc.within(f"{where}={_show(value)}: "))
            continue
        if typed in typed_values:
            raise ConfigError(f"{where}: {_show(value)} repeats {_show(given[typed_values.index(typed)])} (the same value once typed)")
        typed_values.append(typed)
        given.append(value)
    problems.raise_any()
    return typed_values


def when_settings(rules: list[WhenRule], point: dict[str, Any]) -> list[tuple[str, Any]]:
    """The settings of every `sweep.when` rule that a grid point matches, in rule order: applied one
    after the other, each merged like a grid point's mapping, so a later rule wins key by key."""
    return [item for rule in rules if all(key in point and point[key] == value for key, value in rule.match.items()) for item in rule.set.items()]


JOINED_KEYS = (
    "env", "env.num_envs", "train", "train.num_steps", "train.num_minibatches",
    "train.total_steps", "train.learning_starts", "train.train_freq", "train.gradient_steps", "train.batch_size", "train.buffer_size",
    *NETWORK_KEYS,
)
"""Grid keys that the config's cross-field rules join (a PPO rollout's size and its split into
minibatches, when a DQN trains, the network's size against resources.mem): each value valid on the
base config, two of them can still make a point that is not (`env.num_envs: [2, 3]` with
`train.num_minibatches: [2, 128]`), so every combination of their values is validated, and named,
as one point."""


def _check_when(exp: Experiment, base: dict[str, Any]) -> None:
    """`sweep.when`: matches name swept keys and their grid values; sets name keys that are not
    swept. Then every combination of the keys that rules match on (and `algo`, whose train section
    differs, and the JOINED_KEYS) is validated with the settings it gets, and every other grid value
    with each of them."""
    grid, rules = exp.sweep.grid, exp.sweep.when
    algos = grid.get("algo", [exp.algo])
    for i, rule in enumerate(rules):
        for key, value in rule.match.items():
            where = f"sweep.when[{i}].match.{key}"
            if key not in grid:
                raise ConfigError(f"{where}: not swept (a rule matches on keys of sweep.grid: {', '.join(grid) or 'none'})")
            typed = _typed_values(base, key, [value], where)[0]
            if typed not in grid[key]:
                raise ConfigError(f"{where}: {_show(value)} is not one of the grid's values ({', '.join(map(_show, grid[key]))})")
            rule.match[key] = typed
        for key in rule.set:
            where = f"sweep.when[{i}].set.{key}"
            if not any(_known_path(key, algo) for algo in algos) or key == "algo":
                raise _unknown(where, key, algos[0]) if key != "algo" else ConfigError(f"{where}: sweep algo in sweep.grid instead")
            if any(key == g or key.startswith(g + ".") or g.startswith(key + ".") for g in grid):
                raise ConfigError(f"{where}: swept in sweep.grid (a rule sets keys that are not swept)")
            if not all(is_sweepable(key, algo) for algo in algos if _known_path(key, algo)):
                raise ConfigError(f"{where}: cannot vary between runs: it changes how or where runs execute, not what they learn")
    joined = [] if _STORED.get() else [k for k in grid if k in JOINED_KEYS]  # their rules are a request's (request_problems)
    cond = list(dict.fromkeys([k for rule in rules for k in rule.match] + (["algo"] if "algo" in grid else []) + joined))
    if not rules and not cond:
        return  # every value was validated on the base config, which is each point's
    others = [k for k in grid if k not in cond]
    for combo in itertools.product(*(grid[k] for k in cond)):
        point_values = dict(zip(cond, combo))
        extra = when_settings(rules, point_values)
        label = ", ".join(f"{k}={_show(v)}" for k, v in point_values.items()) or "every point"
        point = copy.deepcopy(base)
        for key, value in [*point_values.items(), *extra]:
            _set_dotted(point, key, value, merge=True)
        try:
            _build_experiment(point)
            for key in others:
                _typed_values(point, key, grid[key], f"sweep.grid.{key}")
        except ConfigError as exc:
            raise exc.within(f"sweep: the grid point {label}{' with sweep.when settings' if extra else ''}: ") from None


def _canonical(typed: Any, given: Any) -> Any:
    """The typed value of a grid point, keeping only the keys a mapping point named."""
    if dataclasses.is_dataclass(typed):
        typed = {name: getattr(typed, name) for name in public_fields(type(typed))}
    if isinstance(typed, dict) and isinstance(given, dict):
        return {k: _canonical(typed[k], given[k]) for k in given}
    return copy.deepcopy(typed)


def _show(value: Any) -> str:
    return repr(plain(value))


def _check_output(exp: Experiment) -> None:
    """`output` must be (or become) a directory: a file there would fail the first mkdir. A path the
    system cannot take (a name longer than a directory entry may be, below the nearest directory that
    exists or in it) is one line, not a traceback from that mkdir."""
    path = Path(exp.output)
    try:
        for candidate in (exp.dir, path, *path.absolute().parents):
            if candidate.exists() or candidate.is_symlink():
                if not candidate.is_dir():
                    key = "name" if candidate == exp.dir else "output"
                    raise ConfigError(f"{key}: {candidate} is a file, not a directory")
                if candidate == exp.dir:
                    _check_taken(exp.dir)
                break
        if any(len(os.fsencode(part)) > os.pathconf(candidate, "PC_NAME_MAX") for part in exp.dir.absolute().parts):
            raise ConfigError(f"output: cannot use {exp.dir} ({os.strerror(errno.ENAMETOOLONG)})")
    except OSError as exc:
        raise ConfigError(f"output: cannot use {exp.dir} ({exc.strerror or exc})") from None


SWEEP_FIRST = ("jobs", "optuna", "experiment.yaml")
"""What a sweep writes into the experiment's directory before its runs.csv: the sweep lock in jobs/, an Optuna
study's journal (`hpcrl.sweep.study.STUDY_DIR`) and experiment.yaml (`hpcrl.store.expdir.write_experiment`). A
first sweep whose submission failed leaves them in a directory it found (its rollback takes back files, not
directories it did not make), and a second sweep of the experiment at once finds them there: that one is refused
by the first one's lock, in its own words."""
RUN_ID = re.compile(r"[0-9a-f]{10}-s(-?\d+)")
"""A run's id, and its directory's name under runs/: its setting's hash, then its seed (`run_id` makes it)."""


def run_id(setting_hash: str, seed: int) -> str:
    """The id of the run of a setting (the first 10 hex digits of its hash) and a seed: what RUN_ID reads back."""
    return f"{setting_hash[:10]}-s{seed}"

ATOMIC_TEMP = re.compile(r"\..+\.tmp")
"""hpcrl.io's temporary file beside one it writes whole (`.experiment.yaml.1a2b.tmp`), there for a moment."""


def _runs_of_hpcrl(entry: os.DirEntry[str]) -> bool:
    """A runs/ folder that holds run directories only (RUN_ID): an experiment's whose runs.csv was lost (a sweep lists
    its runs again), or one whose run files were laid out ahead of its first sweep."""
    if entry.name != "runs" or not entry.is_dir(follow_symlinks=False):
        return False
    with os.scandir(entry.path) as runs:  # unreadable: `_check_output` says so in one line
        return all(RUN_ID.fullmatch(run.name) and run.is_dir(follow_symlinks=False) for run in runs)


def _check_taken(directory: Path) -> None:
    """The experiment's directory, where it exists, is empty (but for SWEEP_FIRST) or an experiment (a
    sweep again, which resubmits what is missing): a sweep writes its results/, runs/ and jobs/ there,
    over what a directory of the user's own holds. An experiment is a directory with a runs.csv, as
    `hpcrl.store.expdir.is_experiment` says (hpcrl.store is built on this room and cannot be imported here)."""
    if (directory / "runs.csv").exists():  # a sweep again: its runs/ (thousands of entries) needs no look
        return
    with os.scandir(directory) as entries:
        found = sorted(entry.name for entry in entries if entry.name not in SWEEP_FIRST and not ATOMIC_TEMP.fullmatch(entry.name) and not _runs_of_hpcrl(entry))
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ConfigError(f"name: {directory} exists and is not an hpcrl experiment (it holds {shown}): a sweep would write over it; pick another name or output")


def check_output_writable(exp: Experiment) -> None:
    """Before a sweep writes anything: a directory can be made where the experiment goes. `output`
    under /proc or /sys, on a read-only mount or in another user's directory fails here as one line,
    with nothing written, rather than as a traceback from the first mkdir (which left `jobs/` behind
    where it got that far). The probe is a directory made and removed in the nearest existing one;
    `hpcrl.api.load` and dry runs do not probe, so a config for a cluster still loads on a laptop."""
    place = next(p for p in (exp.dir, *exp.dir.absolute().parents) if p.is_dir())
    try:
        Path(tempfile.mkdtemp(prefix=".hpcrl-probe-", dir=place)).rmdir()
    except OSError as exc:
        where = f"{exp.source}: " if exp.source else ""
        raise ConfigError(f"{where}output: cannot create {exp.dir} ({place}: {exc.strerror or exc})") from None


def load_experiment(path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, name: str | None = None) -> Experiment:
    """Read, override and validate a config file. Raises ConfigError prefixed with the file name.

    `name` (from `--name`) is taken as the string it is, never read as YAML.
    """
    path = Path(path)
    data = read_yaml(path)
    try:
        if name is not None:
            data["name"] = name
        exp = experiment_from_dict(data, overrides)
        _check_output(exp)
    except ConfigError as exc:
        raise exc.within(f"{path}: ") from None
    exp.source = str(path)
    if exp.program is not None:  # jobs start elsewhere: the program's directory is fixed now, absolute
        exp.program.workdir = anchored_workdir(exp.program.workdir, Path.cwd())
    return exp


def apply_settings(exp: Experiment, settings: dict[str, Any], seed: int) -> Experiment:
    """The resolved config of one run: the experiment with one grid point applied (a mapping
    changes only the keys it names) and the `sweep.when` settings that point matches.

    It starts from the config as written (`given`), so a point that switches `algo` takes that
    algorithm's defaults for what the config left out, never the first algorithm's values."""
    data = copy.deepcopy(exp.given) if exp.given is not None else exp.to_dict()
    for key, value in [*settings.items(), *when_settings(exp.sweep.when, settings)]:
        _set_dotted(data, key, value, merge=True)
    data["sweep"] = {"seeds": [seed], "grid": {}}
    run = experiment_from_dict(data)
    run.source = exp.source
    if exp.program is not None and run.program is not None:
        run.program.workdir = exp.program.workdir  # resolved where `hpcrl sweep` ran
    return run
