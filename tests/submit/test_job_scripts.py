"""Rendered job scripts: pinned by golden files, valid bash, and immune to shell injection."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import write_config

from hpcrl.config.load import load_experiment
from hpcrl.schedulers import get_scheduler
from hpcrl.submit.jobplan import job_context
from hpcrl.submit.pipeline import plan_scripts
from hpcrl.sweep import runs as sweep
from hpcrl.templates import render

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "jobs"
# Fixed paths so the golden files do not depend on where the tests run.
PINNED = ["output=/scratch/hpcrl", "python=/opt/venv/bin/python"]


def rendered(config: Path, scheduler: str) -> dict[str, str]:
    image = ["container.image=/images/habitat.sif"] if config.stem.startswith("habitat") else []
    workdir = ["program.workdir=/work/project"] if "algo: program" in config.read_text() else []
    exp = load_experiment(config, PINNED + image + workdir)
    planned = plan_scripts(exp, get_scheduler(scheduler, exp.dir), [0, 1, 2], 0, runs=sweep.expand(exp))
    return {Path(p.script).name: p.text for p in planned}


@pytest.mark.parametrize(
    "config,scheduler",
    [
        ("habitat_ppo", "sge"), ("habitat_ppo", "slurm"), ("habitat_ddppo", "sge"), ("habitat_ddppo", "slurm"),
        ("cartpole_ppo", "local"), ("cartpole_ppo", "slurm"), ("habitat_own_trainer", "sge"),
    ],
)
def test_golden_scripts(config: str, scheduler: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any change to a rendered script is deliberate: regenerate with HPCRL_UPDATE_GOLDEN=1 and review the diff.
    The set of scripts is compared too: a stage that is no longer planned (or a new one) is noticed."""
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the sweep's, which the scripts carry
    scripts = rendered(REPO / "configs" / f"{config}.yaml", scheduler)
    prefix = f"{config}.{scheduler}."
    if os.environ.get("HPCRL_UPDATE_GOLDEN"):
        for stale in GOLDEN.glob(prefix + "*"):
            stale.unlink()
    for name, text in scripts.items():
        golden = GOLDEN / f"{prefix}{name}"
        if os.environ.get("HPCRL_UPDATE_GOLDEN"):
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
        assert text == golden.read_text(), f"{golden.name} differs from the rendered script"
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert sorted(prefix + name for name in scripts) == sorted(p.name for p in GOLDEN.glob(prefix + "*"))


def test_habitat_scripts_carry_what_the_cluster_needs() -> None:
    sge = rendered(REPO / "configs" / "habitat_ppo.yaml", "sge")["train-0-0.sh"]
    assert "#$ -t 1-3" in sge and "#$ -tc 8" in sge and "#$ -l gpu=1" in sge and "#$ -q gpu.q" in sge
    assert "#$ -pe smp 8" in sge and "#$ -notify" in sge and "#$ -r y" in sge
    assert "*:/opt/cuda-9.2/lib64:*) ;;" in sge  # the CUDA path is only prepended when absent
    assert "export SINGULARITYENV_MAGNUM_LOG=quiet" in sge and "export APPTAINERENV_GLOG_minloglevel=2" in sge
    assert "singularity exec --nv --bind /work:/work --bind /storage:/storage" in sge and "--home /work/home /images/habitat.sif hpcrl" in sge
    slurm = rendered(REPO / "configs" / "habitat_ppo.yaml", "slurm")["train-0-0.sh"]
    assert "#SBATCH --array=1-3%8" in slurm and "#SBATCH --gres=gpu:1" in slurm and "#SBATCH --signal=B:USR1@600" in slurm
    assert "scontrol requeue" in slurm


