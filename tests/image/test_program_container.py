"""A user's own program in the user's own image (`container.runs: program`, issue 25 item 6), its
command found where the job runs, and the working directory it runs in.

What a user relies on:
- the seed's job runs `singularity exec --nv $BINDS $IMG python baselines/train_ppo.py ...` in an
  image that has no hpcrl: with `container.runs: program` hpcrl supervises on the host and the job
  script runs exactly that line, its binds, `--nv`, `--home` and container.env as before, every word
  quoted; HPCRL_* reach the program inside, also through `--cleanenv`;
- `container.runs: hpcrl` (the default) keeps hpcrl inside the image, as before;
- without an image, a bare `python` is resolved where `hpcrl sweep` runs: a Grid Engine job's PATH
  (which had no `python`) cannot make it fail after the queue wait;
- `program.workdir: "{run_dir}/..."` gives each run its own working directory, created on start.

No Apptainer runtime exists here: the end-to-end run goes through tests/standins/apptainer, a
STAND-IN that runs the inner command on this machine with the environment the runtime would give.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcrl.cli import main
from hpcrl.config.load import experiment_from_dict, load_experiment
from hpcrl.schedulers import get_scheduler
from hpcrl.store import expdir, rundir
from hpcrl.store.expdir import load_runs, run_dir
from hpcrl.submit.pipeline import plan_scripts
from hpcrl.sweep import runs as sweep

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standins" / "apptainer"
PINNED = ["output=/scratch/hpcrl", "python=/opt/venv/bin/python", "container.image=/images/habitat.sif", "program.workdir=/work/project"]
SEED_EXEC = (
    "singularity exec --nv --bind /sps/hep/habitat/data:/data --bind /scratch/hpcrl/habitat_own_trainer --bind /work/project"
    " --bind /opt/cuda-9.2/lib64:/opt/cuda-9.2/lib64:ro /images/habitat.sif"  # cuda.lib_path, which the job puts on LD_LIBRARY_PATH
)


def seed_scripts(*overrides: str) -> dict[str, str]:
    exp = load_experiment(REPO / "configs" / "habitat_own_trainer.yaml", [*PINNED, *overrides])
    return {p.stage: p.text for p in plan_scripts(exp, get_scheduler("sge", exp.dir), [0, 1, 2], 0, runs=sweep.expand(exp))}


def task_words(script: str, task: int = 1, env: dict[str, str] | None = None, cwd: Path | None = None) -> list[str]:
    """The PROGRAM array of one task, as bash builds it from the script's case."""
    case = script[script.index('case "$TASK_ID"') : script.index("esac") + 4]
    printer = f'TASK_ID={task}\n{case}\n{sys.executable} -c "import json, sys; print(json.dumps(sys.argv[1:]))" "${{PROGRAM[@]}}"\n'
    out = subprocess.run(["bash", "-c", printer], env=env, cwd=cwd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


# ------------------------------------------------------------------------------------ the job scripts


def test_the_seeds_job_runs_its_program_in_its_image_and_hpcrl_on_the_host() -> None:
    scripts = seed_scripts()  # configs/habitat_own_trainer.yaml says container.runs: program
    train = scripts["train"]
    first = next(line for line in train.splitlines() if line.startswith("  1) PROGRAM=("))
    assert first.startswith(f"  1) PROGRAM=({SEED_EXEC} python baselines/train_ppo.py --lr 2.5e-4 --clip-param 0.1 ")
    for stage, text in scripts.items():  # every stage runs hpcrl on the host: the image has none
        assert "HPCRL=(/opt/venv/bin/python -m hpcrl)" in text and ".sif hpcrl)" not in text, stage
        assert "export SINGULARITYENV_MAGNUM_LOG=quiet" in text and "export APPTAINERENV_GLOG_minloglevel=2" in text, stage
    assert '"${HPCRL[@]}" train /scratch/hpcrl/habitat_own_trainer --manifest jobs/0-0.tasks --task "$TASK_ID" -- "${PROGRAM[@]}" &' in train


def test_the_dry_run_names_the_first_runs_command_and_its_image(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "singularity").symlink_to(STANDIN)  # the runtime is looked up at sweep time
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    overrides = [f"output={tmp_path}", *PINNED[1:]]
    assert main(["sweep", str(REPO / "configs" / "habitat_own_trainer.yaml"), "--scheduler", "sge", "--dry-run", *(w for o in overrides for w in ("-p", o))]) == 0
    out = capsys.readouterr().out
    assert "\n# first run's command line (in the image /images/habitat.sif): python baselines/train_ppo.py --lr 2.5e-4 --clip-param 0.1 " in out
    assert not (tmp_path / "habitat_own_trainer").exists()


def test_runs_hpcrl_keeps_hpcrl_in_the_image_with_the_same_container_line() -> None:
    """The other mode, and the one place both take the container's command line from."""
    for extra in ([], ["container.cleanenv=true", "container.home=/work/home", "container.runtime=apptainer"]):
        in_image = seed_scripts("container.runs=hpcrl", *extra)["train"]
        on_host = seed_scripts("container.runs=program", *extra)["train"]
        hpcrl_line = next(line for line in in_image.splitlines() if line.startswith("HPCRL=("))
        exec_words = hpcrl_line.removeprefix("HPCRL=(").removesuffix(" hpcrl)")
        assert exec_words.startswith(("singularity exec --nv", "apptainer exec --nv"))
        assert "  1) PROGRAM=(python baselines/train_ppo.py " in in_image
        assert f"  1) PROGRAM=({exec_words} python baselines/train_ppo.py " in on_host
        if extra:
            assert '--cleanenv --env "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"' in exec_words and "--home /work/home" in exec_words


POISON = "$(touch {m})`touch {m}`;touch {m} & a  b"


def test_container_values_reach_the_runtime_as_words_and_run_nothing(tmp_path: Path) -> None:
    """Image path, binds, home and the program's words carry shell syntax: the PROGRAM array bash
    builds is exactly the runtime's argv, and nothing runs."""
    marker = tmp_path / "owned"
    poison = POISON.format(m=marker)
    exp = experiment_from_dict({
        "name": "p", "algo": "program", "output": str(tmp_path / "logs"),
        "program": {"command": ["python", f"t {poison}.py"], "style": "equals", "params": {"x": poison}, "workdir": str(tmp_path / poison)},
        "container": {"image": f"/img/{poison}.sif", "binds": [poison], "home": poison, "runs": "program", "cleanenv": True, "env": {"A": poison}},
        "resources": {"gpus": 1},  # --nv
    })  # fmt: skip
    runs = sweep.expand(exp)
    planned = plan_scripts(exp, get_scheduler("slurm", exp.dir), [0], 0, runs=runs)
    words = task_words(planned[0].text, env={"CUDA_VISIBLE_DEVICES": "2,3", "PATH": os.environ["PATH"]}, cwd=tmp_path)
    assert words == [
        "singularity", "exec", "--nv", "--cleanenv", "--env", "CUDA_VISIBLE_DEVICES=2,3", "--bind", poison, "--bind", str(exp.dir.resolve()),
        "--bind", str(tmp_path / poison), "--home", poison, f"/img/{poison}.sif", "python", f"t {poison}.py", f"--x={poison}",
    ]  # fmt: skip
    assert not marker.exists()
    subprocess.run(["bash", "-n"], input=planned[0].text, text=True, check=True)


def test_runs_program_is_only_for_a_users_program(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"name": "p", "output": str(tmp_path / "logs"), "env": {"id": "CartPole-v1"}, "container": {"runs": "program"}}))
    assert main(["sweep", str(config), "--scheduler", "local"]) == 2
    err = capsys.readouterr().err
    assert "container.runs: 'program' runs a user's program in the image and needs algo 'program'" in err and err.count("\n") == 1, err
    assert not (tmp_path / "logs").exists()


