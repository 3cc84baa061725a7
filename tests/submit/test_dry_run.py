"""`hpcrl sweep --dry-run` shows what a sweep would do (issue 38, point 5): what each task trains, by
one rule for hpcrl's own trainer and a user's program; the scheduler commands with their dependency
flags, exactly as a sweep then runs them; a live cluster's refusal as a warning over the scripts.
And the scripts say what is true of them: requeue only where set, `--nv` only where the stage has a
GPU, the host's CUDA path bound into the image that puts it on LD_LIBRARY_PATH."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from factories import write_config

from hpcrl.cli import main
from hpcrl.config.load import load_experiment
from hpcrl.schedulers import get_scheduler
from hpcrl.store.expdir import encoded
from hpcrl.submit.pipeline import plan_scripts, submit_experiment
from hpcrl.sweep.runs import expand

REPO = Path(__file__).resolve().parents[2]
GRID = {"sweep": {"seeds": [0, 1], "grid": {"train.lr": [1e-3, 3e-4]}}}


def standin(directory: Path, name: str, body: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text("#!/bin/bash\n" + body)
    (directory / name).chmod(0o755)


def dry_run(capsys: pytest.CaptureFixture[str], config: Path, scheduler: str, *overrides: str) -> tuple[str, str]:
    assert main(["sweep", str(config), "--scheduler", scheduler, "--dry-run", *overrides]) == 0
    out, err = capsys.readouterr()
    return out, err


def table_rows(out: str, script: str) -> list[list[str]]:
    """The rows of `script`'s task table in a dry run's output, header first."""
    rows = []
    for line in out[out.index(f"# {script}: what each task trains") :].splitlines()[1:]:
        if not line.startswith("#   "):
            break
        rows.append(line[4:].split())
    return rows


@pytest.mark.parametrize("scheduler", ["slurm", "sge", "local"])
def test_the_dry_run_says_what_each_task_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str], scheduler: str) -> None:
    """Task i of the train job is run i of its manifest: the table has every run's id, seed and swept
    value in task order, as runs.csv will (before: only `--manifest jobs/0-0.tasks --task $TASK_ID`)."""
    config = write_config(tmp_path, GRID)
    out, _ = dry_run(capsys, config, scheduler)
    runs = expand(load_experiment(config))
    assert table_rows(out, "jobs/train-0-0.sh") == [["task", "run", "id", "seed", "train.lr"]] + [
        [str(task), run.run_id, str(run.seed), encoded(run.settings)["train.lr"]] for task, run in enumerate(runs, start=1)
    ]
    assert not (tmp_path / "logs").exists()


def test_a_programs_dry_run_has_the_same_table_beside_its_command_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One rule for both: the program's case statement and the table name the same run of each task."""
    config = REPO / "tests" / "data" / "program_counter.yaml"
    overrides = [f"output={tmp_path}", f"program.workdir={REPO}", "sweep.grid.program.params.lr=[0.01,0.02]"]
    out, _ = dry_run(capsys, config, "slurm", *overrides)
    runs = expand(load_experiment(config, overrides))
    rows = table_rows(out, "jobs/train-0-0.sh")
    assert rows[0] == ["task", "run", "id", "seed", "program.params.lr"] and len(rows) == 1 + len(runs) == 5
    cases = dict(re.findall(r"^  (\d+)\) PROGRAM=\((.*)\) ;;$", out, re.MULTILINE))
    for (task, run_id, seed, lr), run in zip(rows[1:], runs):
        command = shlex.split(cases[task])
        assert (run_id, seed, lr) == (run.run_id, str(run.seed), encoded(run.settings)["program.params.lr"])
        assert command[command.index("--lr") + 1] == lr, command  # the command line task i runs has run i's value


@pytest.mark.parametrize("scheduler,tool", [("slurm", "sbatch"), ("sge", "qsub")])
def test_the_dry_runs_commands_are_the_ones_the_sweep_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, scheduler: str, tool: str) -> None:
    """Each line of the dry run, with $TRAIN_0_0 read as the id the stand-in printed for that job, is
    the argv the sweep then gave the stand-in: dependency flags included, quoted as a shell reads them.
    The output directory has a `&`, which the quoting must carry."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    reply = 'echo "$n"' if tool == "sbatch" else 'echo "$n.1-4:1"'  # qsub -terse prints an array's range
    standin(bin_dir, tool, f'python3 -c \'import json,sys; print(json.dumps(sys.argv[1:]))\' "$@" >> {calls}\nn=$((100 + $(wc -l < {calls})))\n{reply}\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    config = write_config(tmp_path, {**GRID, "output": str(tmp_path / "runs&logs")})
    out, _ = dry_run(capsys, config, scheduler)
    lines = [line for line in out[out.index("# submitted in this order") :].splitlines()[1:] if line and not line.startswith("#")]
    assert len(lines) == 3 and all(line.startswith(f"{tool} ") for line in lines), lines
    assert submit_experiment(load_experiment(config), scheduler, out=io.StringIO()) == 0
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    ids = {f"${name}": str(101 + i) for i, name in enumerate(("TRAIN_0_0", "EVAL_0_0", "AGGREGATE_0"))}
    for line, argv in zip(lines, argvs):
        command = line.partition("   # -> ")[0]
        for name, job_id in ids.items():
            command = command.replace(name, job_id)
        assert shlex.split(command) == [tool, *argv]
    flags = {"slurm": ["--dependency=aftercorr:$TRAIN_0_0", "--dependency=afterany:$EVAL_0_0"], "sge": ["-hold_jid_ad $TRAIN_0_0", "-hold_jid $EVAL_0_0"]}[scheduler]
    assert flags[0] in lines[1] and flags[1] in lines[2]


def test_the_local_executor_s_order_is_said_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = dry_run(capsys, write_config(tmp_path), "local")
    assert "#   jobs/eval-0-0.sh: task i after task i of jobs/train-0-0.sh\n#   jobs/aggregate-0.sh: after every task of jobs/eval-0-0.sh\n" in out


SINFO = 'echo "debug*|2|4000|(null)"\necho "gpu|64|256000|gpu:4"\n'


def test_a_cluster_too_small_is_a_warning_in_a_dry_run_and_a_refusal_in_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The live cluster's largest node of the default partition has 2 CPUs; the config asks 8. The dry
    run prints every script and says why a sweep would refuse; the sweep refuses in one line. Neither
    calls the default partition a partition named `default`."""
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "sinfo", SINFO)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    config = write_config(tmp_path, {"resources": {"cpus": 8, "max_concurrent": 2}})
    out, err = dry_run(capsys, config, "slurm")
    why = "resources.cpus: 8 CPUs per node, but the largest node of Slurm's default partition debug has 2 (sinfo): the job would stay pending for ever"
    assert err == f"hpcrl: warning: {why}; a sweep without --dry-run refuses it\n"
    assert out.count("#!/bin/bash") == 3 and out.rstrip().endswith("nothing submitted; a sweep would refuse it (see the warning)")
    assert main(["sweep", str(config), "--scheduler", "slurm"]) == 2
    assert capsys.readouterr().err == f"hpcrl: error: {config}: {why}\n".replace(f"{config}: ", "")
    assert not (tmp_path / "logs").exists()
    out, err = dry_run(capsys, config, "slurm", "resources.partition=gpu")
    assert "warning" not in err


