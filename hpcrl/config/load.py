"""A config file -> a validated `Experiment`, and one run's resolved config.

`load_experiment` reads the file (a regular UTF-8 file of strict YAML, of a config's size), applies `--name`
and `-p` overrides, builds and checks it (`hpcrl.config.build`), checks the sweep (`hpcrl.config.sweep_rules`)
and where it writes (`hpcrl.config.output_dir`); every problem is one line prefixed with the file's name.
`apply_settings` gives a run its grid point and `sweep.when` settings."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hpcrl.config import strict_yaml
from hpcrl.config.build import algo_of, build_experiment, unused_by_program
from hpcrl.config.dotted import parse_override, set_dotted, set_override
from hpcrl.config.experiment import PROGRAM_UNUSED, Experiment
from hpcrl.config.key_paths import check_hydra_sweep, known_path, unknown_key
from hpcrl.config.output_dir import check_output
from hpcrl.config.program_spec import anchored_workdir
from hpcrl.config.schema import ConfigError, Problems, key_path
from hpcrl.config.sweep_rules import check_grid, check_normalize, check_search, when_settings
from hpcrl.io import NotRegularFile, TooLarge, read_regular

MAX_CONFIG_BYTES = 10 * 2**20
"""The largest config file read. A config is a few kB; a larger file is something else given by
mistake (a log, a checkpoint), and reading a device such as /dev/zero would never end: refused,
rather than read until memory runs out."""


def read_yaml(path: Path) -> dict[str, Any]:
    """A user's config file as data: a regular file of at most MAX_CONFIG_BYTES, UTF-8, strict YAML
    (see `hpcrl.config.strict_yaml`), a mapping; read as `hpcrl.io.read_regular` reads a user's file."""
    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)
    except NotRegularFile as exc:
        raise ConfigError(f"{path}: not a regular file ({exc.kind}): give the path of a YAML config file") from None
    except TooLarge:
        raise ConfigError(f"{path}: larger than a config file can be ({MAX_CONFIG_BYTES // 2**20} MB): give the path of a YAML config file") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
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


def experiment_from_dict(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Validate plain data (with `-p` overrides applied) into an Experiment."""
    data = copy.deepcopy(data)
    problems = Problems()  # every problem of the overrides and the config, then of the sweep: one line each
    for text in overrides:
        with problems.kept():
            key, value = parse_override(text)
            algo = algo_of(data)
            if key != "algo" and not known_path(key, algo):
                raise unknown_key(f"-p {key_path('', key)}", key, algo)
            if algo == "program" and key.split(".")[0] in PROGRAM_UNUSED:
                raise unused_by_program(f"-p {key}")
            check_hydra_sweep(key, value, text, algo)
            set_override(data, key, value)
    with problems.kept():
        exp = build_experiment(data)
    problems.raise_any()
    for check in (check_grid, check_search):
        with problems.kept():
            check(exp, data)
    with problems.kept():
        check_normalize(exp)
    problems.raise_any()
    exp.given = data
    return exp


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
        check_output(exp)
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
        set_dotted(data, key, value, merge=True)
    data["sweep"] = {"seeds": [seed], "grid": {}}
    run = experiment_from_dict(data)
    run.source = exp.source
    if exp.program is not None and run.program is not None:
        run.program.workdir = exp.program.workdir  # resolved where `hpcrl sweep` ran
    return run
