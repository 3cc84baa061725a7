"""The search modes' seam (hpcrl.sweep.modes): each mode answers which runs a sweep writes, what its
job plan holds, what is in flight and what collect adds, so no caller tests which mode it is."""

from __future__ import annotations

from pathlib import Path

from test_search import config, random_search

from hpcrl.config.load import load_experiment
from hpcrl.store import rundir
from hpcrl.store.expdir import Job, run_dir
from hpcrl.sweep import modes
from hpcrl.sweep.runs import expand

OPTUNA = "    method: optuna\n    n_trials: 6\n    space:\n      train.lr: {type: loguniform, low: 1.0e-4, high: 1.0e-2}\n"


def test_the_mode_follows_sweep_search_method(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    (tmp_path / "o").mkdir()
    grid = load_experiment(config(tmp_path / "g", random_search(2)))
    study = load_experiment(config(tmp_path / "o", OPTUNA))
    assert type(modes.of(grid)) is modes.SearchMode and isinstance(modes.of(study), modes.Optuna)
    assert isinstance(modes.of_config({"sweep": {"search": {"method": "optuna"}}}), modes.Optuna)
    assert type(modes.of_config({"sweep": {"search": None}})) is modes.SearchMode and type(modes.of_config({})) is modes.SearchMode
    assert modes.of(grid).first_workers(grid) == 0 and modes.of(study).first_workers(study) == 2  # resources.max_concurrent: 2
    assert modes.of(grid).planned(grid, 3, 0) == "3 runs"
    assert modes.of(study).planned(study, 0, 2) == "an Optuna study of 6 trials, 2 workers"


def test_a_grid_round_trains_what_is_neither_done_nor_in_flight_and_evaluates_what_lacks_it(tmp_path: Path) -> None:
    exp = load_experiment(config(tmp_path, random_search(4)))
    runs = expand(exp)
    done, evaluated, running = runs[0], runs[1], runs[2]
    for run in (done, evaluated):
        rundir.mark_done(run_dir(exp.dir, run.run_id), 1024)
    rundir.mark(run_dir(exp.dir, evaluated.run_id), rundir.EVAL_DONE)
    rundir.write_manifest(exp.dir, "jobs/train-0.tasks", [running.index, runs[3].index])
    jobs = [Job("train", "7", "slurm", "jobs/train-0.sh", 2, "jobs/train-0.tasks"), Job("train", "8", "sge", "jobs/train-0.sh", 2, "jobs/train-0.tasks")]
    asked: list[list[str]] = []

    def query(ids: list[str]) -> dict[str, dict[int, str]]:
        asked.append(ids)
        return {"7": {1: "running", 2: "failed"}}

    plan = modes.of(exp).round(exp, runs, jobs, "slurm", query)
    assert asked == [["7"]]  # only this scheduler's jobs are asked about
    assert [r.run_id for r in plan.runs] == [r.run_id for r in runs]
    assert plan.todo == [runs[3].index] and plan.eval_todo == [done.index] and plan.workers == 0 and plan.in_flight and plan.submits
    assert plan.what("slurm", [Job("train", "9", "slurm", "jobs/train-1.sh", 1)]) == "submitted 1 of 4 runs and 1 evaluations to slurm (2 done, 1 in flight) as 1 jobs: train 9"


def test_grid_and_random_add_nothing_to_collect_and_hold_no_trials(tmp_path: Path) -> None:
    exp = load_experiment(config(tmp_path, random_search(2)))
    assert modes.of(exp).collect(tmp_path, tmp_path / "results") == ([], None)
    assert modes.of(exp).holders(tmp_path, exp, 0) == {}
    assert not (tmp_path / "results").exists()


def test_actors_whose_learner_ended_keep_no_run_in_flight_and_are_cancelled_when_it_is_submitted_again(tmp_path: Path) -> None:
    """A decoupled run's learner failed; its actors still wait for it (up to learner_timeout_s, 600 s).
    The run is not in flight: it is submitted again at once, and its actors are named for cancelling.
    A run whose learner still runs stays in flight with its actors."""
    exp = load_experiment(config(tmp_path, random_search(2)))
    runs = expand(exp)
    dead, alive = runs[0], runs[1]
    rundir.mark(run_dir(exp.dir, dead.run_id), rundir.FAILED, "train failed: killed")
    rundir.write_manifest(exp.dir, "jobs/0-0.tasks", [dead.index, alive.index])
    rundir.write_manifest(exp.dir, "jobs/0-0.actors.tasks", [dead.index, dead.index, alive.index, alive.index])
    jobs = [Job("learner", "7", "slurm", "jobs/learner-0-0.sh", 2, "jobs/0-0.tasks"), Job("actors", "8", "slurm", "jobs/actors-0-0.sh", 4, "jobs/0-0.actors.tasks")]

    def query(ids: list[str]) -> dict[str, dict[int, str]]:
        return {"7": {1: "failed", 2: "running"}, "8": {1: "running", 2: "running", 3: "running", 4: "running"}}

    plan = modes.of(exp).round(exp, runs, jobs, "slurm", query)
    assert plan.todo == [dead.index] and plan.in_flight
    assert plan.orphans == {"8": [1, 2]}  # the dead learner's actors, not the live one's


def test_a_sweep_cancels_the_orphaned_actors_before_it_submits_their_run_again(tmp_path: Path, monkeypatch) -> None:
    """The sweep asks the scheduler to cancel the dead learner's actors, then submits the run."""
    from hpcrl.schedulers.base import Scheduler
    from hpcrl.store.expdir import write_jobs
    from hpcrl.submit import pipeline

    calls: list[tuple[str, object]] = []

    class Recording(Scheduler):
        name, template = "slurm", "slurm.sh.j2"

        def submit(self, script: Path, size: int, after: list) -> str:
            calls.append(("submit", script.name))
            return "9"

        def query(self, job_ids: list[str]) -> dict[str, dict[int, str]]:
            return {"7": {1: "failed"}, "8": {1: "running", 2: "running"}}

        def cancel(self, job_ids: list[str]) -> None:
            calls.append(("cancel", job_ids))

        def cancel_tasks(self, tasks: dict[str, list[int]]) -> None:
            calls.append(("cancel_tasks", tasks))

        def max_array_size(self) -> int:
            return 1000

    exp = load_experiment(config(tmp_path, random_search(1)))
    (run,) = expand(exp)
    exp.dir.mkdir(parents=True)
    rundir.write_manifest(exp.dir, "jobs/0-0.tasks", [run.index])
    rundir.write_manifest(exp.dir, "jobs/0-0.actors.tasks", [run.index, run.index])
    write_jobs(exp.dir, [Job("learner", "7", "slurm", "jobs/learner-0-0.sh", 1, "jobs/0-0.tasks"), Job("actors", "8", "slurm", "jobs/actors-0-0.sh", 2, "jobs/0-0.actors.tasks")])
    rundir.mark(run_dir(exp.dir, run.run_id), rundir.FAILED, "train failed: killed")
    monkeypatch.setattr(pipeline, "get_scheduler", lambda *args, **kwargs: Recording())
    assert pipeline.submit_experiment(exp, "slurm") == 0
    assert calls[0] == ("cancel_tasks", {"8": [1, 2]}) and calls[1][0] == "submit"
