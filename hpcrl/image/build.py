"""`hpcrl build-image`: the config's `image:` section -> a checked definition -> a cached SIF.

The image is named by a content hash of its definition and of every host file the build copies
in, because Apptainer has no layer cache: each build reruns all of `%post` (tens of minutes), so
the only cheap build is the one that is skipped. A definition, rendered from our template or
imported from a Dockerfile, goes through `hpcrl.image.defcheck` before anything is written or built,
since Apptainer reports its own parse errors only once a build (often a queued batch job) starts.

spython is used only where it is sound, to import a Dockerfile; its def->def round trip and its
runtime client (which always runs `singularity`, with sudo) are not (see notes/containers.md).

The command itself, which builds here or submits a build job, is `hpcrl.submit.image_job`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

import jinja2

import hpcrl
from hpcrl import templates
from hpcrl.config.container_spec import ImageConfig
from hpcrl.config.experiment import Experiment
from hpcrl.config.schema import ConfigError
from hpcrl.image.defcheck import check_def, files_entries
from hpcrl.io import NotRegularFile, TooLarge, atomic_write_text, read_regular

RUNTIMES = ("apptainer", "singularity")
PREFIX = "/opt/hpcrl/env"
"""The image's conda environment (see singularity/hpcrl.def.j2)."""
SOURCE_DST = "/opt/hpcrl/src"
"""Where %files puts hpcrl's source or wheel; %post installs it from there, then removes it."""
BASE_APT = ("ca-certificates", "curl")
EXTRA_APT = {"distributed": ("redis-server",), "habitat": ("libegl1", "libgl1", "libglib2.0-0")}
"""OS packages an extra needs besides its Python packages (headless habitat-sim renders through EGL)."""
EXTRA_IMPORTS = {"vizdoom": "vizdoom", "habitat": "habitat_sim", "tensorboard": "tensorboard"}

JUNK_DIRS = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".nox", ".venv", "venv", "node_modules", ".ipynb_checkpoints"}
)
JUNK_SUFFIXES = (".pyc", ".pyo", ".sif", ".egg-info")
NOT_PACKAGED = frozenset({"tests", "benchmarks", ".benchmarks", "docs", "scripts", ".ci", ".github", "logs", "images", "build", "dist"})
"""Top-level directories of an hpcrl checkout that the wheel does not contain: editing a test must
not rebuild a multi-gigabyte image, and experiment logs or built images must not end up inside one."""


@dataclass
class Definition:
    """A definition file and where the host files it copies come from."""

    text: str
    origin: str
    """What it was made from, for messages: 'the definition rendered from <template>' or 'imported from'."""
    context: Path | None
    """Directory the build runs in (relative %files sources resolve there); None: a staging directory."""
    staged: dict[str, Path] = field(default_factory=dict)
    """Name in the staging directory -> host file or directory copied there before the build."""
    base_image: Path | None = None
    """The local SIF of `Bootstrap: localimage`: an input like any copied file."""


@dataclass
class Plan:
    """A checked definition and the image its content hash names."""

    definition: Definition
    image: Path
    digest: str


# --------------------------------------------------------------------------------------------
# Rendering and importing definitions.


def hpcrl_source(cfg: ImageConfig) -> Path:
    """The checkout or wheel copied into the image; by default the checkout this hpcrl runs from."""
    if cfg.hpcrl_source is not None:
        path = Path(cfg.hpcrl_source).expanduser().resolve()
        if path.is_file() and path.suffix == ".whl":
            if not re.fullmatch(r"[A-Za-z0-9_.+!-]+\.whl", path.name):
                raise ConfigError(f"image.hpcrl_source: {path.name!r} is not a wheel file name")
            return path
        if path.is_dir() and (path / "pyproject.toml").is_file():
            return path
        raise ConfigError(f"image.hpcrl_source: expected an hpcrl checkout (with pyproject.toml) or a .whl file, got {cfg.hpcrl_source!r}")
    checkout = templates.PACKAGE_DIR.parent
    if (checkout / "pyproject.toml").is_file() and re.search(r'(?m)^name\s*=\s*"hpcrl"', (checkout / "pyproject.toml").read_text()):
        return checkout
    raise ConfigError("image.hpcrl_source: this hpcrl is installed without its source; set it to an hpcrl checkout or wheel")


