# PYTHON_ARGCOMPLETE_OK
"""Argument parsing only: each subcommand calls one function elsewhere.

Imports are deferred into the subcommands so that `hpcrl status` on a login node does not pay for
importing torch.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from hpcrl import __version__
from hpcrl.config.schema import ConfigError
from hpcrl.schedulers import BACKENDS, SWEEP_CHOICES
from hpcrl.schedulers.base import SchedulerError


def _sweep(args: argparse.Namespace) -> int:
    from hpcrl.config.load import load_experiment
    from hpcrl.rl.envcheck import check_environment
    from hpcrl.submit.pipeline import submit_experiment

    exp = load_experiment(args.config, args.param + args.overrides, name=args.name)
    check_environment(exp)  # before the queue wait, not inside every job after it
    if exp.program is not None:
        from hpcrl.submit.program_help import warn_unlisted_flags

        warn_unlisted_flags(exp)
    return submit_experiment(exp, args.scheduler, dry_run=args.dry_run, detach=args.detach, stages=_stages())


def _stages() -> dict[str, Callable[..., int]]:
    """The in-job entry points, for a backend that runs tasks in this process (debug)."""
    from hpcrl.stages import STAGES

    return STAGES


def _job_entry(entry: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """What a job runs (train, learner, actor, search worker): it takes the scheduler's warnings from
    its first moment, before imports that take seconds (guard.catch_warnings), and ignores them once
    its exit code is decided (guard.ignore_warnings: the interpreter's shutdown must not die of one)."""

    @functools.wraps(entry)
    def run(args: argparse.Namespace) -> int:
        from hpcrl.runtime.guard import catch_warnings, ignore_warnings

        catch_warnings()
        try:
            return entry(args)
        finally:
            ignore_warnings()

    return run


@_job_entry
def _train(args: argparse.Namespace) -> int:
    from hpcrl import stages

    return stages.train(Path(args.experiment).resolve(), args.task, args.manifest, ranks=args.ranks, program=args.program)


@_job_entry
def _learner(args: argparse.Namespace) -> int:
    from hpcrl import stages

    return stages.learner(Path(args.experiment).resolve(), args.task, args.manifest)


@_job_entry
def _actor(args: argparse.Namespace) -> int:
    from hpcrl import stages

    return stages.actor(Path(args.experiment).resolve(), args.task, args.manifest, actor=args.actor)


@_job_entry
def _search_worker(args: argparse.Namespace) -> int:
    from hpcrl import stages

    return stages.search_worker(Path(args.experiment).resolve(), args.task)


def _eval(args: argparse.Namespace) -> int:
    from hpcrl import stages

    return stages.evaluate(Path(args.experiment).resolve(), args.task, args.manifest, program=args.program)


def _collect(args: argparse.Namespace) -> int:
    if args.experiment is None:
        return _which_experiment("collect")
    from hpcrl import stages

    with stages.quiet_imports():
        from hpcrl.results.collect import collect
    return collect(_experiment_dir(args.experiment), agg=args.agg, evaluate=args.evaluate, normalize=args.normalize)


def _compare(args: argparse.Namespace) -> int:
    from hpcrl.results.compare import compare_command

    return compare_command(args.experiments, args.output, args.agg, args.normalize)


def _status(args: argparse.Namespace) -> int:
    if args.experiment is None:
        return _which_experiment("status")
    from hpcrl.status import print_status

    return print_status(
        _experiment_dir(args.experiment), runs=args.runs, summary=args.summary, as_json=args.json,
        states=args.state, settings=args.setting, run_ids=args.run, watch=args.watch,
    )


def _cancel(args: argparse.Namespace) -> int:
    if args.experiment is None:
        return _which_experiment("cancel")
    from hpcrl.status import cancel_experiment

    return cancel_experiment(_experiment_dir(args.experiment), states=args.state, settings=args.setting, run_ids=args.run)


def _build_image(args: argparse.Namespace) -> int:
    from hpcrl.submit.image_job import build_image_command

    return build_image_command(
        args.config, args.param + args.overrides, dry_run=args.dry_run, force=args.force, sandbox=args.sandbox,
        submit=args.submit, scheduler=args.scheduler, from_dockerfile=args.from_dockerfile,
    )


def _schema(args: argparse.Namespace) -> int:
    import json

    from hpcrl.config.json_schema import config_schema

    print(json.dumps(config_schema(), indent=1 if args.indent else None))
    return 0


def _configs(args: argparse.Namespace) -> int:
    _print_configs(sys.stdout)
    return 0


def _print_configs(out: TextIO, indent: str = "") -> None:
    """The bundled configs, one line each: what `hpcrl configs` prints and `hpcrl init` starts from."""
    from hpcrl.starters import list_configs

    configs = list_configs()
    width = max(len(name) for name, _ in configs)
    for name, summary in configs:
        print(f"{indent}{name:<{width}}  {summary}", file=out)


def _which_experiment(command: str) -> int:
    """`hpcrl status` (collect, cancel) without an experiment: the experiments it may mean, newest
    first, one line each, and exit 2 (a usage error: nothing was shown, collected or cancelled)."""
    import time

    from hpcrl.store.expdir import find_experiments

    found = find_experiments()
    if not found:
        print(f"hpcrl {command}: give an experiment directory; there is none under ./logs or here (`hpcrl sweep CONFIG` makes <output>/<name>, logs/<name> by default)", file=sys.stderr)
        return 2
    print(f"hpcrl {command}: give an experiment directory, e.g. hpcrl {command} {found[0]}; these are under ./logs and here, newest sweep first:", file=sys.stderr)
    width = max(len(str(d)) for d in found)
    for d in found:
        with (d / "runs.csv").open("rb") as f:
            runs = max(0, sum(1 for _ in f) - 1)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime((d / "runs.csv").stat().st_mtime))
        print(f"  {str(d):<{width}}  {runs} run{'s' if runs != 1 else ''}, swept {when}", file=sys.stderr)
    return 2


