"""The typed `Experiment`: the sections of a config, joined, with the rules that need the whole config.

Every error is raised before anything is written or submitted, as one line naming the file and the
key path (`cartpole.yaml: train.lr: expected a number, got 'fast'`), because a typo discovered
after 500 jobs have queued costs a day. Each field declares its own rules (`hpcrl.config.schema.setting`);
the `check()` methods hold only rules that join several fields, and `Experiment.request_problems` those of
what a job asks of a cluster.

The sections a config shares with other parts of hpcrl have modules of their own (`sweep_spec`,
`resources_spec`, `container_spec`, `distributed_spec`, `program_spec`, `hparams` for `train:`);
this one holds the `Experiment` that joins them, `env:`, `eval:`, `tracking:` and `results:`.
A file becomes one in `hpcrl.config.load`, through the modules beside this one, each built on the one
before: `key_paths` (what a dotted key names: known, learned, sweepable), `build` (plain data into these
dataclasses), `sweep_rules` (what a sweep may vary, and every grid point valid); `dotted` (dotted keys and
`-p` overrides on plain data) and `output_dir` (where a sweep writes) need none of them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from hpcrl.config.container_spec import ContainerConfig, CudaConfig, ImageConfig
from hpcrl.config.distributed_spec import DistributedConfig
from hpcrl.config.hparams import DQNConfig, OnPolicyConfig, PPOConfig, TrainConfig, minibatch_problem
from hpcrl.config.limits import MAX_ENVS
from hpcrl.config.program_spec import ProgramConfig
from hpcrl.config.resources_spec import Resources, parse_mem_mb
from hpcrl.config.schema import no_spaces_problem, non_empty_problem, setting
from hpcrl.config.sweep_spec import SweepConfig

MAX_NAME = 200
"""Bytes of an experiment name: a directory name may have 255, and job names and job logs add
suffixes such as `-aggregate`."""


MAX_ROLLOUT = 1_000_000
"""Transitions of one on-policy rollout (train.num_steps x env.num_envs), held in memory at once."""


NETWORK_KEYS = ("train.hidden_sizes", "train.recurrent_size", "train.network")
"""The keys that size a network (`Experiment._network_memory_problem`): a grid joins them
(`hpcrl.config.sweep_rules.JOINED_KEYS`), a search checks each value it can draw."""


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
        """Rules for a new request (a sweep, a run it makes, a trial), not for a config on disk (`hpcrl.config.build.stored_configs`):
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


PROGRAM_UNUSED = ("env", "train")
"""Sections of hpcrl's own trainer that a user's program never sees: refused with algo: program."""