# ------------------------------------------------------------------------------------ end to end, through the stand-in

TRAINER = r'''
import json, os, sys
run_dir = os.environ["HPCRL_RUN_DIR"]
seen = {k: v for k, v in os.environ.items() if k.startswith(("HPCRL_", "OMP_", "APPTAINERENV_", "SINGULARITYENV_", "SECRET"))}
seen["argv"] = sys.argv[1:]
seen["cwd"] = os.getcwd()
json.dump(seen, open(os.path.join(run_dir, "seen.json"), "w"))
with open(os.path.join(run_dir, sys.argv[1]), "w") as f:
    for step in range(1, 6):
        f.write(json.dumps({"step": step, "episodic_return": step * float(sys.argv[2])}) + "\n")
'''


@pytest.mark.e2e
def test_a_program_in_the_image_trains_and_evaluates_there_with_its_contract(tmp_path: Path, monkeypatch) -> None:
    """A whole local sweep with `container.runs: program`, `--cleanenv` and a program.eval: hpcrl runs
    on the host; the runtime (the stand-in) is called once to train and once to evaluate, with the
    program's words only, and the program sees HPCRL_* inside although --cleanenv drops the host's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").symlink_to(STANDIN)
    calls = tmp_path / "standin.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPCRL_STANDIN_LOG", str(calls))
    monkeypatch.setenv("SECRET_OF_THE_HOST", "not for the container")
    (tmp_path / "trainer.py").write_text(TRAINER)
    image = tmp_path / "own.sif"
    image.write_text("the user's image, without hpcrl\n")
    data = {
        "name": "own", "algo": "program", "output": str(tmp_path / "logs"), "sweep": {"seeds": [4]}, "resources": {"cpus": 1},
        "container": {"image": str(image), "runtime": "apptainer", "runs": "program", "nv": False, "cleanenv": True},
        "program": {
            "command": [sys.executable, "trainer.py", "episodes.jsonl", "2"], "style": "none", "workdir": str(tmp_path),
            "metrics": {"source": "jsonl", "path": "episodes.jsonl"},
            "eval": {"command": [sys.executable, "trainer.py", "eval.jsonl", "10"], "metrics": {"source": "jsonl", "path": "eval.jsonl"}},
        },
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    assert main(["sweep", str(tmp_path / "c.yaml"), "--scheduler", "local"]) == 0
    exp_dir = tmp_path / "logs" / "own"
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    assert rundir.is_done(rd) and "mean return over 5 evaluation episodes: 30" in (rd / rundir.EVAL_DONE).read_text()
    records = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [r["command"] for r in records] == [
        [sys.executable, "trainer.py", "episodes.jsonl", "2"], [sys.executable, "trainer.py", "eval.jsonl", "10"],
    ]  # fmt: skip
    assert all(r["image"] == str(image) and "--cleanenv" in r["argv"] for r in records)
    seen = json.loads((rd / "seen.json").read_text())  # the eval's view, the last to write it
    assert seen["HPCRL_RUN_DIR"] == str(rd) and seen["HPCRL_SEED"] == "4" and seen["HPCRL_RUN_ID"] == run.run_id
    assert seen["OMP_NUM_THREADS"] == "1" and seen["cwd"] == str(tmp_path)
    assert "SECRET_OF_THE_HOST" not in seen and not any(k.startswith(("APPTAINERENV_", "SINGULARITYENV_")) for k in seen)


def test_contract_variables_cross_cleanenv_in_training(tmp_path: Path) -> None:
    """The train supervisor gives the program HPCRL_* also as APPTAINERENV_/SINGULARITYENV_, so the
    runtime passes them in through --cleanenv; container.env's own prefixed values win."""
    from hpcrl.runtime.program import into_container

    env = into_container({"HPCRL_SEED": "3", "OMP_NUM_THREADS": "2", "APPTAINERENV_OMP_NUM_THREADS": "8", "PATH": "/bin"}, ["HPCRL_SEED", "OMP_NUM_THREADS"])
    assert env["APPTAINERENV_HPCRL_SEED"] == env["SINGULARITYENV_HPCRL_SEED"] == "3"
    assert env["APPTAINERENV_OMP_NUM_THREADS"] == "8" and env["SINGULARITYENV_OMP_NUM_THREADS"] == "2"
    assert "APPTAINERENV_PATH" not in env