def _init(args: argparse.Namespace) -> int:
    if args.name is None:
        from hpcrl.starters import DEFAULT

        print(f"hpcrl init: give the new config's name: hpcrl init NAME [--from CONFIG] (--from: one of these, {DEFAULT} by default)", file=sys.stderr)
        _print_configs(sys.stderr, "  ")
        return 2
    from hpcrl.starters import init

    path = init(args.name, args.source, Path(args.dir), force=args.force)
    print(f"wrote {path} (from {args.source}); run it with: hpcrl sweep {path} --scheduler local")
    return 0


def _completion(args: argparse.Namespace) -> int:
    try:
        import argcomplete
    except ImportError:
        raise ConfigError("completion needs argcomplete: pip install 'hpcrl[completion]'") from None
    print(argcomplete.shellcode(["hpcrl"], shell=args.shell))
    return 0


MULTIRUN = ("-m", "--multirun")
"""Hydra's flag for a sweep, which hpcrl's sweep takes from the config's sweep.grid instead."""


def multirun_line(flag: str, overrides: list[str]) -> str:
    """The one line for Hydra's `-m`: where sweeps go, with the grid key to write for each
    comma-separated override (`-m train.lr=1e-3,3e-4` -> `sweep.grid.train.lr=[1e-3,3e-4]`)."""
    swept = [f"sweep.grid.{key}=[{values}]" for key, _, values in (w.partition("=") for w in overrides) if "," in values and not values.startswith(("[", "{"))]
    write = " ".join(swept) if swept else "the values under sweep.grid (sweep.grid.train.lr=[1e-3,3e-4])"
    return f"{flag}: Hydra's multirun; hpcrl sweeps the lists in sweep.grid, without {flag}: write {write}"


def _experiment_dir(text: str) -> Path:
    from hpcrl.api import experiment_dir

    return experiment_dir(text)