def rendered(config: str, scheduler: str, *overrides: str) -> dict[str, str]:
    exp = load_experiment(REPO / "configs" / f"{config}.yaml", ["output=/scratch/hpcrl", "python=/opt/venv/bin/python", *overrides])
    return {p.stage: p.text for p in plan_scripts(exp, get_scheduler(scheduler, exp.dir), [0, 1, 2], 0, runs=expand(exp))}


@pytest.mark.parametrize("scheduler", ["sge", "slurm", "local"])
def test_only_a_requeued_stage_says_it_is_requeued(scheduler: str) -> None:
    """Before: the eval and aggregate scripts said they were submitted with -r y (Grid Engine), and ran
    Slurm's requeue on exit 99, with no -r y and no --requeue among their directives."""
    scripts = rendered("habitat_ppo", scheduler, "container.image=/images/habitat.sif")
    for stage, text in scripts.items():
        requeued = stage == "train"
        assert (("#$ -r y" in text) == requeued) if scheduler == "sge" else (("#SBATCH --requeue" in text) == requeued) if scheduler == "slurm" else True
        assert ("-r y" in text) == ("#$ -r y" in text), stage
        assert ("requeue" in text.replace("not requeued", "")) == requeued, (stage, text)
        assert ("checkpoints and exits with 99" in text) == requeued, stage


@pytest.mark.parametrize("scheduler", ["sge", "slurm"])
def test_nv_only_where_the_stage_has_a_gpu(scheduler: str) -> None:
    image = "container.image=/images/habitat.sif"
    scripts = rendered("habitat_ppo", scheduler, image)
    assert "exec --nv " in scripts["train"] and "exec --nv " in scripts["eval"]  # resources.gpus 1, eval.gpus 1
    assert "singularity exec --bind " in scripts["aggregate"] and "--nv" not in scripts["aggregate"]
    assert "--nv" not in rendered("habitat_ppo", scheduler, image, "eval.gpus=0")["eval"]


def test_the_host_cuda_path_on_ld_library_path_is_bound_into_the_image() -> None:
    """habitat_ppo puts /opt/cuda-9.2/lib64 on LD_LIBRARY_PATH and runs in an image: the image must see it
    there (read-only), unless a bind of the config already shows it at the same path."""
    text = rendered("habitat_ppo", "sge", "container.image=/images/habitat.sif")["train"]
    assert "export LD_LIBRARY_PATH=/opt/cuda-9.2/lib64" in text
    assert " --bind /opt/cuda-9.2/lib64:/opt/cuda-9.2/lib64:ro " in text
    covered = rendered("habitat_ppo", "sge", "container.image=/images/habitat.sif", "container.binds=[/opt:/opt]")["train"]
    assert "--bind /opt:/opt --bind /scratch/hpcrl/habitat_ppo --home" in covered
    elsewhere = rendered("habitat_ppo", "sge", "container.image=/images/habitat.sif", "container.binds=[/opt:/host-opt]")["train"]
    assert "--bind /opt/cuda-9.2/lib64:/opt/cuda-9.2/lib64:ro" in elsewhere  # /opt is not at /opt in the image
    assert "--bind /opt" not in rendered("habitat_ppo", "sge")["train"]  # no image: nothing to bind


def test_a_python_that_is_not_here_is_refused_where_the_jobs_run_here(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python=/nonexistent/python` with the local executor failed every job at its first line, and
    `hpcrl status` said "no reason recorded". A cluster's nodes have their own files: its dry run shows the path."""
    config = write_config(tmp_path)
    assert main(["sweep", str(config), "--scheduler", "local", "--dry-run", "-p", "python=/nonexistent/python"]) == 2
    why = f"python: /nonexistent/python is not an executable file here, and local runs every job on this machine with it (left unset, they run {sys.executable})"
    assert capsys.readouterr().err == f"hpcrl: error: {why}\n"
    out, _ = dry_run(capsys, config, "slurm", "python=/nonexistent/python")
    assert "HPCRL=(/nonexistent/python -m hpcrl)" in out
    dry_run(capsys, config, "local", f"python={sys.executable}")