def template_context(cfg: ImageConfig, source: Path) -> dict:
    """What singularity/hpcrl.def.j2 may use. The %files paths are hpcrl's own names, never config text."""
    agent, base_from = cfg.bootstrap()
    if agent == "localimage":
        base_from = str(Path(base_from).expanduser().resolve())  # the build runs in a staging directory
    staged_name = source.name if source.is_file() else "hpcrl-src"
    extras = sorted(set(cfg.extras))
    target = f"{SOURCE_DST}/{staged_name}" if source.is_file() else SOURCE_DST
    return {
        "hpcrl_version": hpcrl.__version__,
        "bootstrap": agent,
        "base_from": base_from,
        "image": dataclasses.asdict(cfg),
        "apt_packages": list(dict.fromkeys([*BASE_APT, *(p for e in extras for p in EXTRA_APT.get(e, ())), *cfg.os_packages])),
        "prefix": PREFIX,
        "hpcrl_files": {"src": staged_name, "dst": target},
        "hpcrl_requirement": target + (f"[{','.join(extras)}]" if extras else ""),
        "habitat": "habitat" in extras,
        "habitat_spec": "habitat-sim" + (f"={cfg.habitat_version}" if cfg.habitat_version else ""),
        "imports": ["torch", "gymnasium", "hpcrl", *(EXTRA_IMPORTS[e] for e in extras if e in EXTRA_IMPORTS)],
    }


def render_definition(exp: Experiment) -> Definition:
    """The config's definition, from the user's ./singularity/ template if there is one, else hpcrl's."""
    cfg = _image_config(exp)
    source = hpcrl_source(cfg)
    context = template_context(cfg, source)
    base = Path(context["base_from"]) if context["bootstrap"] == "localimage" else None
    if base is not None and not base.is_file():
        raise ConfigError(f"image.base: {base} does not exist")
    env = templates.environment("singularity")
    try:
        template = env.get_template(cfg.template)
        text = template.render(**context)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"image.template: cannot render {cfg.template!r}: {type(exc).__name__}: {exc}") from None
    origin = f"the definition rendered from {template.filename}"
    return Definition(text, origin, None, {context["hpcrl_files"]["src"]: source}, base)


def _image_config(exp: Experiment) -> ImageConfig:
    """The image section, with the extras the config needs whether or not it lists them: a user's
    program whose metrics are TensorBoard files is read by the eval stage, inside the image."""
    if exp.image is None:
        raise ConfigError(f"{exp.source or 'config'}: image: the config has no image section to build")
    program = exp.program
    sources = [program.metrics.source, *([program.eval.metrics.source] if program.eval else [])] if program else []
    if "tensorboard" in sources and "tensorboard" not in exp.image.extras:
        return dataclasses.replace(exp.image, extras=[*exp.image.extras, "tensorboard"])
    return exp.image


@contextlib.contextmanager
def _quiet_spython() -> Iterator[io.StringIO]:
    """spython's logger prints to the streams it saw at import; keep its chatter for our error messages."""
    from spython.logger import bot

    saved = bot.errorStream, bot.outputStream
    buffer = io.StringIO()
    bot.errorStream = bot.outputStream = buffer
    try:
        yield buffer
    finally:
        bot.errorStream, bot.outputStream = saved


