"""YAML -> a typed, validated `Experiment`.

Every error is raised before anything is written or submitted, as one line naming the file and the
key path (`cartpole.yaml: train.lr: expected a number, got 'fast'`), because a typo discovered
after 500 jobs have queued costs a day.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from hpcrl.rl.hparams import ALGORITHMS, TrainConfig


class ConfigError(ValueError):
    """A config that must not reach a scheduler. The message is the whole story, on one line."""


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    backend: Literal["gymnasium", "vizdoom", "habitat"] = "gymnasium"
    num_envs: int = 8
    vectorization: Literal["auto", "sync", "async"] = "auto"
    """`auto`: sync for cheap envs (IPC dominates), async for simulators."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    frame_stack: int = 1
    normalize_obs: bool = False
    max_episode_steps: Optional[int] = None


@dataclass
class SweepConfig:
    seeds: list[int] = field(default_factory=lambda: [0])
    grid: dict[str, list[Any]] = field(default_factory=dict)
    """Dotted key -> values; the runs are the product of all lists times the seeds."""


_MEM = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)B?$", re.IGNORECASE)
_TIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})$")


def parse_mem_mb(text: str) -> int:
    """'4G' -> 4096. Slurm's and SGE's own suffixes, so a value reads the same in both templates."""
    m = _MEM.match(text.strip())
    if not m:
        raise ValueError(f"expected a memory size such as 4G or 500M, got {text!r}")
    factor = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return max(1, int(float(m.group(1)) * factor))


def parse_time_s(text: str) -> int:
    """'1-02:00:00' or '02:00:00' -> seconds."""
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError(f"expected a time limit as HH:MM:SS or D-HH:MM:SS, got {text!r}")
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    if minutes >= 60 or seconds >= 60:
        raise ValueError(f"expected minutes and seconds below 60, got {text!r}")
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_time(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@dataclass
class Resources:
    gpus: int = 0
    cpus: int = 1
    mem: str = "4G"
    time: str = "01:00:00"
    queue: Optional[str] = None
    """SGE queue (`-q`)."""
    partition: Optional[str] = None
    """Slurm partition (`--partition`)."""
    account: Optional[str] = None
    max_concurrent: Optional[int] = None
    """Cap on array tasks running at once (`%N` / `-tc N`); also the local pool size."""
    extra: list[str] = field(default_factory=list)
    """Raw directive lines appended as written, e.g. `--constraint=a100` or `-l h=node01`."""
    signal_seconds: int = 120
    """Seconds before the time limit at which the job is told to checkpoint and requeue."""
    sge_pe: str = "smp"
    sge_gpu_resource: str = "gpu"
    """Grid Engine complex that counts GPUs; it should be consumable per JOB, not per slot."""
    sge_mem_resource: Optional[str] = "mem_free"
    """Grid Engine memory request; h_vmem caps virtual memory, which CUDA processes exceed at once."""
    eval_time: str = "00:30:00"
    max_gpus_per_node: int = 16
    max_cpus_per_node: int = 1024

    def check(self) -> list[tuple[str, str]]:
        errors = []
        if self.gpus < 0 or self.gpus > self.max_gpus_per_node:
            errors.append(("gpus", f"expected 0..{self.max_gpus_per_node} GPUs per task, got {self.gpus}"))
        if self.cpus < 1 or self.cpus > self.max_cpus_per_node:
            errors.append(("cpus", f"expected 1..{self.max_cpus_per_node} CPUs per task, got {self.cpus}"))
        for key in ("mem",):
            try:
                parse_mem_mb(getattr(self, key))
            except ValueError as exc:
                errors.append((key, str(exc)))
        for key in ("time", "eval_time"):
            try:
                if parse_time_s(getattr(self, key)) <= 0:
                    errors.append((key, "expected a positive time limit"))
            except ValueError as exc:
                errors.append((key, str(exc)))
        for i, line in enumerate(self.extra):
            if "\n" in line or "\r" in line:
                errors.append((f"extra[{i}]", "a directive must be a single line"))
        if self.max_concurrent is not None and self.max_concurrent < 1:
            errors.append(("max_concurrent", "expected a positive integer"))
        if self.signal_seconds < 0:
            errors.append(("signal_seconds", "expected a non-negative integer"))
        else:
            try:
                if self.signal_seconds >= parse_time_s(self.time):
                    errors.append(("signal_seconds", f"must be shorter than the time limit {self.time}"))
            except ValueError:
                pass
        return errors


@dataclass
class ContainerConfig:
    image: Optional[str] = None
    """Path to a .sif image; jobs run the host's Python when it is empty."""
    runtime: Literal["singularity", "apptainer"] = "singularity"
    binds: list[str] = field(default_factory=list)
    home: Optional[str] = None
    nv: bool = True
    env: dict[str, str] = field(default_factory=dict)
    cleanenv: bool = False

    def check(self) -> list[tuple[str, str]]:
        return [
            (f"env.{key}", "expected an environment variable name (letters, digits, underscore)")
            for key in self.env
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)
        ]


