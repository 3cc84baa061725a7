"""A user's own trainer as a run: the `program:` section of a config and the command line it renders.

`algo: program` runs the researcher's program (`python baselines/train_ppo.py --lr 2.5e-4 ...`)
where hpcrl would run its own trainer. This module is the schema of that section and the one rule
that turns a run's settings into the program's argv; it does no I/O, so the job script (rendered on
the login node) and the wrapper in the job (hpcrl.runtime.program) can never disagree on a command.

Parameters become arguments in one of the styles launchers use:

- `argparse`: `--lr 2.5e-4`; `true` is a bare flag (`--cuda`), `false` and null leave it out;
  a list is `--sizes 64 64` (argparse's nargs).
- `equals`: `--lr=2.5e-4`; lists `--sizes=64,64`.
- `hydra`: `lr=2.5e-4`, the overrides habitat-baselines and every Hydra app take; nested
  mappings are dotted paths (`habitat_baselines.rl.ppo.lr=2.5e-4`), lists `[64,64]`, null `null`.
- `none`: parameters are not added; `{params.NAME}` placeholders put them where the program wants
  them (RL Zoo's `--hyperparams learning_rate:{params.learning_rate}`).

`names` maps parameter names: `dashes` writes `clip_param` as `--clip-param`, `underscores` the
reverse. Numbers are written as the YAML spelled them (`2.5e-4` stays `2.5e-4`).

Placeholders `{run_dir}`, `{checkpoint_dir}`, `{seed}`, `{run_id}`, `{experiment_dir}` and
`{params.NAME}` may appear in the command, `args`, string parameters, `resume_args` and metric
paths; `resume_args` may also use `{latest_checkpoint}`, and `workdir` the run placeholders (not
`{params.NAME}`: where a run starts is not a hyperparameter). `${...}` (a shell or Hydra
interpolation) is left alone, and `{{`/`}}` write a literal brace.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from hpcrl.config.schema import Verbatim, YamlFloat, YamlInt, one_line_problem, setting

PLACEHOLDERS = ("run_dir", "checkpoint_dir", "seed", "run_id", "experiment_dir")
ABSOLUTE_PLACEHOLDERS = ("run_dir", "checkpoint_dir", "experiment_dir")
"""Those that stand for absolute paths, all inside the experiment directory."""
RESUME_PLACEHOLDERS = (*PLACEHOLDERS, "latest_checkpoint")
_FIELD = re.compile(r"\{\{|\}\}|(?<!\$)\{([^{}]*)\}")
_PARAM_KEY = re.compile(r"[+~]?[A-Za-z_][A-Za-z0-9_-]*")


def _placeholder_problem(text: str, allowed: tuple[str, ...]) -> str | None:
    for match in _FIELD.finditer(text):
        name = match.group(1)
        if name is None or name in allowed or (name.startswith("params.") and len(name) > 7):
            continue
        return f"unknown placeholder {{{name}}} in {text!r} (known: {', '.join('{' + p + '}' for p in allowed)}, {{params.NAME}}; write {{{{ and }}}} for literal braces)"
    return None


def _plain_problem(text: str) -> str | None:
    return _placeholder_problem(text, PLACEHOLDERS)


def _resume_problem(text: str) -> str | None:
    return _placeholder_problem(text, RESUME_PLACEHOLDERS)


def _workdir_problem(text: str) -> str | None:
    for match in _FIELD.finditer(text):
        name = match.group(1)
        if name is not None and name not in PLACEHOLDERS:
            return f"unknown placeholder {{{name}}} in {text!r} (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})"
    return None


def _command_problem(text: str) -> str | None:
    if not text:
        return "expected a non-empty word"
    return _plain_problem(text)


def param_key_problem(key: str) -> str | None:
    if _PARAM_KEY.fullmatch(key):
        return None
    return f"expected a parameter name (letters, digits, '_', '-'; Hydra's '+'/'~' prefix; nest mappings for dotted paths), got {key!r}"


@dataclass
class MetricsConfig:
    """Where the program's episodes are read from (hpcrl.runtime.metrics)."""

    source: Literal["hpcrl", "monitor", "tensorboard", "csv", "jsonl"] = "hpcrl"
    """`hpcrl`: train.csv written through `hpcrl.job.log`; `monitor`: Stable-Baselines3 Monitor CSVs
    (SB3, RL Zoo); `tensorboard`: event files (CleanRL); `csv`/`jsonl`: columns `step` and `value`."""
    path: Optional[str] = setting(None, valid=_plain_problem)
    """Glob of the files, relative to the run directory (or absolute). Default: `train.csv`,
    `**/*monitor.csv`, `**/events.out.tfevents.*`; required for csv and jsonl."""
    tag: str = "charts/episodic_return"
    """TensorBoard scalar holding each episode's return (CleanRL's name)."""
    step: str = "step"
    """csv/jsonl: the column of the step."""
    value: str = "episodic_return"
    """csv/jsonl: the column of the episode's return."""
    last_episodes: int = setting(10, ge=1, le=1_000_000)
    """Without `program.eval`, a run's final score is the mean return of its last N training episodes."""

    def check(self) -> list[tuple[str, str]]:
        if self.source in ("csv", "jsonl") and not self.path:
            return [("path", f"required for source {self.source!r} (the file the program writes, relative to the run directory)")]
        return []


