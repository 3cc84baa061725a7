"""`hpcrl status` and `hpcrl cancel` of experiments in which something went: a run directory deleted, a
task that failed before hpcrl could say why, jobs that all ended before the cancel (the hostile-input audit).

- a run whose directory is gone is shown as collect shows it (`missing: no run directory`), the others as
  they are: one lost folder refused the whole experiment;
- a failed task that left no reason in its run is shown by the last line of its job log, which says why;
- `cancel` of an experiment cancels the jobs still pending or running and says how many had ended; of one
  whose jobs all ended it says so and records nothing (it printed "cancelled 3 local jobs"), on every backend.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_status_scale import live_runner, run_cli, synthetic

from hpcrl.schedulers.base import SchedulerError
from hpcrl.schedulers.local import read_state, write_state
from hpcrl.schedulers.sge import SGEScheduler
from hpcrl.schedulers.slurm import SlurmScheduler
from hpcrl.status import LOG_NOTE_CHARS
from hpcrl.store import expdir, rundir
from hpcrl.store.expdir import Job, load_runs, run_dir, write_jobs


def _notes(exp: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, dict]:
    rc, out, err = run_cli(["status", str(exp), "--json"], capsys)
    assert rc == 0 and err == "", err
    return {r["run_id"]: r for r in json.loads(out)["runs"]}


def test_a_run_whose_directory_is_gone_is_shown_missing_and_the_others_as_they_are(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """status read each setting's config from its first run, and refused the experiment when that run's folder
    was gone (".../config.yaml: missing run config"); a setting whose every folder is gone has no config at all."""
    exp = synthetic(tmp_path, settings=2, seeds=3)
    runs = load_runs(exp)
    first, other = runs[0].setting_label, next(r.setting_label for r in runs if r.setting_label != runs[0].setting_label)
    lost = [next(r for r in runs if r.setting_label == first), *(r for r in runs if r.setting_label == other)]
    with live_runner(exp):
        before = _notes(exp, capsys)
        for run in lost:
            shutil.rmtree(run_dir(exp, run.run_id))
        after = _notes(exp, capsys)
        rc, out, _ = run_cli(["status", str(exp), "--runs"], capsys)
    assert rc == 0
    for run in lost:
        assert after[run.run_id]["note"] == rundir.NO_DIRECTORY == "missing: no run directory"  # collect's words
        assert any(run.run_id in line and line.endswith(rundir.NO_DIRECTORY) for line in out.splitlines()), out
    kept = [r.run_id for r in runs if r not in lost]
    assert kept and all(after[k] == before[k] for k in kept)


def test_a_task_that_failed_before_hpcrl_started_is_shown_by_its_logs_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job whose interpreter is not there fails in its shell, before hpcrl can write a FAILED marker: status said
    `train failed: no reason recorded`, where the task's log (jobs/logs/, as the job template names it) says why."""
    exp = synthetic(tmp_path, settings=1, seeds=3)  # three runs, trained and evaluated
    runs = load_runs(exp)
    state = read_state(exp)
    for run, stage in ((runs[0], "train"), (runs[1], "train"), (runs[2], "eval")):
        rd = run_dir(exp, run.run_id)
        for name in ("DONE", "EVAL_DONE") if stage == "train" else ("EVAL_DONE",):
            (rd / name).unlink()
        state["jobs"][f"{stage}-0-0"][str(run.index + 1)].update(state="failed", rc=127)
    write_state(exp, state)
    logs = exp / "jobs" / "logs"
    logs.mkdir()
    shell = f"{exp}/jobs/train-0-0.sh: line 47: /nonexistent/python: No such file or directory"
    (logs / "train-0-0.1.out").write_text("\n".join(f"noise {k}" for k in range(5000)) + f"\n{shell}\n\n")  # longer than what is read
    (logs / "eval-0-0.3.out").write_text("ModuleNotFoundError: No module named 'hpcrl'\n")

    notes = {run_id: r["note"] for run_id, r in _notes(exp, capsys).items()}
    first, second, third = (notes[r.run_id] for r in runs)
    assert first.startswith("train failed: jobs/logs/train-0-0.1.out ends: ...") and first.endswith("/nonexistent/python: No such file or directory")
    assert len(first) == LOG_NOTE_CHARS
    assert second == "train failed: no reason recorded (see the train log under jobs/logs)"  # no log to read: where to look
    assert third == "eval failed: jobs/logs/eval-0-0.3.out ends: ModuleNotFoundError: No module named 'hpcrl'"
    (run_dir(exp, runs[0].run_id) / "FAILED").write_text("RuntimeError: CUDA out of memory\n")
    assert _notes(exp, capsys)[runs[0].run_id]["note"] == "train failed: RuntimeError: CUDA out of memory"  # the run's own reason wins