@dataclass
class CudaConfig:
    lib_path: Optional[str] = None
    """Prepended to LD_LIBRARY_PATH in the job when it is not already there."""
    modules: list[str] = field(default_factory=list)


@dataclass
class EvalConfig:
    episodes: int = 10
    deterministic: bool = True
    threshold: Optional[float] = None
    """Skip evaluating runs whose final training return is below this."""
    video: bool = False
    video_episodes: int = 1
    gpus: int = 0

    def check(self) -> list[tuple[str, str]]:
        errors = []
        if self.episodes < 1:
            errors.append(("episodes", "expected a positive integer"))
        if self.video_episodes < 0:
            errors.append(("video_episodes", "expected a non-negative integer"))
        return errors


@dataclass
class ImageConfig:
    """The Singularity image the jobs run in (`hpcrl build-image`)."""

    base: str = "docker://nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"
    """`docker://IMAGE:TAG` (pin `@sha256:...` for a reproducible base), `library://` or `oras://` URIs,
    or the path of a local .sif (`Bootstrap: localimage`): a heavy base built rarely, with a thin layer on top."""
    os_packages: list[str] = field(default_factory=list)
    """Debian/Ubuntu packages, installed with apt: the base must be Debian or Ubuntu based."""
    python: str = "3.11"
    """Python of the image's conda environment (Miniforge), whatever Python the base ships."""
    torch: str = "torch==2.5.1"
    torch_index: Optional[str] = "https://download.pytorch.org/whl/cu124"
    """The index that holds the torch build for the base's CUDA (cu124 for CUDA 12.4); null for PyPI."""
    pip: list[str] = field(default_factory=list)
    extras: list[Literal["vizdoom", "habitat", "distributed", "video"]] = field(default_factory=list)
    habitat_channel: str = "aihabitat-nightly"
    """Conda channel of habitat-sim: the stable `aihabitat` channel has Linux builds for Python 3.9 only,
    older than hpcrl supports."""
    habitat_version: Optional[str] = None
    """Pin habitat-sim (conda version spec, e.g. `0.3.3`); the newest build in the channel otherwise."""
    hpcrl_source: Optional[str] = None
    """Source checkout or wheel of hpcrl copied into the image through `%files`; by default the
    checkout this hpcrl runs from."""
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    output_dir: str = "images"
    cachedir: Optional[str] = None
    """APPTAINER_CACHEDIR of the build (default `~/.apptainer/cache`, a quota trap); `$VARS` expand
    where the build runs, so `--submit` can use the node's scratch."""
    tmpdir: Optional[str] = None
    """APPTAINER_TMPDIR: holds the whole unpacked image, so local disk, not Lustre/NFS."""
    template: str = "hpcrl.def.j2"
    """Template name, looked up in ./singularity/ first, then in hpcrl's bundled singularity/."""
    build_time: str = "02:00:00"
    build_mem: str = "8G"
    """Limits of the `--submit` build job: a build takes longer, and more memory, than many training tasks."""

    _REMOTE = ("docker", "library", "oras", "shub")

    def bootstrap(self) -> tuple[str, str]:
        """(`Bootstrap:` agent, `From:` value) of the base; ValueError says what a base may be."""
        scheme, sep, rest = self.base.partition("://")
        if sep and scheme in self._REMOTE and rest.strip() and not any(c.isspace() for c in rest):
            return scheme, rest
        if not sep and self.base.endswith(".sif") and not self._multiline(self.base):
            return "localimage", self.base
        raise ValueError(
            "expected docker://IMAGE:TAG, library://..., oras://..., shub://... or the path of a local .sif, "
            f"got {self.base!r}"
        )

    def check(self) -> list[tuple[str, str]]:
        """Values end up in a definition file, where a newline would start a section or a header."""
        errors = []
        try:
            self.bootstrap()
        except ValueError as exc:
            errors.append(("base", str(exc)))
        if not re.fullmatch(r"3\.\d+(\.\d+)?", self.python):
            errors.append(("python", f"expected a Python version such as 3.11, got {self.python!r}"))
        for i, name in enumerate(self.os_packages):
            if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]*(:[a-z0-9]+)?(=[A-Za-z0-9.+~:-]+)?", name):
                errors.append((f"os_packages[{i}]", f"expected a Debian package name (optionally =version), got {name!r}"))
        for i, req in enumerate(self.pip):
            if not req.strip() or req.lstrip().startswith("-") or self._multiline(req):
                errors.append((f"pip[{i}]", f"expected one requirement such as numpy>=1.26 (no pip options), got {req!r}"))
        if not self.torch.strip() or self.torch.lstrip().startswith("-") or self._multiline(self.torch):
            errors.append(("torch", f"expected a requirement such as torch==2.5.1, got {self.torch!r}"))
        for key, value in self.env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                errors.append((f"env.{key}", "expected an environment variable name (letters, digits, underscore)"))
            elif self._multiline(value):
                errors.append((f"env.{key}", "expected a single line"))
        for key, value in self.labels.items():
            if not re.fullmatch(r"[^\s=#]+", key):
                errors.append((f"labels.{key}", "expected a label name without spaces, '=' or '#'"))
            elif self._multiline(value):
                errors.append((f"labels.{key}", "expected a single line"))
        for key, parse in (("build_time", parse_time_s), ("build_mem", parse_mem_mb)):
            try:
                parse(getattr(self, key))
            except ValueError as exc:
                errors.append((key, str(exc)))
        for key in ("torch_index", "habitat_channel", "habitat_version", "hpcrl_source", "output_dir", "cachedir", "tmpdir", "template"):
            value = getattr(self, key)
            if value is not None and (self._multiline(value) or not value.strip()):
                errors.append((key, "expected a non-empty single line"))
        return errors

    @staticmethod
    def _multiline(text: str) -> bool:
        return "\n" in text or "\r" in text


