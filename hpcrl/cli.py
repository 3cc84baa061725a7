"""Argument parsing only: each subcommand calls one function elsewhere.

Imports are deferred into the subcommands so that `hpcrl status` on a login node does not pay for
importing torch.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from hpcrl import __version__
from hpcrl.config import ConfigError
from hpcrl.schedulers.base import SchedulerError


def _sweep(args: argparse.Namespace) -> int:
    from hpcrl.config import load_experiment
    from hpcrl.pipeline import submit_experiment
    from hpcrl.rl.envcheck import check_environment

    exp = load_experiment(args.config, args.param, name=args.name)
    check_environment(exp)  # before the queue wait, not inside every job after it
    return submit_experiment(exp, args.scheduler, dry_run=args.dry_run, detach=args.detach)


def _task_run(args: argparse.Namespace):
    from hpcrl import rundir
    from hpcrl.sweep import load_run

    experiment_dir = Path(args.experiment).resolve()
    index = rundir.task_run(experiment_dir, args.manifest, args.task) if args.manifest else args.task
    return experiment_dir, load_run(experiment_dir, index)


def _train(args: argparse.Namespace) -> int:
    experiment_dir, run = _task_run(args)
    if args.ranks is not None:  # the single-host launcher of a multi-rank run (local, Grid Engine)
        if args.ranks != run.config.resources.ranks:
            raise ConfigError(f"--ranks {args.ranks}: run {run.run_id} has resources.ranks {run.config.resources.ranks}")
        if args.ranks > 1:
            from hpcrl.launch import launch
            from hpcrl.sweep import run_dir

            child = [sys.executable, "-m", "hpcrl", "train", args.experiment, "--task", str(args.task), *(["--manifest", args.manifest] if args.manifest else [])]
            return launch(child, args.ranks, run_dir(experiment_dir, run.run_id), out=sys.stdout)
    if run.config.algo == "program":
        from hpcrl.program import train_program

        return train_program(experiment_dir, run, args.program, out=sys.stdout)
    if args.program:
        raise ConfigError(f"{run.run_id}: a command after -- is for algo 'program'; this run's algo is {run.config.algo!r}")
    from hpcrl.rl.train import train_run

    return train_run(experiment_dir, run, out=sys.stdout)


def _learner(args: argparse.Namespace) -> int:
    from hpcrl.distributed.learner import run_learner

    experiment_dir, run = _task_run(args)
    return run_learner(experiment_dir, run, out=sys.stdout)


def _actor(args: argparse.Namespace) -> int:
    from hpcrl import rundir
    from hpcrl.distributed.actor import run_actor
    from hpcrl.sweep import load_run

    experiment_dir = Path(args.experiment).resolve()
    if args.manifest:
        index, actor = rundir.actor_of_task(experiment_dir, args.manifest, args.task)
    else:
        index, actor = args.task, args.actor
    return run_actor(experiment_dir, load_run(experiment_dir, index), actor, out=sys.stdout)


def _search_worker(args: argparse.Namespace) -> int:
    from hpcrl.study_worker import run_worker

    return run_worker(Path(args.experiment).resolve(), args.task, out=sys.stdout)


def _eval(args: argparse.Namespace) -> int:
    experiment_dir, run = _task_run(args)
    if run.config.algo == "program":
        from hpcrl.program import evaluate_program

        return evaluate_program(experiment_dir, run, out=sys.stdout)
    from hpcrl.rl.evaluate import evaluate_run

    return evaluate_run(experiment_dir, run, out=sys.stdout)


def _collect(args: argparse.Namespace) -> int:
    from hpcrl.collect import collect

    return collect(_experiment_dir(args.experiment), agg=args.agg, evaluate=args.evaluate, normalize=args.normalize)


def _compare(args: argparse.Namespace) -> int:
    from hpcrl.compare import compare_command

    return compare_command(args.experiments, args.output, args.agg, args.normalize)


def _status(args: argparse.Namespace) -> int:
    from hpcrl.status import print_status

    return print_status(_experiment_dir(args.experiment))


def _cancel(args: argparse.Namespace) -> int:
    from hpcrl.status import cancel_experiment

    return cancel_experiment(_experiment_dir(args.experiment))


def _build_image(args: argparse.Namespace) -> int:
    from hpcrl.image import build_image_command

    return build_image_command(
        args.config, args.param, dry_run=args.dry_run, force=args.force, sandbox=args.sandbox,
        submit=args.submit, scheduler=args.scheduler, from_dockerfile=args.from_dockerfile,
    )


def _experiment_dir(text: str) -> Path:
    path = Path(text)
    if not (path / "runs.csv").exists():
        raise ConfigError(f"{path}: not an experiment directory (no runs.csv); give logs/<experiment>")
    return path


@functools.cache
def parser() -> argparse.ArgumentParser:
    """Built once per process: argparse looks up a translation for every help string (~50 ms)."""
    p = argparse.ArgumentParser(prog="hpcrl", description="RL sweeps from one YAML file to evaluated, plotted results.")
    p.add_argument("--version", action="version", version=f"hpcrl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    p.epilog = "hpcrl train EXPERIMENT --task N -- PROGRAM [ARGS...]: a user's program (algo: program), as its job script runs it"

    def add_params(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-p", "--param", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a config value (repeatable)")

    s = sub.add_parser("sweep", help="expand a config into runs, render job scripts and submit train -> eval -> aggregate")
    s.add_argument("config")
    add_params(s)
    s.add_argument("--scheduler", choices=["auto", "local", "slurm", "sge"], default="auto")
    s.add_argument("--dry-run", action="store_true", help="print the job scripts; write and submit nothing")
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

    sw = sub.add_parser("search-worker", help="one worker of an Optuna study (the study stage's entry point): trials until n_trials")
    sw.add_argument("experiment")
    sw.add_argument("--task", type=int, required=True, help="array task id: the worker's identity, kept across a requeue")
    sw.set_defaults(func=_search_worker)

    c = sub.add_parser("collect", help="gather runs, report missing ones, write summary, curves and plots")
    c.add_argument("experiment")
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

    st = sub.add_parser("status", help="runs x stages: pending, running, done, failed")
    st.add_argument("experiment")
    st.set_defaults(func=_status)

    ca = sub.add_parser("cancel", help="cancel every job of an experiment")
    ca.add_argument("experiment")
    ca.set_defaults(func=_cancel)

    b = sub.add_parser("build-image", help="render, check and build the Singularity image of a config")
    b.add_argument("config", nargs="?")
    add_params(b)
    b.add_argument("--dry-run", action="store_true", help="print the definition file; build nothing")
    b.add_argument("--force", action="store_true", help="rebuild even if the image for this definition exists")
    b.add_argument("--sandbox", action="store_true", help="build a writable directory instead of a SIF")
    b.add_argument("--submit", action="store_true", help="build in a batch job (for clusters that forbid builds on login nodes)")
    b.add_argument("--scheduler", choices=["auto", "local", "slurm", "sge"], default="auto")
    b.add_argument("--from-dockerfile", metavar="FILE", help="import an existing Dockerfile instead of the template")
    b.set_defaults(func=_build_image)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    program = None
    if "--" in argv:  # `hpcrl train ... -- python train.py --lr 3e-4`: the words after -- are the program's
        cut = argv.index("--")
        argv, program = argv[:cut], argv[cut + 1 :]
    args = parser().parse_args(argv)
    if program is not None and args.command != "train":
        parser().error(f"'--' followed by a program is for `hpcrl train`, not `hpcrl {args.command}`")
    args.program = program
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"hpcrl: error: {exc}", file=sys.stderr)
        return 2
    except SchedulerError as exc:
        print(f"hpcrl: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