def test_the_sweep_s_pythonpath_reaches_the_job_and_the_image_sees_the_user_s_part_of_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative entry is made absolute; a directory of one's own is bound into the image, one in the image's own
    system trees (a module system's site-packages under /usr) is not: bound, it would hide the image's packages."""
    own = tmp_path / "mine"
    own.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["mine", "/usr/lib/python3/dist-packages", "mine"]))
    script = rendered(REPO / "configs" / "habitat_ppo.yaml", "sge")["train-0-0.sh"]
    assert f"export PYTHONPATH={own}:/usr/lib/python3/dist-packages\"${{PYTHONPATH:+:${{PYTHONPATH}}}}\"" in script
    assert f"--bind {own} " in script and "--bind /usr/lib/python3/dist-packages" not in script


def test_ddppo_scripts_start_every_rank_of_a_node() -> None:
    """configs/habitat_ddppo.yaml (4 ranks on one 4-GPU node): Slurm asks for 4 tasks on 1 node and
    starts them with srun, each in its own container; Grid Engine asks for a PE of cpus x ranks slots
    and hpcrl's own launcher starts the ranks. Evaluation and aggregation stay one process."""
    scripts = {s: rendered(REPO / "configs" / "habitat_ddppo.yaml", s) for s in ("slurm", "sge")}
    slurm = scripts["slurm"]["train-0-0.sh"]
    for directive in ("--nodes=1", "--ntasks-per-node=4", "--cpus-per-task=4", "--gres=gpu:4", "--mem=65536M", "--requeue", "--signal=B:USR1@600"):
        assert f"#SBATCH {directive}\n" in slurm, directive
    assert 'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in slurm
    launch = next(line for line in slurm.splitlines() if " srun --kill-on-bad-exit=1 " in line)
    # Every process below a rank carries the start's mark, in the container too (--cleanenv passes SINGULARITYENV_*).
    mark = 'HPCRL_STEP_MARK="$HPCRL_LAUNCH_ID" SINGULARITYENV_HPCRL_STEP_MARK="$HPCRL_LAUNCH_ID" APPTAINERENV_HPCRL_STEP_MARK="$HPCRL_LAUNCH_ID" '
    assert launch.startswith(mark + "srun --kill-on-bad-exit=1 --nodes=1 --ntasks=4 --ntasks-per-node=4 --cpus-per-task=4 ")
    assert '"${HPCRL[@]}" train ' in launch and "--ranks" not in slurm  # srun starts the ranks: no launcher of hpcrl's
    assert slurm.index("export MASTER_ADDR=") < slurm.index(launch) and "HPCRL=(singularity exec --nv " in slurm
    # After a failed ranks' step (not a requeue), one task on each node ends what carries the mark there.
    after = slurm[slurm.index(launch) :]
    assert 'if [ "$status" -ne 0 ] && [ "$status" -ne 99 ]; then\n' in after
    assert ' srun --overlap --kill-on-bad-exit=0 --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=1 "${HPCRL[@]}" end-leftovers --mark "$HPCRL_LAUNCH_ID" ' in after
    assert "export HPCRL_STEP_MARK" not in slurm  # the job shell has none: the step after would end it
    sge = scripts["sge"]["train-0-0.sh"]
    for directive in ("-pe smp 16", "-l gpu=4", "-l mem_free=65536M", "-q gpu.q", "-notify", "-r y"):
        assert f"#$ {directive}\n" in sge, directive
    assert '"${HPCRL[@]}" train /scratch/hpcrl/habitat_ddppo --manifest jobs/0-0.tasks --task "$TASK_ID" --ranks 4 &' in sge
    assert "srun" not in sge and "MASTER_ADDR=" not in sge
    for scheduler, texts in scripts.items():
        assert sorted(texts) == ["aggregate-0.sh", "eval-0-0.sh", "train-0-0.sh"], scheduler
        for name in ("eval-0-0.sh", "aggregate-0.sh"):
            text = texts[name]
            assert "srun" not in text and "--ranks" not in text and "ntasks" not in text, (scheduler, name)
            assert "-pe smp 16" not in text and "gpu=4" not in text and "gpu:4" not in text, (scheduler, name)


def test_cuda_guard_prepends_once(tmp_path: Path) -> None:
    exp = load_experiment(write_config(tmp_path, {"cuda": {"lib_path": "/opt/cuda/lib64"}}))
    script = render("job_templates", "local.sh.j2", {"scheduler": "local", **job_context(exp, "train", ["--version"], 0, tmp_path)})
    guard = script[script.index("case") : script.index("esac") + 4] + '\necho "$LD_LIBRARY_PATH"'
    run = lambda value: subprocess.run(["bash", "-c", guard], env={"PATH": os.environ["PATH"], **value}, capture_output=True, text=True).stdout.strip()
    assert run({}) == "/opt/cuda/lib64"
    assert run({"LD_LIBRARY_PATH": "/usr/lib"}) == "/opt/cuda/lib64:/usr/lib"
    assert run({"LD_LIBRARY_PATH": "/usr/lib:/opt/cuda/lib64"}) == "/usr/lib:/opt/cuda/lib64"


POISON = "$(touch {marker})`touch {marker}`;touch {marker}"


def test_config_values_never_execute_in_job_scripts(tmp_path: Path) -> None:
    """Every string field that reaches a shell carries a command; running the script must not run it."""
    marker = tmp_path / "owned"
    poison = POISON.format(marker=marker)
    standin_dir = tmp_path / "bin"
    standin_dir.mkdir()
    argv_log = tmp_path / "argv.txt"
    # A stand-in for the container runtime (none exists on this machine): it records its argv.
    (standin_dir / "singularity").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {argv_log}\nprintenv > {tmp_path}/env.txt\n')
    (standin_dir / "singularity").chmod(0o755)
    # A stand-in for environment modules that loads anything: the poisoned module name must pass through it.
    (standin_dir / "module").write_text("#!/bin/bash\nexit 0\n")
    (standin_dir / "module").chmod(0o755)
    image = tmp_path / f"img {poison}.sif"
    config = write_config(
        tmp_path,
        {
            "env": {"id": poison, "num_envs": 2},
            "container": {"image": str(image), "binds": [poison], "home": poison, "env": {"INJECT": poison}},
            "cuda": {"lib_path": poison, "modules": [poison]},
            "resources": {"gpus": 1},  # --nv: a stage with a GPU
        },
    )
    exp = load_experiment(config)
    script = render("job_templates", "local.sh.j2", {"scheduler": "local", **job_context(exp, "train", ["train", poison, "--manifest", poison], 3, tmp_path)})
    path = tmp_path / "job.sh"
    path.write_text(script)
    env = {"PATH": f"{standin_dir}:{os.environ['PATH']}", "HPCRL_TASK_ID": "1", "HOME": str(tmp_path)}
    subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert not marker.exists()
    argv = argv_log.read_text().splitlines()
    assert argv[:2] == ["exec", "--nv"] and argv.count(poison) >= 3  # bind, home, train argument, manifest
    assert str(image) in argv and argv[-2:] == ["--task", "1"]
    assert f"SINGULARITYENV_INJECT={poison}" in (tmp_path / "env.txt").read_text()


def test_user_job_templates_override_the_bundled_ones(tmp_path: Path) -> None:
    (tmp_path / "job_templates").mkdir()
    shutil.copy(REPO / "job_templates" / "_job.sh.j2", tmp_path / "job_templates" / "_job.sh.j2")
    (tmp_path / "job_templates" / "slurm.sh.j2").write_text('{% extends "_job.sh.j2" %}{% block directives %}#SBATCH --qos=site-special\n{% endblock %}')
    exp = load_experiment(write_config(tmp_path), PINNED)
    planned = plan_scripts(exp, get_scheduler("slurm", exp.dir), [0], 0, cwd=tmp_path)
    assert "#SBATCH --qos=site-special" in planned[0].text
    default = plan_scripts(exp, get_scheduler("slurm", exp.dir), [0], 0, cwd=REPO)
    assert "#SBATCH --qos=site-special" not in default[0].text


def test_dry_run_prints_and_writes_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "sweep", str(config), "--scheduler", "slurm", "--dry-run"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --array=1-2%2" in proc.stdout and "--dependency=aftercorr:$TRAIN_0_0 " in proc.stdout
    assert not (tmp_path / "logs").exists()


def test_a_module_that_does_not_load_stops_the_job(tmp_path: Path) -> None:
    """Issue 12 item 18: `module load` failing (site without that module) must not run hpcrl without CUDA."""
    standin_dir = tmp_path / "bin"
    standin_dir.mkdir()
    ran = tmp_path / "python-ran"
    (standin_dir / "module").write_text('#!/bin/bash\necho "ERROR: Unable to locate a modulefile for $2" >&2\nexit 1\n')
    (standin_dir / "python").write_text(f"#!/bin/bash\ntouch {ran}\n")
    for name in ("module", "python"):
        (standin_dir / name).chmod(0o755)
    config = write_config(tmp_path, {"cuda": {"modules": ["cuda/12.1", "cudnn/9"]}, "python": str(standin_dir / "python")})
    exp = load_experiment(config)
    script = render("job_templates", "local.sh.j2", {"scheduler": "local", **job_context(exp, "train", ["train", "x"], 0, tmp_path)})
    env = {"PATH": f"{standin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and not ran.exists()
    assert "module load cuda/12.1 failed" in proc.stderr and "cudnn" not in proc.stderr
    # With modules that load, the same script runs hpcrl: the check stops only on failure.
    (standin_dir / "module").write_text("#!/bin/bash\nexit 0\n")
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and ran.exists(), proc.stderr


def hpcrl_started(shell: int) -> bool:
    """Whether the job shell's child is the stand-in hpcrl (python running cli.main) yet."""
    try:
        children = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
    except OSError:  # the shell is gone
        return False
    for child in children:
        with contextlib.suppress(OSError):
            if b"cli.main" in Path(f"/proc/{child}/cmdline").read_bytes():
                return True
    return False


@pytest.mark.slow
def test_a_requeue_survives_warnings_that_arrive_as_hpcrl_exits(tmp_path: Path) -> None:
    """The job shell runs hpcrl in the background and passes warnings on; a warning that cuts its `wait` short
    as hpcrl exits left bash with 128+N, or no status at all (255), instead of the 99 that asks for a requeue:
    the run was then neither requeued nor finished (a quarter of the exits under a stream of USR1/USR2). hpcrl
    now leaves its status in HPCRL_EXIT_FILE and the script exits with that."""
    standin_dir = tmp_path / "bin"
    standin_dir.mkdir()
    # `python -m hpcrl ...` runs hpcrl's real entry point, whose work (patched) takes 0.3 s and asks for a requeue.
    body = "import sys, time; from hpcrl import cli; cli._main = lambda argv: (time.sleep(0.3), 99)[1]; sys.exit(cli.main())"
    (standin_dir / "python").write_text(f"#!/bin/bash\ntrap '' USR1 USR2\nexec {sys.executable} -c '{body}'\n")
    (standin_dir / "python").chmod(0o755)
    exp = load_experiment(write_config(tmp_path, {"python": str(standin_dir / "python")}))
    script = tmp_path / "job.sh"
    script.write_text(render("job_templates", "local.sh.j2", {"scheduler": "local", **job_context(exp, "train", ["train", "x"], 0, tmp_path / "logs", requeue=True)}))
    (tmp_path / "logs").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    codes = []
    for _ in range(12):
        job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while job.poll() is None and not hpcrl_started(job.pid) and time.monotonic() < deadline:
            time.sleep(0.005)  # the script sets its trap before it starts hpcrl (and after an `rm`)
        sent = 0
        while job.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(job.pid, (signal.SIGUSR1, signal.SIGUSR2)[sent % 2])
            sent += 1
            time.sleep(0.0005)
        codes.append(job.returncode)
    assert codes == [99] * 12, codes
    assert not list((tmp_path / "logs").iterdir())  # each status file read and removed