@dataclass
class RedisConfig:
    """Where the run's board and queue live."""

    address: Optional[str] = None
    """`host:port` of an external Redis shared by the runs; empty: each learner job starts its own
    redis-server (the Debian package; `hpcrl build-image` installs it with image.extras: [distributed])."""
    password_env: str = "HPCRL_REDIS_PASSWORD"
    """Environment variable of the learner job that holds the external Redis's password (never the config file)."""
    bind: str = "auto"
    """Address the learner's own redis-server listens on; `auto`: the address the learner node's host name
    resolves to (what actors on other nodes dial); `127.0.0.1` keeps it to one machine."""
    executable: str = "redis-server"

    def check(self) -> list[tuple[str, str]]:
        errors = []
        if self.address is not None:
            host, sep, port = self.address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                errors.append(("address", f"expected host:port, got {self.address!r}"))
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.password_env):
            errors.append(("password_env", "expected an environment variable name (letters, digits, underscore)"))
        if not self.bind.strip() or any(c.isspace() for c in self.bind):
            errors.append(("bind", f"expected an address or 'auto', got {self.bind!r}"))
        return errors


@dataclass
class DistributedConfig:
    """Ape-X style: per run, one learner job and an array of actor jobs talking through Redis.

    Only off-policy learning is correct when actors act with parameters a few versions old, so
    this section requires `algo: dqn` (the learner keeps DQN's replay; train.* still applies).
    """

    actors: int = 2
    envs_per_actor: int = 4
    batch_transitions: int = 64
    """Transitions per message an actor sends (rounded up to whole vector steps)."""
    queue_bound: int = 8
    """Batches the queue may hold; a full queue blocks the actors (backpressure) instead of dropping.
    Small on purpose: a batch waits in a full queue for queue_bound x batch_transitions x updates per
    transition / publish_every parameter versions, which must stay below max_lag."""
    publish_every: int = 20
    """Learner updates between parameter publications; each publication is a new parameter version."""
    max_lag: int = 25
    """Batches produced with parameters more than this many versions old are dropped (and counted)."""
    epsilon: float = 0.4
    epsilon_alpha: float = 7.0
    """Env slot k of K acts with epsilon ** (1 + alpha * k / (K - 1)) (Ape-X's per-actor exploration)."""
    prioritized: bool = False
    """Prioritised replay on the learner (proportional, with importance weights)."""
    priority_alpha: float = 0.6
    priority_beta: float = 0.4
    """Initial importance-sampling exponent, annealed to 1 over total_steps."""
    heartbeat_s: float = 1.0
    dead_after_s: float = 3.0
    """An actor whose heartbeat is older than this is reported dead (its key expires)."""
    learner_timeout_s: float = 600.0
    """Actors wait this long for a learner (at start, or after it went away) before exiting with code 75."""
    parallel_runs: Optional[int] = None
    """Runs whose learner and actors run at once; later runs wait for the earlier learners. Default: all on
    a cluster; on the local executor, as many as its task pool (resources.max_concurrent) holds."""
    actor_cpus: int = 1
    actor_mem: str = "2G"
    redis: RedisConfig = field(default_factory=RedisConfig)

    def check(self) -> list[tuple[str, str]]:
        errors = []
        for key in ("actors", "envs_per_actor", "batch_transitions", "queue_bound", "publish_every", "actor_cpus"):
            if getattr(self, key) < 1:
                errors.append((key, "expected a positive integer"))
        if self.max_lag < 0:
            errors.append(("max_lag", "expected a non-negative integer"))
        if not 0 < self.epsilon <= 1:
            errors.append(("epsilon", "expected a number in (0, 1]"))
        if self.epsilon_alpha < 0:
            errors.append(("epsilon_alpha", "expected a non-negative number"))
        if self.priority_alpha < 0 or not 0 <= self.priority_beta <= 1:
            errors.append(("priority_beta" if self.priority_alpha >= 0 else "priority_alpha", "expected alpha >= 0 and beta in [0, 1]"))
        if self.heartbeat_s <= 0:
            errors.append(("heartbeat_s", "expected a positive number"))
        if self.dead_after_s <= self.heartbeat_s:
            errors.append(("dead_after_s", f"must be longer than heartbeat_s ({self.heartbeat_s:g})"))
        if self.learner_timeout_s <= 0:
            errors.append(("learner_timeout_s", "expected a positive number"))
        if self.parallel_runs is not None and self.parallel_runs < 1:
            errors.append(("parallel_runs", "expected a positive integer"))
        try:
            parse_mem_mb(self.actor_mem)
        except ValueError as exc:
            errors.append(("actor_mem", str(exc)))
        return errors