class _Version(argparse.Action):
    """`--version`: computed when asked (a git call), not each time the parser is built."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """`hpcrl 0.1.0`, and `(git <commit>)` when hpcrl runs from a source checkout rather than a wheel."""
    from hpcrl.store.expdir import git_commit

    checkout = Path(__file__).resolve().parent.parent
    commit = git_commit(checkout) if (checkout / ".git").exists() else None
    return f"hpcrl {__version__}" + (f" (git {commit[:12]}, {checkout})" if commit else "")


def _end_leftovers(args: argparse.Namespace) -> int:
    from hpcrl.leftovers import end_job_leftovers, end_marked_leftovers

    try:
        if args.mark is None:
            end_job_leftovers(args.since, args.status, sys.stdout)
        else:
            end_marked_leftovers(args.mark, args.since, f"the job's ranks (srun, exit {args.status})", sys.stdout)
    except ValueError as exc:
        print(f"hpcrl: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _finite(text: str) -> float:
    """A finite number (argparse's `type`): `float` alone takes nan and inf."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


@functools.cache
def parser() -> argparse.ArgumentParser:
    """Built once per process: argparse looks up a translation for every help string (~50 ms)."""
    p = argparse.ArgumentParser(prog="hpcrl", description="RL sweeps from one YAML file to evaluated, plotted results.")
    p.add_argument("--version", action=_Version, help="the version, and the git commit when run from a checkout")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS)  # listed by _group_commands

    def add_params(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-p", "--param", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a config value (repeatable)")
        # A default, or argparse (before 3.12) names this optional positional among the required ones when the config is missing.
        sp.add_argument("overrides", nargs="*", default=[], metavar="KEY.PATH=VALUE", help="overrides as Hydra takes them: the same as -p")

    s = sub.add_parser("sweep", help="expand a config into runs, render job scripts and submit train -> eval -> aggregate")
    s.add_argument("config")
    add_params(s)
    s.add_argument("--scheduler", choices=SWEEP_CHOICES, default="auto", help="debug: every stage in this process, for a debugger")
    s.add_argument("--dry-run", action="store_true", help="print the job scripts, what each task trains and the sbatch/qsub lines with their dependencies; write and submit nothing")
    s.add_argument("--name", help="experiment name (default: the config's name), taken as typed")
    s.add_argument("--detach", action="store_true", help="local scheduler: return at once and run in the background")
    s.set_defaults(func=_sweep)

    for name, func, help_ in (("train", _train, "train one run (the train stage's entry point)"), ("eval", _eval, "evaluate one run (the eval stage's entry point)"),
                             ("learner", _learner, "the learner of one distributed run (the learner stage's entry point)")):
        t = sub.add_parser(name, help=help_)
        t.add_argument("experiment")
        t.add_argument("--task", type=int, required=True, help="array task id, or the run index without --manifest")
        t.add_argument("--manifest", help="file (relative to the experiment) whose line N is the run index of task N")
        if name == "train":
            t.add_argument("--ranks", type=int, help="start the run's resources.ranks processes on this host and wait for them (DD-PPO)")
        t.set_defaults(func=func)

    ac = sub.add_parser("actor", help="one actor of a distributed run (the actors stage's entry point)")
    ac.add_argument("experiment")
    ac.add_argument("--task", type=int, required=True, help="array task id, or the run index without --manifest")
    ac.add_argument("--manifest", help="file whose k-th line naming run R makes task N actor k of run R")
    ac.add_argument("--actor", type=int, default=0, help="actor index without --manifest")
    ac.set_defaults(func=_actor)

    el = sub.add_parser("end-leftovers", help="a job script's last step when its hpcrl was killed (or its ranks' srun step failed): end what it left running in the job, and remove the shared memory they held")
    el.add_argument("--since", type=_finite, required=True, help="the job's start, in seconds since the epoch: the files of ViZDoom's games made since then that no process holds go too")
    el.add_argument("--status", type=int, required=True, help="the exit status of the killed hpcrl (or of the ranks' srun), for the job log")
    el.add_argument("--mark", help="end instead the processes of this node whose environment has HPCRL_STEP_MARK=MARK (a Slurm job's step on each node after its ranks' step failed)")
    el.set_defaults(func=_end_leftovers)

    sw = sub.add_parser("search-worker", help="one worker of an Optuna study (the study stage's entry point): trials until n_trials")
    sw.add_argument("experiment")
    sw.add_argument("--task", type=int, required=True, help="array task id: the worker's identity, kept across a requeue")
    sw.set_defaults(func=_search_worker)

    c = sub.add_parser("collect", help="gather runs, report missing ones, write summary, curves and plots")
    c.add_argument("experiment", nargs="?", help="the experiment directory (logs/<name>); without it, the experiments under ./logs are listed")
    c.add_argument("--agg", choices=["iqm", "mean"], default="iqm", help="aggregate for curves and intervals")
    c.add_argument("--evaluate", action="store_true", help="first evaluate, in parallel local processes, trained runs that have no eval yet")
    c.add_argument("--normalize", action="store_true", default=None, help="score each env as (score - random) / (reference - random) (default: results.normalize)")
    c.set_defaults(func=_collect)

    cm = sub.add_parser("compare", help="join experiments on their common envs into one set of tables, plots and report")
    cm.add_argument("experiments", nargs="+", metavar="EXPERIMENT")
    cm.add_argument("-o", "--output", help="directory for the results (default: compare-A-vs-B beside the first experiment)")
    cm.add_argument("--agg", choices=["iqm", "mean"], default="iqm", help="aggregate for curves and intervals")
    cm.add_argument("--normalize", action="store_true", default=None, help="score each env as (score - random) / (reference - random) (default: when every experiment sets results.normalize)")
    cm.set_defaults(func=_compare)

    st = sub.add_parser("status", help="runs x stages: pending, running, done, failed (one line per setting past 50 runs)")
    st.add_argument("experiment", nargs="?", help="the experiment directory (logs/<name>); without it, the experiments under ./logs are listed")
    view = st.add_mutually_exclusive_group()
    view.add_argument("--runs", action="store_true", help="one line per run (the default up to 50 runs, or with a selection)")
    view.add_argument("--summary", action="store_true", help="one line per setting, the failures named (the default past 50 runs)")
    st.add_argument("--json", action="store_true", help="runs and per-setting counts as one JSON object (its shape: the docs, how-to/status-at-scale.md)")
    st.add_argument("--watch", nargs="?", const="5", metavar="SECONDS", help="refresh every SECONDS (default 5, at least 1) until nothing is pending or running")

    ca = sub.add_parser("cancel", help="cancel every job of an experiment, or the tasks of some runs")
    ca.add_argument("experiment", nargs="?", help="the experiment directory (logs/<name>); without it, the experiments under ./logs are listed")
    for sp, verb in ((st, "show"), (ca, "cancel")):
        states = "pending, running, orphaned" if sp is ca else "pending, running, orphaned, done, failed, cancelled, skipped, not-submitted"
        sp.add_argument("--state", action="append", default=[], metavar="STATE", help=f"{verb} runs in this state (repeatable): {states}")
        sp.add_argument("--setting", action="append", default=[], metavar="LABEL", help=f"{verb} the runs of this setting: its exact label, else every label containing it (repeatable)")
        sp.add_argument("--run", action="append", default=[], metavar="RUN_ID", help=f"{verb} this run (repeatable)")
    st.set_defaults(func=_status)
    ca.set_defaults(func=_cancel)

    b = sub.add_parser("build-image", help="render, check and build the Singularity image of a config")
    b.add_argument("config", nargs="?")
    add_params(b)
    b.add_argument("--dry-run", action="store_true", help="print the definition file; build nothing")
    b.add_argument("--force", action="store_true", help="rebuild even if the image for this definition exists")
    b.add_argument("--sandbox", action="store_true", help="build a writable directory instead of a SIF")
    b.add_argument("--submit", action="store_true", help="build in a batch job (for clusters that forbid builds on login nodes)")
    b.add_argument("--scheduler", choices=["auto", *BACKENDS], default="auto")
    b.add_argument("--from-dockerfile", metavar="FILE", help="import an existing Dockerfile instead of the template")
    b.set_defaults(func=_build_image)
    sc = sub.add_parser("schema", help="print the config's JSON Schema (for editors: yaml-language-server)")
    sc.add_argument("--indent", action="store_true", help="indented, for reading")
    sc.set_defaults(func=_schema)

    cf = sub.add_parser("configs", help="list the bundled configs, one line each")
    cf.set_defaults(func=_configs)

    it = sub.add_parser("init", help="write NAME.yaml, a starter config copied from a bundled one")
    it.add_argument("name", nargs="?", help="the experiment's name, and the file's; without it, the bundled configs to start from are listed")
    it.add_argument("--from", dest="source", default="cartpole_ppo", help="the bundled config to start from (`hpcrl configs` lists them)")
    it.add_argument("--dir", default=".", help="where to write it (default: here)")
    it.add_argument("--force", action="store_true", help="overwrite an existing file")
    it.set_defaults(func=_init)

    co = sub.add_parser("completion", help="print the shell completion script: eval \"$(hpcrl completion bash)\"")
    co.add_argument("shell", choices=["bash", "zsh"])
    co.set_defaults(func=_completion)
    _group_commands(p, sub)
    _completers(p)
    return p