def _refuse_unnamed_stages(path: Path, text: str) -> None:
    """spython merges a stage without `AS name` into the stage before it (its base silently replaced)."""
    froms = [(n, line) for n, line in enumerate(text.splitlines(), 1) if re.match(r"\s*FROM\s", line, re.IGNORECASE)]
    for n, line in froms[1:]:
        if not re.search(r"\sAS\s+\S+\s*$", line, re.IGNORECASE):
            raise ConfigError(f"{path}: line {n}: a later stage needs a name ('FROM image AS name') for the import to keep it a separate stage")


def _repair(recipes: dict) -> list[str]:
    """Fix what spython's writer gets wrong for a Dockerfile; return what was dropped, as warnings."""
    warnings = []
    for stage, recipe in recipes.items():
        recipe.fromHeader = (recipe.fromHeader or "").strip() or None
        users = [line for line in recipe.install if re.match(r"USER\s", line)]
        recipe.install = [line for line in recipe.install if line not in users]
        warnings += [f"stage {stage}: {line.strip()} dropped: Apptainer runs as the calling user" for line in users]
        if recipe.test is not None:
            warnings.append(f"stage {stage}: HEALTHCHECK dropped: it has no build-time equivalent")
            recipe.test = None
        recipe.labels = [[f"{key} {value}"] for pair in recipe.labels for key, value in _docker_labels(" ".join(pair))]
    last = list(recipes.values())[-1]
    if last.entrypoint is None and last.cmd is not None:  # CMD alone is the command, not bash's argument
        last.entrypoint, last.cmd = last.cmd, None
    return warnings


def _docker_labels(text: str) -> list[tuple[str, str]]:
    """`LABEL a="x y" b=2` or the legacy `LABEL key value` -> [(name, value)]."""
    words = shlex.split(text)
    if words and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]
    return [(key, value) for key, _, value in (word.partition("=") for word in words)]


MAX_DOCKERFILE_BYTES = 2**20
"""The largest Dockerfile imported: one is a few kB; a larger file given by mistake is refused, not read whole."""


def import_dockerfile(path: Path) -> tuple[Definition, list[str]]:
    """A Dockerfile -> a definition (spython's parser and writer, repaired); warnings say what was lost."""
    try:
        from spython.main.parse.parsers import DockerParser
        from spython.main.parse.writers import SingularityWriter
    except ImportError:
        raise ConfigError("--from-dockerfile needs spython: pip install 'hpcrl[image]'") from None
    path = path.resolve()
    try:
        raw = read_regular(path, MAX_DOCKERFILE_BYTES)
    except NotRegularFile as exc:
        if exc.is_dir:
            raise ConfigError(f"{path}: a directory; --from-dockerfile takes the Dockerfile itself ({path / 'Dockerfile'}?)") from None
        raise ConfigError(f"{path}: {exc.kind}, not a Dockerfile; --from-dockerfile takes the Dockerfile itself") from None
    except TooLarge:
        raise ConfigError(f"{path}: larger than a Dockerfile can be ({MAX_DOCKERFILE_BYTES // 2**20} MB): --from-dockerfile takes the Dockerfile itself") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such Dockerfile") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the Dockerfile: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a Dockerfile (not UTF-8 text: byte {exc.start} is {exc.object[exc.start:exc.start + 1]!r})") from None
    _refuse_unnamed_stages(path, text)
    with _quiet_spython() as chatter:
        try:
            recipes = DockerParser(str(path)).recipe
            warnings = _repair(recipes)
            text = SingularityWriter(recipes).convert()
        except (SystemExit, Exception):  # spython exits, or raises, on what it cannot parse
            said = chatter.getvalue().strip().splitlines()
            raise ConfigError(f"{path}: spython cannot convert it: {said[-1] if said else 'no FROM?'}") from None
    return Definition(text + "\n", f"the definition imported from {path}", path.parent), warnings


# --------------------------------------------------------------------------------------------
# Checking and hashing.


class DefinitionRefused(ConfigError):
    """The checker found problems; the definition travels along so that --dry-run can still show it."""

    def __init__(self, definition: Definition, message: str) -> None:
        super().__init__(message)
        self.definition = definition