@dataclass
class Experiment:
    name: str
    algo: Literal["ppo", "a2c", "dqn"] = "ppo"
    env: EnvConfig = field(default_factory=EnvConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    resources: Resources = field(default_factory=Resources)
    container: ContainerConfig = field(default_factory=ContainerConfig)
    cuda: CudaConfig = field(default_factory=CudaConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    image: Optional[ImageConfig] = None
    output: str = "logs"
    """Root under which `<output>/<name>/` is created."""
    python: Optional[str] = None
    """Interpreter the job scripts run when no image is set; defaults to the one running `hpcrl sweep`."""
    distributed: Optional[DistributedConfig] = None
    """Decoupled learner and actor jobs (Ape-X style) instead of one train job per run."""
    source: Optional[str] = field(default=None, metadata={"internal": True})

    @property
    def dir(self) -> Path:
        return Path(self.output) / self.name

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        return data

    def check(self) -> list[tuple[str, str]]:
        if self.distributed is not None and self.algo != "dqn":
            return [("distributed", f"needs algo 'dqn' (Ape-X): {self.algo!r} is on-policy and hpcrl has no off-policy correction (V-trace) for stale actor parameters")]
        return []


# --------------------------------------------------------------------------------------------
# Validation: a small, strict converter from plain YAML data to the dataclasses above.


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is Any:
        return "any value"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    return str(tp)


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        candidates = [a for a in args if a is not type(None)]
        errors = []
        for cand in candidates:
            try:
                return _convert(value, cand, path)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(f"{path}: expected {_describe(tp)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: expected {_describe(tp)}, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
                return int(value)  # 1e5 in YAML is a float; users mean an integer
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            try:  # YAML 1.1 reads 3e-4 (no dot) as a string
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return str(value)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [_convert(v, args[0], f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return {_convert(k, args[0], f"{path}"): _convert(v, args[1], f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    raise TypeError(f"unsupported type {tp!r} at {path}")  # a bug in the schema, not in the config


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """Field types of a config class (resolving them is the costly part of validating 1000 run configs)."""
    return typing.get_type_hints(cls)


def _public_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}


def _build(cls: type, data: Any, path: str) -> Any:
    prefix = f"{path}." if path else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'top level'}: expected a mapping, got {data!r}")
    fields_ = _public_fields(cls)
    hints = _hints(cls)
    for key in data:
        if key not in fields_:
            raise ConfigError(f"{prefix}{key}: unknown key (expected one of: {', '.join(sorted(fields_))})")
    kwargs = {}
    for name, f in fields_.items():
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], f"{prefix}{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{prefix}{name}: required key is missing")
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        for key, message in check():
            raise ConfigError(f"{prefix}{key}: {message}")
    return obj


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part} is not a mapping")
        node = child
    node[parts[-1]] = value


def _known_path(dotted: str, algo: str) -> bool:
    """Whether a dotted key names a field of the schema (so `-p` and the grid fail on typos)."""
    cls: Any = Experiment
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if cls is None or not dataclasses.is_dataclass(cls):
            # Inside a free-form mapping (env.kwargs, container.env): any key is allowed.
            return cls is dict
        fields_ = _public_fields(cls)
        if part not in fields_:
            return False
        tp = ALGORITHMS[algo] if (cls is Experiment and part == "train") else typing.get_type_hints(cls)[part]
        if typing.get_origin(tp) in (Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if typing.get_origin(tp) is dict:
            return True
        cls = tp if dataclasses.is_dataclass(tp) else (None if i < len(parts) - 1 else tp)
    return True


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=3e-4` -> ('train.lr', 0.0003): the value is read as YAML, then typed by the schema."""
    if "=" not in text:
        raise ConfigError(f"-p {text}: expected key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"-p {text}: expected key.path=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {where}malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def experiment_from_dict(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Validate plain data (with `-p` overrides applied) into an Experiment."""
    data = copy.deepcopy(data)
    algo = data.get("algo", "ppo")
    if algo not in ALGORITHMS:
        raise ConfigError(f"algo: expected one of {', '.join(map(repr, ALGORITHMS))}, got {algo!r}")
    for text in overrides:
        key, value = parse_override(text)
        if key == "algo":
            algo = value
        elif not _known_path(key, algo if algo in ALGORITHMS else "ppo"):
            raise ConfigError(f"-p {key}: unknown key")
        _set_dotted(data, key, value)
    if data.get("algo", "ppo") not in ALGORITHMS:
        raise ConfigError(f"algo: expected one of {', '.join(map(repr, ALGORITHMS))}, got {data.get('algo')!r}")
    algo = data.get("algo", "ppo")
    train_data = data.pop("train", {}) or {}
    image_data = data.pop("image", None)
    exp = _build(Experiment, data, "")
    exp.train = _build(ALGORITHMS[algo], train_data, "train")
    exp.image = None if image_data is None else _build(ImageConfig, image_data, "image")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", exp.name):
        raise ConfigError(f"name: expected letters, digits, '.', '_' or '-' (it names a directory), got {exp.name!r}")
    for key, values in exp.sweep.grid.items():
        if not _known_path(key, algo):
            raise ConfigError(f"sweep.grid.{key}: unknown key")
        if key in ("name", "algo", "output") or key.startswith("sweep."):
            raise ConfigError(f"sweep.grid.{key}: cannot be swept")
        if not values:
            raise ConfigError(f"sweep.grid.{key}: expected a non-empty list of values")
        for value in values:  # every grid point must validate on its own, before anything is written
            point = copy.deepcopy(data)
            point["train"] = copy.deepcopy(train_data)
            _set_dotted(point, key, value)
            try:
                _build(ALGORITHMS[algo], point.pop("train"), "train")
                _build(Experiment, point, "")
            except ConfigError as exc:
                raise ConfigError(f"sweep.grid.{key}={value!r}: {exc}") from None
    if not exp.sweep.seeds:
        raise ConfigError("sweep.seeds: expected at least one seed")
    if len(set(exp.sweep.seeds)) != len(exp.sweep.seeds):
        raise ConfigError("sweep.seeds: seeds repeat")
    if exp.env.num_envs < 1:
        raise ConfigError("env.num_envs: expected a positive integer")
    if exp.env.frame_stack < 1:
        raise ConfigError("env.frame_stack: expected a positive integer")
    return exp


def load_experiment(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Read, override and validate a config file. Raises ConfigError prefixed with the file name."""
    path = Path(path)
    data = read_yaml(path)
    try:
        exp = experiment_from_dict(data, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    exp.source = str(path)
    return exp


def apply_settings(exp: Experiment, settings: dict[str, Any], seed: int) -> Experiment:
    """The resolved config of one run: the experiment with one grid point applied."""
    data = exp.to_dict()
    for key, value in settings.items():
        _set_dotted(data, key, value)
    data["sweep"] = {"seeds": [seed], "grid": {}}
    run = experiment_from_dict(data)
    run.source = exp.source
    return run