def test_cancel_cancels_the_jobs_that_have_not_ended_and_says_so_when_none_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = synthetic(tmp_path, settings=1, seeds=3)  # train and eval ended, the aggregate pending
    with live_runner(exp):
        rc, out, _ = run_cli(["cancel", str(exp)], capsys)
    assert (rc, out) == (0, f"{exp}: cancelled 1 local jobs; 2 had ended\n")
    assert expdir.read_cancelled(exp) == ({"aggregate-0"}, set())

    expdir.cancelled_path(exp).unlink()
    state = read_state(exp)
    state["jobs"]["aggregate-0"]["0"]["state"] = "done"
    write_state(exp, state)
    rc, out, _ = run_cli(["cancel", str(exp)], capsys)
    assert (rc, out) == (0, f"{exp}: nothing to cancel: its 3 jobs have all ended\n")
    assert not expdir.cancelled_path(exp).exists()


@pytest.mark.parametrize("cluster", [SlurmScheduler, SGEScheduler], ids=["slurm", "sge"])
def test_cancel_on_a_cluster_asks_what_runs_and_cancels_only_that(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, cluster: type) -> None:
    """The same words on every backend; where the cluster does not answer, every job is cancelled as asked."""
    exp = tmp_path / "exp"
    (exp / "jobs").mkdir(parents=True)
    (exp / "runs.csv").write_text("index,run_id,seed\n")
    name = cluster.name
    write_jobs(exp, [Job("train", "7", name, "jobs/train.sh", 2), Job("eval", "8", name, "jobs/eval.sh", 2), Job("aggregate", "9", name, "jobs/aggregate.sh", 0)])
    answer: dict[str, dict[int, str]] = {"7": {1: "done", 2: "done"}, "8": {1: "done", 2: "running"}, "9": {0: "pending"}}
    asked: list[list[str]] = []

    def query(self: object, job_ids: list[str]) -> dict[str, dict[int, str]]:
        if not answer:
            raise SchedulerError("squeue: no answer within 120 s")
        return {j: answer[j] for j in job_ids if j in answer}

    monkeypatch.setattr(cluster, "query", query)
    monkeypatch.setattr(cluster, "cancel", lambda self, job_ids: asked.append(job_ids))
    rc, out, _ = run_cli(["cancel", str(exp)], capsys)
    assert (rc, out, asked) == (0, f"{exp}: cancelled 2 {name} jobs; 1 had ended\n", [["9", "8"]])  # newest first

    answer.update({"8": {1: "done", 2: "done"}, "9": {0: "failed"}})
    rc, out, _ = run_cli(["cancel", str(exp)], capsys)
    assert (rc, out, len(asked)) == (0, f"{exp}: nothing to cancel: its 3 jobs have all ended\n", 1)

    answer.clear()
    rc, out, _ = run_cli(["cancel", str(exp)], capsys)
    assert (rc, out, asked[-1]) == (0, f"{exp}: cancelled 3 {name} jobs\n", ["9", "8", "7"])
    assert expdir.read_cancelled(exp)[0] == {"7", "8", "9"}