USER_COMMANDS = ("sweep", "status", "collect", "compare", "cancel", "build-image", "init", "configs", "schema", "completion")
"""The commands a user types, in the order `hpcrl --help` lists them (the order of a first hour)."""
JOB_COMMANDS = ("train", "eval", "learner", "actor", "search-worker", "end-leftovers")
"""The in-job entry points: what job scripts run (the stages of hpcrl.stages, and the last step of a job whose
hpcrl was killed). Callable like any command, and listed apart in `hpcrl --help`, after the user's commands."""


def _group_commands(p: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """`hpcrl --help`: the user's commands under "commands", the in-job entry points in a group of
    their own after them. argparse lists one subparsers action as one group, so the subparsers
    action is hidden and its help lines (one per command) are listed by two groups instead; every
    parser stays in `sub`, callable as before. Each command's help is also its parser's description
    (`hpcrl status --help`, and the CLI reference the docs generate from this parser)."""
    lines = {action.dest: action for action in sub._choices_actions}
    for name, action in lines.items():
        sub.choices[name].description = sub.choices[name].description or action.help
    p.usage = "%(prog)s [-h] [--version] COMMAND ..."
    p.add_argument_group("commands")._group_actions.extend(lines[name] for name in USER_COMMANDS)
    jobs = p.add_argument_group(
        "in-job entry points",
        "what the job scripts run, one task each (`hpcrl sweep --dry-run` shows them); "
        "`hpcrl train|eval EXPERIMENT --task N -- PROGRAM [ARGS...]` runs a user's program (algo: program) as its job script does",
    )
    jobs._group_actions.extend(lines[name] for name in JOB_COMMANDS)
    assert sorted(lines) == sorted(USER_COMMANDS + JOB_COMMANDS), "a command missing from USER_COMMANDS or JOB_COMMANDS"


def _completers(p: argparse.ArgumentParser) -> None:
    """argcomplete's completers, where it is installed: config files (*.yaml) and experiment
    directories; subcommands and options complete from the parser itself."""
    try:
        from argcomplete.completers import ChoicesCompleter, DirectoriesCompleter, FilesCompleter
    except ImportError:
        return
    from hpcrl.starters import bundled
    for action in p._subparsers._group_actions[0].choices.values():  # type: ignore[union-attr]
        for arg in action._actions:
            if arg.dest == "config":
                arg.completer = FilesCompleter(("yaml", "yml"))  # type: ignore[attr-defined]
            elif arg.dest in ("experiment", "experiments", "dir", "output"):
                arg.completer = DirectoriesCompleter()  # type: ignore[attr-defined]
            elif arg.dest == "source":
                arg.completer = ChoicesCompleter(list(bundled()))  # type: ignore[attr-defined]


class _OutlivesItsReader:
    """sys.stdout for a command whose reader may leave: `hpcrl sweep c.yaml | head -n 2` closed the pipe
    after two lines, the foreground sweep died of it, and its local jobs were cancelled with it (exit 0).
    Once the reader has gone, what is printed goes to /dev/null and the command goes on to its end."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


EXIT_FILE = "HPCRL_EXIT_FILE"
"""Where a job script asks hpcrl to leave its exit status (job_templates/_job.sh.j2): the script runs hpcrl in
the background to pass warnings on, and a warning that cuts its `wait` short can leave bash without the
status (it says 128+N, or loses it), which would turn a requeue (99) into a failure."""


def main(argv: list[str] | None = None) -> int:
    exit_file = os.environ.pop(EXIT_FILE, None)  # this process's alone: no rank, program or server it starts writes it
    stdout = sys.stdout
    sys.stdout = _OutlivesItsReader(stdout)
    code: object = 1  # an exception that escapes: Python exits 1
    try:
        result = code = _main(argv)
        return result
    except SystemExit as stop:
        code = stop.code
        raise
    finally:
        sys.stdout = stdout
        if exit_file:
            _leave_exit_status(exit_file, code)


def _leave_exit_status(path: str, code: object) -> None:
    """The status this process exits with, as Python derives it from `code`, in `path` (best effort: the
    script falls back on `wait`'s answer when the file is not there)."""
    status = 0 if code is None else code if isinstance(code, int) else 1
    try:
        Path(path).write_text(f"{status & 0xFF}\n")
    except OSError:
        pass


def _main(argv: list[str] | None) -> int:
    if argv is None and "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (`hpcrl completion bash`)
        try:
            import argcomplete

            argcomplete.autocomplete(parser())
        except ImportError:
            pass
    argv = sys.argv[1:] if argv is None else list(argv)
    program = None
    if "--" in argv:  # `hpcrl train ... -- python train.py --lr 3e-4`: the words after -- are the program's
        cut = argv.index("--")
        argv, program = argv[:cut], argv[cut + 1 :]
    args, extra = parser().parse_known_args(argv)
    if hasattr(args, "overrides") and (multirun := [w for w in extra if w in MULTIRUN]):
        print(f"hpcrl: error: {multirun_line(multirun[0], [w for w in [*args.overrides, *extra] if '=' in w])}", file=sys.stderr)
        return 2
    if extra and hasattr(args, "overrides") and not any(word.startswith("-") for word in extra):
        args.overrides = [*args.overrides, *extra]  # `hpcrl sweep c.yaml --scheduler local train.lr=3e-4`: overrides after options too
    elif extra:
        parser().error(f"unrecognized arguments: {' '.join(extra)}")
    if program is not None and args.command not in ("train", "eval"):
        parser().error(f"'--' followed by a program is for `hpcrl train` and `hpcrl eval`, not `hpcrl {args.command}`")
    args.program = program
    try:
        words = getattr(args, "overrides", [])
        for before, word in zip(["", *words], words):
            if "=" not in word and sum(map(before.count, "{[")) > sum(map(before.count, "}]")):
                raise ConfigError(f"{before!r} {word!r}: one override that the shell split at a space: quote it, or write it without spaces ({{a:1,b:2}})")
            if "=" not in word:
                raise ConfigError(f"{word!r}: expected KEY.PATH=VALUE after the config (an override, as -p takes)")
        return args.func(args)
    except ConfigError as exc:
        for line in exc.lines:  # every problem of a config, one line each
            print(f"hpcrl: error: {line}", file=sys.stderr)
        return 2
    except SchedulerError as exc:
        print(f"hpcrl: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if args.command not in USER_COMMANDS:  # a job's log keeps the traceback: there it is a fault to find
            raise
        print(f"hpcrl: error: {os_error_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def os_error_line(exc: OSError) -> str:
    """What the system refused, on one line: a path too long, a file where a folder must be, a folder hpcrl may
    not write, a full disk. Each is the user's to change, about a path they gave or the machine's state, and
    a traceback would bury the one fact they need: which path, and why."""
    paths = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None)
    reason = exc.strerror or str(exc)
    return f"{paths}: {reason}" if paths else reason


if __name__ == "__main__":
    sys.exit(main())