@dataclass
class ProgramEvalConfig:
    """A command that evaluates a trained run; the eval stage runs it after training."""

    command: list[str] = setting(min_items=1, valid=_command_problem)
    """The evaluation's command, with the same placeholders and environment as program.command."""
    metrics: MetricsConfig = setting(factory=MetricsConfig)
    """Where the evaluation's episodes are read from; `hpcrl`: the eval.csv it wrote with `hpcrl.job.log_eval`."""


@dataclass
class ProgramConfig:
    """The user's trainer (`algo: program`)."""

    command: list[str] = setting(min_items=1, valid=_command_problem)
    """The program and its leading words, e.g. [python, baselines/train_ppo.py]; inside the container when there is one."""
    params: dict[str, Verbatim] = setting(factory=dict, keys=param_key_problem)
    """Hyperparameters: rendered as arguments in `style`, swept as `program.params.NAME`, hashed into run ids."""
    style: Literal["argparse", "equals", "hydra", "none"] = "argparse"
    """How params become arguments: `--lr 3e-4` (argparse), `--lr=3e-4` (equals), `lr=3e-4` (hydra), or
    none (only where `{params.NAME}` places them)."""
    names: Literal["as_written", "dashes", "underscores"] = "as_written"
    """Parameter names as written, or with `_` turned into `-` (dashes) or `-` into `_` (underscores)."""
    args: list[str] = setting(factory=list, valid=_plain_problem)
    """Fixed arguments after the parameters (placeholders allowed)."""
    resume_args: list[str] = setting(factory=list, valid=_resume_problem, learned=False)
    """Added when the run has had an earlier lifetime (a requeue, a retry): `--resume` or `[--resume, "{latest_checkpoint}"]`."""
    stop_signal: Literal["USR1", "USR2", "TERM", "INT"] = setting("USR1", learned=False)
    """What the program gets when the scheduler warns of a time limit or preemption."""
    workdir: Optional[str] = setting(None, valid=_workdir_problem, learned=False)
    """Directory the program runs in, created when missing; default: where `hpcrl sweep` was run (so
    relative script paths work). Run placeholders allowed: `{run_dir}` gives each run its own (CleanRL
    writes `runs/` into its working directory). A relative path is relative to where `hpcrl sweep` ran."""
    metrics: MetricsConfig = setting(factory=MetricsConfig, learned=False)
    eval: Optional[ProgramEvalConfig] = setting(None, learned=False)
    """A command that scores a trained run; without it, the score is the mean of the last training episodes."""

    def check(self) -> list[tuple[str, str]]:
        """Parameter values are words or lists of words; every `{params.NAME}` names a parameter."""
        flat = flat_params(self.params)
        for name, value in flat:
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, (dict, list)):
                    return [(f"params.{name}", f"expected a value or a list of values, got {value!r}")]
                if isinstance(item, float) and not math.isfinite(item):
                    return [(f"params.{name}", f"expected a finite number, got {item!r}")]
                problem = (one_line_problem(item) or _plain_problem(item)) if isinstance(item, str) else None
                if problem:
                    return [(f"params.{name}", problem)]
        known = {name for name, _ in flat}
        texts = [("command", w) for w in self.command] + [("args", w) for w in self.args] + [("resume_args", w) for w in self.resume_args]
        texts += [("metrics.path", self.metrics.path or "")]
        if self.eval is not None:
            texts += [("eval.command", w) for w in self.eval.command] + [("eval.metrics.path", self.eval.metrics.path or "")]
        for key, text in texts:
            for match in _FIELD.finditer(text):
                name = match.group(1) or ""
                if name.startswith("params.") and name[7:] not in known:
                    return [(key, f"{{{name}}}: no parameter {name[7:]!r} in program.params (give it a default there)")]
        return []


