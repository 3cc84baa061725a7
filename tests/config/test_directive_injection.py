"""Issue 12 item 1: no value reaches a scheduler directive line (`#SBATCH`, `#$`) except through the
`directive` / `directive_line` template filters, which refuse what a directive cannot carry.

The Experiment is built past config validation (fields set after loading), as a template a user
edits or a caller of the Python API would: the filters are the backstop. A refusal is a one-line
ConfigError (exit 2 from the CLI) before anything is written or submitted, and on the real
schedulers the poisoned command never runs.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import write_config

from hpcrl.config.experiment import Experiment
from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.schedulers import get_scheduler
from hpcrl.submit.pipeline import plan_scripts, submit_experiment

CONFORMANCE = Path(__file__).resolve().parents[1] / "data" / "conformance.yaml"

# (scheduler, where the value goes) for every field a directive line carries.
COUNTS = ["resources.cpus", "resources.gpus", "resources.signal_seconds", "resources.max_concurrent"]
FIELDS = {
    "slurm": ["resources.partition", "resources.account", "resources.extra", "name", "output", *COUNTS],
    "sge": ["resources.queue", "resources.sge_pe", "resources.sge_mem_resource", "resources.sge_gpu_resource", "resources.extra", "name", "output", *COUNTS],
}


def poisons(marker: Path) -> list[str]:
    """A line break that starts a command, and a space that starts another option."""
    return [f"gpu\ntouch {marker}", f"gpu\r\ntouch {marker}", "gpu --uid=0", "gpu\t--begin=now+1year"]


def poison(exp: Experiment, field: str, value: str) -> None:
    """Set `field` to `value` on a loaded Experiment, past the config's own validation."""
    if field == "name":
        exp.name = value
    elif field == "output":
        exp.output = f"{exp.output}/{value}"
    elif field == "resources.extra":
        exp.resources.extra = ["--comment=ok", value] if "\n" in value else [f"--x\n{value}"]
    else:
        setattr(exp.resources, field.split(".", 1)[1], value)


def loaded(tmp_path: Path) -> Experiment:
    # cpus > 1 and gpus > 0, so that the parallel-environment and GPU-resource lines render at all.
    return load_experiment(write_config(tmp_path, {"resources": {"cpus": 2, "gpus": 1, "partition": "p", "account": "a", "queue": "q"}}))


@pytest.mark.parametrize("scheduler", sorted(FIELDS))
def test_every_directive_field_poisoned_is_refused_at_render(scheduler: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    refused = []
    # One scheduler for every case: it asks the cluster its array limit once (qconf: ~0.3 s a call).
    backend = get_scheduler(scheduler, loaded(tmp_path).dir)
    for field in FIELDS[scheduler]:
        for value in poisons(marker):
            exp = loaded(tmp_path)
            poison(exp, field, value)
            with pytest.raises(ConfigError) as info:
                plan_scripts(exp, backend, [0, 1], 0)
            message = str(info.value)
            # Words are refused by the template filter; counts already by the planner, by key.
            assert "\n" not in message and (f"{scheduler}.sh.j2" in message or message.startswith(field)), message
            refused.append((field, value))
    assert len(refused) == len(FIELDS[scheduler]) * 4
    # The unpoisoned config renders: the refusals above are about the values, not the templates.
    exp = loaded(tmp_path)
    assert plan_scripts(exp, get_scheduler(scheduler, exp.dir), [0, 1], 0)


def test_a_template_a_user_edits_still_goes_through_the_filter(tmp_path: Path) -> None:
    """A user's slurm.sh.j2 that puts a value on a directive line with `directive` gets the same refusal;
    the filter is the one way, so a template that forgets it is visibly out of line in review."""
    (tmp_path / "job_templates").mkdir()
    (tmp_path / "job_templates" / "slurm.sh.j2").write_text(
        '{% extends "_job.sh.j2" %}{% block directives %}#SBATCH --qos={{ res.partition|directive }}\n{% endblock %}'
    )
    exp = loaded(tmp_path)
    exp.resources.partition = f"x\ntouch {tmp_path / 'pwned'}"
    with pytest.raises(ConfigError, match=r"slurm\.sh\.j2, line 1: a directive value cannot hold a line break"):
        plan_scripts(exp, get_scheduler("slurm", exp.dir), [0], 0, cwd=tmp_path)


def test_the_cli_refuses_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """Through `hpcrl sweep` with a user template that adds a poisoned directive line: exit 2, one line."""
    (tmp_path / "job_templates").mkdir()
    (tmp_path / "job_templates" / "sge.sh.j2").write_text(
        '{% extends "_job.sh.j2" %}{% block directives %}#$ -N {{ (job_name ~ " -l h=evil")|directive }}\n{% endblock %}'
    )
    config = write_config(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "sweep", str(config), "--scheduler", "sge"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "must be one word" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists()


def submit_poisoned(scheduler: str, tmp_path: Path, field: str) -> Path:
    """Submit the conformance config with `field` poisoned to the real scheduler; return the marker path."""
    marker = tmp_path / f"pwned-{scheduler}-{field.replace('.', '_')}"
    exp = load_experiment(CONFORMANCE, [f"output={tmp_path / 'logs'}", "sweep.seeds=[0]", "resources.cpus=2"])
    poison(exp, field, f"x\ntouch {marker}")
    with pytest.raises(ConfigError):
        submit_experiment(exp, scheduler, out=io.StringIO())
    assert not exp.dir.exists(), "a refused sweep wrote into the experiment"
    return marker


@pytest.mark.slurm
def test_a_poisoned_partition_never_runs_on_real_slurm(slurm_cluster: None, tmp_path: Path) -> None:
    markers = [submit_poisoned("slurm", tmp_path, field) for field in ("resources.partition", "resources.account", "resources.extra")]
    time.sleep(3)  # what an accepted job would have needed to run its first line on the idle test cluster
    assert not any(m.exists() for m in markers)
    # No script of this test was ever submitted (squeue -t all lists finished jobs for an hour here).
    assert str(tmp_path) not in subprocess.run(["squeue", "-h", "-t", "all", "-o", "%o"], capture_output=True, text=True, check=True).stdout


@pytest.mark.sge
def test_a_poisoned_queue_never_runs_on_real_grid_engine(sge_cluster: None, tmp_path: Path) -> None:
    markers = [submit_poisoned("sge", tmp_path, field) for field in ("resources.queue", "resources.sge_pe", "resources.sge_mem_resource", "resources.extra")]
    time.sleep(3)
    assert not any(m.exists() for m in markers)