# ------------------------------------------------------------------------------------ the command, where the job runs


def test_a_bare_command_is_resolved_at_sweep_time_so_the_jobs_path_does_not_matter(tmp_path: Path, monkeypatch) -> None:
    """Grid Engine starts jobs with a minimal PATH: `python` found by the login shell was missing in
    the job. The script shows the path found at sweep time and runs under a PATH without it."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "mytrainer").write_text("#!/bin/sh\necho trained \"$@\"\n")
    (bin_dir / "mytrainer").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    exp = experiment_from_dict({"name": "p", "algo": "program", "output": str(tmp_path / "logs"), "program": {"command": ["mytrainer"], "params": {"lr": 1}}})
    text = plan_scripts(exp, get_scheduler("sge", exp.dir), [0], 0, runs=sweep.expand(exp))[0].text
    assert f"  1) PROGRAM=({bin_dir / 'mytrainer'} --lr 1) ;;" in text
    words = task_words(text, env={"PATH": "/usr/bin:/bin"})
    assert subprocess.run(words, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True).stdout == "trained --lr 1\n"
    # In the image the name is the image's: kept as written, not looked up here.
    exp.container.image, exp.container.runs = "/images/x.sif", "program"
    text = plan_scripts(exp, get_scheduler("sge", exp.dir), [0], 0, runs=sweep.expand(exp))[0].text
    assert "/images/x.sif mytrainer --lr 1) ;;" in text


# ------------------------------------------------------------------------------------ program.workdir


def test_workdir_takes_run_placeholders_and_each_run_gets_its_own(tmp_path: Path) -> None:
    from hpcrl.runtime.program import train_program

    program = tmp_path / "cwd.py"
    program.write_text("import os, pathlib\npathlib.Path('runs').mkdir()\nopen(os.path.join(os.environ['HPCRL_RUN_DIR'], 'cwd'), 'w').write(os.getcwd())\n")
    data = {"name": "w", "algo": "program", "output": str(tmp_path / "logs"), "sweep": {"seeds": [0, 1]},
            "program": {"command": [sys.executable, str(program)], "workdir": "{run_dir}/work", "metrics": {"source": "jsonl", "path": "x"}}}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    exp = load_experiment(tmp_path / "c.yaml")
    assert exp.program.workdir == "{run_dir}/work"  # absolute once filled: not made relative to here
    expdir.write_experiment(exp, sweep.expand(exp), {})
    for run in load_runs(exp.dir):  # as `hpcrl train` runs each task
        assert train_program(exp.dir, run, out=io.StringIO()) == 0
        rd = run_dir(exp.dir, run.run_id)
        assert (rd / "cwd").read_text() == str(rd.resolve() / "work") and (rd / "work" / "runs").is_dir()


def test_a_relative_workdir_with_placeholders_is_anchored_where_the_sweep_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = {"name": "w", "algo": "program", "output": "logs", "program": {"command": ["t"], "workdir": "scratch/seed-{seed}"}, "container": {"image": "/i.sif"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    exp = load_experiment(tmp_path / "c.yaml")
    assert exp.program.workdir == str(tmp_path.resolve() / "scratch" / "seed-{seed}")
    text = plan_scripts(exp, get_scheduler("slurm", exp.dir), [0], 0, runs=sweep.expand(exp))[0].text
    assert f"--bind {tmp_path.resolve() / 'scratch'} " in text  # the directory every run's workdir lies in


@pytest.mark.parametrize("workdir,message", [("{params.lr}", "unknown placeholder {params.lr}"), ("{rundir}", "unknown placeholder {rundir}")])
def test_workdir_refuses_other_placeholders(tmp_path: Path, capsys, workdir: str, message: str) -> None:
    data = {"name": "w", "algo": "program", "output": str(tmp_path / "logs"), "program": {"command": ["t"], "params": {"lr": 1}, "workdir": workdir}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    assert main(["sweep", str(tmp_path / "c.yaml"), "--scheduler", "local"]) == 2
    err = capsys.readouterr().err
    assert f"program.workdir: {message}" in err and err.count("\n") == 1, err


# ------------------------------------------------------------------------------------ the runtime, where the job runs


def program_in_image(tmp_path: Path, runtime: str) -> Path:
    image = tmp_path / "own.sif"
    image.write_text("an image\n")
    data = {
        "name": "rt", "algo": "program", "output": str(tmp_path / "logs"), "sweep": {"seeds": [0]},
        "container": {"image": str(image), "runtime": runtime, "runs": "program"}, "program": {"command": ["python", "train.py"]},
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "c.yaml"


def test_the_container_runtime_is_resolved_at_sweep_time_so_the_jobs_path_does_not_matter(tmp_path: Path, monkeypatch, capsys) -> None:
    """`container.runs: program`: hpcrl starts the runtime from the job, and Grid Engine's minimal PATH had
    no `apptainer`. The script shows the path found at sweep time, as for a bare program command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").symlink_to(STANDIN)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert main(["sweep", str(program_in_image(tmp_path, "apptainer")), "--scheduler", "sge", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"PROGRAM=({bin_dir / 'apptainer'} exec --bind " in out and f"{tmp_path / 'own.sif'} python train.py)" in out  # no GPU: no --nv


@pytest.mark.parametrize("runtime", ["apptainer", "/opt/nowhere/apptainer"])
def test_a_runtime_missing_at_sweep_time_is_refused_in_one_line(tmp_path: Path, monkeypatch, capsys, runtime: str) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["sweep", str(program_in_image(tmp_path, runtime)), "--scheduler", "sge"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"hpcrl: error: container.runtime: {runtime} is not ") and "Traceback" not in err, err
    assert not (tmp_path / "logs").exists()


def test_the_container_runtime_may_be_an_absolute_path(tmp_path: Path, capsys) -> None:
    """A site's own install, off the PATH a job gets: the path is taken as it is."""
    runtime = tmp_path / "site" / "apptainer"
    runtime.parent.mkdir()
    runtime.symlink_to(STANDIN)
    assert main(["sweep", str(program_in_image(tmp_path, str(runtime))), "--scheduler", "sge", "--dry-run"]) == 0
    assert f"PROGRAM=({runtime} exec --bind " in capsys.readouterr().out
    with pytest.raises(Exception, match=r"container.runtime: expected one of 'singularity', 'apptainer' or an absolute path to one, got 'bin/apptainer'"):
        load_experiment(program_in_image(tmp_path, "bin/apptainer"))