# --------------------------------------------------------------------------------------------
# Rendering.


def value_text(value: Any) -> str:
    """A parameter value as a word: numbers as the YAML spelled them, booleans as YAML writes them."""
    if isinstance(value, (YamlInt, YamlFloat)):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(value_text(v) for v in value) + "]"
    return str(value)


def flat_params(params: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted name, value) of each parameter; nested mappings become dotted paths."""
    out: list[tuple[str, Any]] = []
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += flat_params(value, name + ".")
        else:
            out.append((name, value))
    return out


def _name(key: str, names: str) -> str:
    if names == "dashes":
        return key.replace("_", "-")
    if names == "underscores":
        return key.replace("-", "_")
    return key


def option(key: str, names: str) -> str:
    """The flag a parameter becomes in the argparse and equals styles."""
    return "--" + _name(key, names)


def param_words(program: ProgramConfig) -> list[str]:
    """The parameters as arguments in the program's style (see the module docstring)."""
    words: list[str] = []
    for key, value in flat_params(program.params):
        if program.style == "none":
            break
        if program.style == "hydra":
            words.append(f"{_name(key, program.names)}={value_text(value)}")
        elif value is None or value is False and program.style == "argparse":
            continue
        elif program.style == "argparse":
            words.append(option(key, program.names))
            if value is not True:
                words += [value_text(v) for v in value] if isinstance(value, list) else [value_text(value)]
        else:
            text = ",".join(value_text(v) for v in value) if isinstance(value, list) else value_text(value)
            words.append(f"{option(key, program.names)}={text}")
    return words


def fill(text: str, values: dict[str, str], params: dict[str, Any]) -> str:
    """`text` with its placeholders replaced; a `{params.NAME}` the run lacks is a ValueError."""
    flat = dict(flat_params(params))

    def one(match: re.Match[str]) -> str:
        token, name = match.group(0), match.group(1)
        if name is None:
            return token[0]
        if name.startswith("params."):
            if name[7:] not in flat:
                raise ValueError(f"{text!r}: {{{name}}}: the run has no parameter {name[7:]!r} (params: {', '.join(flat) or 'none'})")
            return value_text(flat[name[7:]])
        return values[name]

    return _FIELD.sub(one, text)


def argv(program: ProgramConfig, values: dict[str, str]) -> list[str]:
    """The program's whole command line for one run: command, parameters, fixed arguments."""
    words = [fill(w, values, program.params) for w in program.command]
    words += [fill(w, values, program.params) for w in param_words(program)]
    words += [fill(w, values, program.params) for w in program.args]
    return words





def resume_words(program: ProgramConfig, values: dict[str, str]) -> list[str]:
    return [fill(w, values, program.params) for w in program.resume_args]


def eval_argv(program: ProgramConfig, values: dict[str, str]) -> list[str]:
    """The command line of `program.eval` for one run."""
    if program.eval is None:
        raise ValueError("the program has no eval command")
    return [fill(w, values, program.params) for w in program.eval.command]


def anchored_workdir(workdir: str | None, cwd: Path) -> str:
    """`program.workdir` as every job reads it: jobs start elsewhere, so a relative path is made
    absolute against `cwd` (where `hpcrl sweep` runs) now. One that starts with `{run_dir}`,
    `{checkpoint_dir}` or `{experiment_dir}` is absolute once filled, and stays as written."""
    text = workdir or "."
    if text.startswith(tuple(f"{{{p}}}" for p in ABSOLUTE_PLACEHOLDERS)):
        return text
    path = Path(text).expanduser()
    return str((path if path.is_absolute() else cwd / path).resolve())


def fixed_dir(workdir: str) -> str | None:
    """The directory every run's working directory lies in, for a container's binds: `workdir`
    itself when it has no placeholder, else its directory before the first one; None when it lies in
    the experiment directory (bound anyway) or would be the root."""
    match = _FIELD.search(workdir)
    if match is None:
        return workdir
    if match.group(1) in ABSOLUTE_PLACEHOLDERS and match.start() == 0:
        return None
    head = os.path.dirname(workdir[: match.start()])
    return head if head not in ("", "/") else None