def check_definition(definition: Definition) -> None:
    """Refuse a definition with any grammar problem, naming every line at fault, before anything is written."""
    problems = check_def(definition.text)
    if problems:
        listed = "; ".join(str(p) for p in problems)
        raise DefinitionRefused(definition, f"{definition.origin} is refused (see it with --dry-run): {listed}")


def _junk(name: str) -> bool:
    return name in JUNK_DIRS or name.endswith(JUNK_SUFFIXES)


def tree_files(root: Path, skip_top: frozenset[str] = frozenset()) -> list[PurePosixPath]:
    """Files under root that matter, sorted: what a tree's hash covers and what staging copies."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not _junk(d) and not (rel == Path(".") and d in skip_top))
        found += [PurePosixPath(rel.as_posix(), f) for f in filenames if not _junk(f) and (root / rel / f).is_file()]
    return sorted(found)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def path_digest(path: Path, skip_top: frozenset[str] = frozenset()) -> str:
    """A file's sha256, or a tree's: the sorted (relative path, file sha256) pairs of what matters."""
    if path.is_file():
        return _file_digest(path)
    digest = hashlib.sha256()
    for rel in tree_files(path, skip_top):
        digest.update(f"{rel}\0{_file_digest(path / rel)}\n".encode())
    return digest.hexdigest()


def host_inputs(definition: Definition) -> list[tuple[str, Path]]:
    """(name, host path) of everything a build reads from the host, each checked to exist."""
    inputs = [("From", definition.base_image)] if definition.base_image else []
    for entry in files_entries(definition.text):
        if entry.stage is not None:
            continue
        if entry.src in definition.staged:
            inputs.append((entry.src, definition.staged[entry.src]))
            continue
        if definition.context is None and not entry.src.startswith("/"):
            raise ConfigError(f"{definition.origin}: line {entry.line}: %files source {entry.src!r} must be absolute (the build runs in a staging directory)")
        base = definition.context or Path("/")
        matches = sorted(glob.glob(str(base / entry.src)))
        if not matches:
            where = f" under {base}" if definition.context else ""
            raise ConfigError(f"{definition.origin}: line {entry.line}: %files source {entry.src!r} does not exist{where}")
        inputs += [(os.path.relpath(m, base) if definition.context else m, Path(m)) for m in matches]
    return inputs


def _skip_for(definition: Definition, path: Path) -> frozenset[str]:
    return NOT_PACKAGED if path in definition.staged.values() and path.is_dir() else frozenset()


def content_digest(definition: Definition, inputs: list[tuple[str, Path]]) -> str:
    """sha256 of the definition text and of every host input: equal digests, equal images."""
    digest = hashlib.sha256(b"hpcrl-image-1\0" + definition.text.encode())
    for name, path in sorted(inputs, key=lambda item: item[0]):
        digest.update(f"\0{name}\0{path_digest(path, _skip_for(definition, path))}".encode())
    return digest.hexdigest()


def plan(exp: Experiment, *, sandbox: bool = False, from_dockerfile: str | None = None) -> tuple[Plan, list[str]]:
    """Definition, checked; its inputs, hashed; the image path that names them. Writes nothing."""
    cfg = exp.image or ImageConfig()  # a Dockerfile import needs only the output settings
    if from_dockerfile:
        definition, warnings = import_dockerfile(Path(from_dockerfile))
    else:
        definition, warnings = render_definition(exp), []
    check_definition(definition)
    digest = content_digest(definition, host_inputs(definition))
    stem = f"{exp.name}-{digest[:12]}"
    output_dir = Path(cfg.output_dir).expanduser().resolve()
    return Plan(definition, output_dir / (stem if sandbox else f"{stem}.sif"), digest), warnings


def image_path_for(exp: Experiment) -> Path:
    """The SIF `hpcrl build-image` would build for this experiment (to suggest it when one is missing)."""
    return plan(exp)[0].image


# --------------------------------------------------------------------------------------------
# Building.


def resolve_runtime() -> str:
    """`apptainer`, else `singularity`, from PATH: the binary builds the image as the calling user, never via sudo."""
    for name in RUNTIMES:
        path = shutil.which(name)
        if path:
            return path
    raise ConfigError(
        "neither apptainer nor singularity is on PATH, so the image cannot be built here; build on a machine "
        "with Apptainer, or add --submit to build it in a batch job on a cluster node"
    )


def _expand_dir(value: str, key: str) -> str:
    expanded = os.path.expanduser(os.path.expandvars(value))
    if "$" in expanded:
        raise ConfigError(f"image.{key}: {value!r} names an environment variable that is not set here")
    return str(Path(expanded).resolve())


def runtime_env(cfg: ImageConfig) -> dict[str, str]:
    """The build's environment: the cache and temporary directories where the config puts them.

    Both spellings are set: Apptainer reads SINGULARITY_* only when the APPTAINER_* form is unset,
    and SingularityCE reads only SINGULARITY_*.
    """
    env = dict(os.environ)
    for key, value in (("cachedir", cfg.cachedir), ("tmpdir", cfg.tmpdir)):
        if value:
            env[f"APPTAINER_{key.upper()}"] = env[f"SINGULARITY_{key.upper()}"] = _expand_dir(value, key)
    return env


def build_argv(runtime: str, target: Path, def_path: Path, *, sandbox: bool) -> list[str]:
    """Unprivileged builds need --fakeroot (a root-mapped user namespace); root builds must not use it."""
    flags = (["--fakeroot"] if os.geteuid() != 0 else []) + (["--sandbox"] if sandbox else [])
    return [runtime, "build", *flags, str(target), str(def_path)]


def _stage(definition: Definition, into: Path) -> None:
    """Copy the staged inputs, junk left out, so the image holds exactly what its hash covers."""
    for name, path in definition.staged.items():
        if path.is_file():
            shutil.copy2(path, into / name)
            continue
        for rel in tree_files(path, _skip_for(definition, path)):
            (into / name / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path / rel, into / name / rel)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def build(p: Plan, cfg: ImageConfig, runtime: str, *, sandbox: bool, out: IO[str]) -> int:
    """Run the runtime once, into a temporary name, so that a failed or killed build never looks cached."""
    env = runtime_env(cfg)
    for key in ("APPTAINER_CACHEDIR", "APPTAINER_TMPDIR"):
        if key in env:
            Path(env[key]).mkdir(parents=True, exist_ok=True)
    p.image.parent.mkdir(parents=True, exist_ok=True)
    def_path = p.image.parent / f"{p.image.name.removesuffix('.sif')}.def"
    atomic_write_text(def_path, p.definition.text)
    partial = p.image.parent / f".{p.image.name}.partial-{os.getpid()}"
    argv = build_argv(runtime, partial, def_path, sandbox=sandbox)
    print(f"building {p.image}: {' '.join(argv)}", file=out, flush=True)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix=".context-", dir=p.image.parent) as staging:
            _stage(p.definition, Path(staging))
            rc = subprocess.run(argv, cwd=p.definition.context or staging, env=env, stdin=subprocess.DEVNULL).returncode
        built = rc == 0 and partial.exists()
        if built:
            _remove(p.image)  # --force: the old image goes only once the new one exists
            os.replace(partial, p.image)
    finally:
        _remove(partial)  # what a failed or interrupted build left
    if not built:
        reason = f"exited {rc}" if rc else "exited 0 but wrote no image"
        print(f"hpcrl: error: {Path(runtime).name} build {reason}; no image was written", file=sys.stderr)
        return rc or 1
    print(f"built {p.image} in {time.monotonic() - started:.0f} s (definition {def_path})", file=out)
    return 0
