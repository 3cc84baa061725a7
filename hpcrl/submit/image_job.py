"""`hpcrl build-image`: build the config's image here, or plan its build as a one-task batch job and submit it.

The image itself (definition, check, content hash, the build) is `hpcrl.image.build`'s; what a
build job holds (its resources, its script) is planned here, beside the sweep's jobs, so that
image/ never imports submit/ (the job's context) nor a scheduler.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import IO

from hpcrl.config.container_spec import ImageConfig
from hpcrl.config.experiment import Experiment
from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.image import build as image
from hpcrl.io import atomic_write_text
from hpcrl.schedulers import backend_class, get_scheduler
from hpcrl.schedulers.base import SchedulerError
from hpcrl.submit.jobplan import job_context


def _job_argv(config: Path, overrides: list[str], *, force: bool, sandbox: bool, from_dockerfile: str | None) -> list[str]:
    argv = ["build-image", str(config.resolve())]
    for text in overrides:
        argv += ["-p", text]
    argv += [flag for flag, given in (("--force", force), ("--sandbox", sandbox)) if given]
    if from_dockerfile:
        argv += ["--from-dockerfile", str(Path(from_dockerfile).resolve())]
    return argv


def submit_build(exp: Experiment, p: image.Plan, job_argv: list[str], scheduler_name: str, *, dry_run: bool, out: IO[str]) -> int:
    """Render a one-task job that runs `hpcrl build-image` on a compute node, and submit it.

    The job runs on the host Python (the image does not exist yet), without GPUs, with the image
    section's build_time and build_mem, in the directory this command ran in (Slurm's default,
    SGE's -cwd), so relative paths and ./singularity/ resolve the same there.
    """
    if backend_class(scheduler_name).runs_here:
        raise ConfigError("--submit: no cluster scheduler here (no sbatch or qsub on PATH); without --submit the image builds on this machine")
    jobs_dir = p.image.parent / "jobs"
    scheduler = get_scheduler(scheduler_name, jobs_dir)
    host_exp = dataclasses.replace(exp, container=dataclasses.replace(exp.container, image=None))
    context = job_context(host_exp, "build-image", job_argv, 0, jobs_dir / "logs")
    text = scheduler.render(context)
    script = jobs_dir / f"build-{p.image.name.removesuffix('.sif')}.sh"
    if dry_run:
        print(f"# ---- {script} ({scheduler.name} job) ----\n{text}", file=out)
        return 0
    (jobs_dir / "logs").mkdir(parents=True, exist_ok=True)
    atomic_write_text(script, text)
    script.chmod(0o755)
    job_id = scheduler.submit(script, 0, [])
    print(f"{p.image}: build submitted to {scheduler.name} as job {job_id} ({script}; logs in {jobs_dir / 'logs'})", file=out)
    return 0


# --------------------------------------------------------------------------------------------
# The command.


def _config_path(config: str | None) -> Path:
    if config is not None:
        return Path(config)
    default = Path("hpcrl.yaml")
    if not default.is_file():
        raise ConfigError(f"no CONFIG given and no hpcrl.yaml in {Path.cwd()}; name a config file")
    return default


def build_image_command(
    config: str | None,
    overrides: list[str],
    *,
    dry_run: bool,
    force: bool,
    sandbox: bool,
    submit: bool,
    scheduler: str,
    from_dockerfile: str | None,
    out: IO[str] | None = None,
) -> int:
    """`hpcrl build-image`: 0 when the image exists (built now or before), 2 for bad input, else the build's code.

    `out` defaults to the sys.stdout of the moment, not of import time, so redirection and capture work.
    """
    out = out or sys.stdout
    try:
        config_path = _config_path(config)
        exp = load_experiment(config_path, overrides)
        p, warnings = image.plan(exp, sandbox=sandbox, from_dockerfile=from_dockerfile)
        for warning in warnings:
            print(f"hpcrl: warning: {from_dockerfile}: {warning}", file=sys.stderr)
        cached = p.image.exists() and not force
        if dry_run:
            print(p.definition.text, end="", file=out)
            print(f"# dry run: {p.image} {'exists' if cached else 'would be built'}; nothing written", file=out)
            if submit and not cached:
                job_argv = _job_argv(config_path, overrides, force=force, sandbox=sandbox, from_dockerfile=from_dockerfile)
                return submit_build(exp, p, job_argv, scheduler, dry_run=True, out=out)
            return 0
        if cached:
            print(f"{p.image}: up to date (content hash {p.digest[:12]}); nothing to build", file=out)
            return 0
        if submit:
            job_argv = _job_argv(config_path, overrides, force=force, sandbox=sandbox, from_dockerfile=from_dockerfile)
            return submit_build(exp, p, job_argv, scheduler, dry_run=False, out=out)
        runtime = image.resolve_runtime()
        return image.build(p, exp.image or ImageConfig(), runtime, sandbox=sandbox, out=out)
    except ConfigError as exc:
        if dry_run and isinstance(exc, image.DefinitionRefused):
            print(exc.definition.text, end="", file=out)
        print(f"hpcrl: error: {exc}", file=sys.stderr)
        return 2
    except SchedulerError as exc:
        print(f"hpcrl: error: {exc}", file=sys.stderr)
        return 1
