"""Mutation audit of hpcrl's core contracts with cosmic-ray: a benchmark-style run, not part of CI.

Each target below is a module (optionally narrowed to some of its functions) and a FAST test
selection that exercises it (seconds; never the Slurm, Grid Engine, Redis or learning tests). For
each target the script copies the working tree to a scratch directory (the checkout itself is
never mutated), lets cosmic-ray enumerate the mutants, keeps those inside the target functions,
samples them down to --max-mutants (seeded), checks that the selection passes on the unmutated
copy, then has cosmic-ray apply each mutant and run the selection under a per-mutant timeout. It
prints killed / survived / timeout / skipped counts per target and every survivor's location and
diff.

    pip install 'cosmic-ray>=8.7'
    python benchmarks/mutation.py                                  # every target
    python benchmarks/mutation.py --only sweep io --max-mutants 30 --report /tmp/mutation.txt
    python benchmarks/mutation.py --survivors-of /tmp/mutation.txt  # re-check only what survived then
    python benchmarks/mutation.py --survivors-of /tmp/mutation.txt --tests-under tests/test_contracts.py

On 2 busy cores a mutant costs 10-30 s (a pytest process each): the default run samples up to 60
mutants per target (seeded, by what a mutant is, so two runs of one code pick the same ones) and
stops each target at an even share of --budget-minutes, reporting the rest as "not run".

Why cosmic-ray and not mutmut: mutmut 3 runs the tests in-process on trampolined copies of every
function and picks each mutant's tests from in-process coverage. Most contract tests here drive the
real CLI in a subprocess (`python -m hpcrl ...`); under mutmut those children crash while it
collects coverage (they look for its config in their own working directory) and, even when shimmed,
their coverage is invisible to it, so mutants of the CLI and of what only the CLI reaches come out
as "no tests". cosmic-ray edits the module file itself and runs a plain test command in a
subprocess, so children of the tests run the mutant too, and its timeout kills the whole process
group.

Mutants kept: every cosmic-ray core operator except the combinatorial binary-operator swaps, of
which one natural counterpart per operator is kept (`+` -> `-`, `/` -> `*`, ...): `path / name`
mutated into eleven other operators only measures how often a TypeError is raised.

The markers, manifests, train.csv and run lock live in rundir.py; when a module moves, edit TARGETS. A target whose
module or functions are missing is reported as such, not silently dropped.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path

REPO = Path(__file__).resolve().parent.parent

# One natural counterpart per binary operator; every other binary-operator swap is skipped.
KEPT_BINARY = {"Add_Sub", "Sub_Add", "Mul_Div", "Div_Mul", "FloorDiv_Div", "Mod_FloorDiv", "Pow_Mul", "BitOr_BitAnd", "BitAnd_BitOr", "BitXor_BitOr", "LShift_RShift", "RShift_LShift"}
MARKERS = "not slurm and not sge and not redis and not slow"


@dataclass(frozen=True)
class Target:
    name: str
    module: str
    """Path of the module, relative to the repository root."""
    tests: tuple[str, ...]
    """pytest node ids or files: the tests that exercise this module, seconds in all."""
    functions: tuple[str, ...] = ()
    """Only mutate inside these functions (empty: the whole module)."""




def contracts(*names: str) -> tuple[str, ...]:
    """Tests of tests/test_contracts.py, by name (the contract tests that aim at one module)."""
    return tuple(f"tests/test_contracts.py::test_{name}" for name in names)


IDENTITY = contracts(
    "run_ids_are_stable_ignore_resources_and_follow_what_is_learned",
    "the_order_of_grid_keys_does_not_change_run_ids",
    "a_resweep_keeps_the_index_of_every_run_on_disk",
    "each_run_reads_back_its_own_resolved_config",
    "experiment_yaml_records_the_resolved_config_and_its_provenance",
)
ATOMIC = contracts("an_interrupted_write_keeps_the_old_file_and_leaves_no_temporary", "written_files_follow_the_umask_like_any_other_file", "appended_lines_are_whole_lines")
CHECKPOINTS = contracts(
    "a_checkpoint_write_that_fails_half_way_keeps_the_previous_one",
    "resume_skips_an_unreadable_newest_checkpoint_and_says_so",
    "save_keeps_the_newest_checkpoints_and_resume_reads_the_newest",
    "rng_states_survive_a_checkpoint_and_replay_the_same_draws",
    "numpy_state_round_trips_through_a_weights_only_checkpoint",
    "a_checkpoint_that_would_run_code_is_refused_not_run",
)
QUOTING = contracts("a_quoted_value_reaches_the_shell_as_one_literal_word", "booleans_and_none_reach_the_shell_as_yaml_reads_them_back", "a_template_typo_is_an_error_not_an_empty_string")
TASKS = contracts("eval_task_i_reads_the_run_on_manifest_line_i", "a_task_outside_its_manifest_is_one_line_and_exit_2", "status_reads_done_and_failed_from_the_markers")
COLLECT = "tests/results/test_results.py::test_collect_reports_bad_runs_by_name_and_aggregates_the_rest"
DRY_RUN = "tests/submit/test_job_scripts.py::test_dry_run_prints_and_writes_nothing"
RESTORE = "tests/rl/test_algorithms.py::test_checkpoint_restores_everything_a_run_continues_from"
RESUME = "tests/rl/test_algorithms.py::test_interrupted_dqn_run_resumes_with_its_replay_and_logs_each_step_once"
IDENTITY_UNITS = tuple(f"tests/sweep/test_run_identity.py::test_{name}" for name in (
    "golden_run_id", "one_value_written_several_ways_is_one_run", "operational_keys_keep_the_ids", "learned_keys_change_the_ids",
    "a_grid_over_a_key_that_is_not_learned_still_makes_distinct_runs", "expand_refuses_two_grid_points_that_are_one_run",
    "a_damaged_runs_csv_is_a_config_error_naming_it", "runs_csv_damage_names_the_line", "the_same_config_swept_again_stays_one_generation",
    "only_the_newest_generation_is_current_whatever_the_row_order",
))  # fmt: skip
LIFETIMES = ("tests/store/test_rundir.py", "tests/store/test_run_lifetimes.py", "tests/store/test_run_files_edges.py")  # checkpoints, train.csv, the run lock: seconds
PROGRAM = ("tests/runtime/test_program_supervision.py", "tests/runtime/test_program_metrics.py")  # the local program tests of issue 25: seconds each
# The fast in-process tests first: pytest -x stops at the first failure, so most mutants cost seconds.
STUDY_UNITS = (*(f"tests/sweep/test_study.py::test_{name}" for name in (
    "each_pruner_name_is_its_optuna_pruner_and_judges_from_the_end_of_the_warm_up", "a_trial_whose_training_failed_is_told_failed_not_scored_from_the_rows_it_logged",
    "a_journal_damaged_mid_file_is_refused_in_one_line", "reporter_reports_percent_of_budget_and_prunes_a_poor_trial",
)), "tests/sweep/test_search.py::test_a_random_search_is_runs_not_an_optuna_study")  # fmt: skip
STUDY = STUDY_UNITS + tuple(f"tests/sweep/test_study.py::test_{name}" for name in (
    "a_worker_killed_while_another_works_is_shown_failed_and_restarted_by_the_next_sweep", "a_record_left_by_a_worker_of_an_earlier_study_is_not_resumed_in_the_new_one",
    "an_rdb_storage_works_and_a_relative_sqlite_file_is_in_the_experiment", "a_storage_that_cannot_be_a_study_is_refused_in_one_line_and_nothing_is_written",
    "a_torn_journal_record_is_set_aside_by_a_worker_and_by_a_resweep", "an_append_after_a_torn_record_sets_it_aside_first_and_a_changed_config_opens",
))  # fmt: skip
SELFPLAY = tuple(f"tests/distributed/test_distributed_selfplay.py::test_{name}" for name in (
    "self_play_sends_whole_games_and_the_trainer_learns_at_the_simple_modes_ratio", "the_budget_cuts_the_last_batch_and_counts_the_part_of_a_game_that_came_in",
    "the_trainer_refuses_batches_that_would_poison_training", "a_requeued_trainer_resumes_weights_optimizer_window_version_and_credit",
    "status_line_shows_games_and_positions_per_second", "bad_decoupled_settings_are_refused_in_one_line",
))  # fmt: skip
KEEPER = (*(f"tests/runtime/test_program_supervision.py::test_{name}" for name in (  # keeper.py, the processes between hpcrl and a program
    "a_trainer_below_a_wrapper_dies_when_its_keeper_is_killed_whoever_else_is", "a_warning_to_every_process_of_the_job_reaches_the_program_once_as_its_stop_signal",
    "the_run_ends_when_the_program_ends_and_what_it_left_is_ended_and_named", "a_trainer_under_a_wrapper_that_does_not_exec_it_dies_with_hpcrl_however_hpcrl_dies",
    "the_program_itself_dies_of_its_death_signal_when_every_process_of_hpcrl_is_killed_at_once",
)), "tests/runtime/test_keeper.py", "tests/runtime/test_program_wrapper.py::test_a_program_missing_inside_the_job_is_one_line",
    "tests/runtime/test_program_wrapper.py::test_a_failing_program_is_failed_with_its_last_line_and_the_tail_of_its_output")  # fmt: skip
ENV_OUTPUT = ("tests/rl/test_env_output.py", "tests/rl/test_env_workers.py::test_an_env_that_returns_what_its_space_cannot_hold_is_named")
SYNC_BOUND = tuple(f"tests/rl/test_env_workers.py::test_{name}" for name in (
    "a_sync_env_that_hangs_in_the_trainers_own_process_fails_within_its_bound", "a_sync_env_is_bounded_in_a_process_where_no_other_alarm_is_set", "the_video_env_in_the_trainers_own_process_is_bounded_too",
    "a_bounded_call_keeps_another_alarm_of_the_process", "a_sync_env_stepped_from_a_background_thread_is_refused_in_one_line",
))  # fmt: skip
OPENSPIEL_PARAMS = tuple(f"tests/games/test_openspiel_games.py::test_{name}" for name in (
    "openspiel_parameters_are_checked_in_one_line_before_openspiel_sees_them", "openspiel_parameters_of_the_declared_types_load", "a_crash_of_openspiel_is_its_child_process_s",
))  # fmt: skip
STRENGTH_FILES = tuple(f"tests/results/test_strength_results.py::test_{name}" for name in (
    "the_one_reader_of_each_strength_file_names_the_damaged_line", "the_strength_readers_take_whole_files_and_a_log_s_torn_last_line",
    "a_missing_or_corrupt_strength_file_is_named_and_the_rest_reported",
))  # fmt: skip
NODE_FIT = ("tests/schedulers/test_node_fit.py", "tests/schedulers/test_sge_pe.py", "tests/schedulers/test_scheduler_parsing.py")
STATUS = "tests/schedulers/test_local_pipeline.py::test_detach_status_and_cancel"  # ~12 s: the fastest test that runs tasks by manifest
TARGETS = [
    Target("sweep", "hpcrl/sweep/runs.py", (*IDENTITY, *IDENTITY_UNITS, *TASKS, "tests/config/test_config.py", "tests/store/test_run_files_edges.py", DRY_RUN, COLLECT)),
    Target("checkpoint", "hpcrl/rl/checkpoint.py", (*CHECKPOINTS, *LIFETIMES, RESTORE, RESUME)),
    Target("io", "hpcrl/io.py", (*ATOMIC, *CHECKPOINTS[:1], "tests/store/test_run_files_edges.py", RESTORE, COLLECT, DRY_RUN)),
    Target("templates", "hpcrl/templates.py", (*QUOTING, "tests/submit/test_job_scripts.py")),
    Target("rundir", "hpcrl/store/rundir.py", (*TASKS, *contracts("a_retried_run_is_not_left_marked_failed_while_it_trains_again", "actor_tasks_outside_their_manifest_are_refused"),
                                           *LIFETIMES, COLLECT, RESUME)),
    Target("manifest:stages", "hpcrl/stages.py", (*TASKS, STATUS), ("task_run",)),
    # issue 25's audit: a user's program, its metrics, Optuna, DD-PPO's collectives, status selections
    Target("program", "hpcrl/runtime/program.py", PROGRAM),
    Target("program_spec", "hpcrl/config/program_spec.py", ("tests/config/test_program_config.py", "tests/image/test_program_container.py")),
    Target("metrics", "hpcrl/runtime/metrics.py", ("tests/runtime/test_metrics_readers.py", "tests/runtime/test_program_metrics.py")),
    Target("study", "hpcrl/sweep/study.py", STUDY),
    Target("study_worker", "hpcrl/sweep/study_worker.py", STUDY),
    Target("ddp", "hpcrl/rl/ddp.py", ("tests/rl/test_ddppo.py::test_a_warning_on_one_rank_stops_every_rank_and_rank_0_gathers_every_ranks_episodes",
                                    "tests/rl/test_ddppo.py::test_two_ranks_of_4_envs_take_the_step_of_one_rank_of_8")),
    Target("status", "hpcrl/status.py", ("tests/test_status_selection.py", "tests/test_status_scale.py")),
    # the self-play trainer's units (tests/distributed/test_distributed_selfplay.py's cluster test is not one), the experiment directory
    Target("selfplay", "hpcrl/distributed/selfplay.py", SELFPLAY),
    Target("expdir", "hpcrl/store/expdir.py", (*IDENTITY_UNITS, *TASKS, "tests/store/test_run_files_edges.py", COLLECT)),
    # issue 37's audit: what kills, bounds and checks a run's processes and inputs
    Target("keeper", "hpcrl/runtime/keeper.py", KEEPER),
    Target("lifeline", "hpcrl/runtime/lifeline.py", ("tests/runtime/test_lifeline.py", "tests/runtime/test_launch.py::test_ranks_die_with_a_launcher_killed_alone",
                                                   "tests/rl/test_env_workers.py::test_env_workers_die_with_a_trainer_killed_while_one_hangs")),
    Target("env_output", "hpcrl/rl/env_output.py", ENV_OUTPUT),
    Target("env_deadline", "hpcrl/rl/env_deadline.py", SYNC_BOUND),
    Target("openspiel_params", "hpcrl/games/openspiel_params.py", OPENSPIEL_PARAMS),
    Target("strength_readers", "hpcrl/store/rundir.py", STRENGTH_FILES, ("read_strength", "read_ladder", "_read_table", "_game_counts")),
    Target("beyond_returns", "hpcrl/games/__init__.py", ("tests/games/test_game_protocol.py::test_the_returns_range_includes_its_bound_and_its_rounding_and_nothing_beyond", *SELFPLAY[2:3],
                                                  "tests/rl/test_alphazero.py::test_a_bad_game_is_refused_at_sweep_time_in_one_line"), ("beyond_returns",)),
    Target("node_fit:slurm", "hpcrl/schedulers/slurm.py", NODE_FIT, ("refuse", "_node_rows", "_no_node_holds", "gres_gpus")),
    Target("node_fit:sge", "hpcrl/schedulers/sge.py", NODE_FIT, ("refuse", "_read_held", "host_slots", "offered", "complex_value")),
]


@dataclass
class Outcome:
    target: Target
    counts: Counter
    survivors: list[str]
    note: str = ""
    wall_s: float = 0.0


def _tool(name: str) -> str:
    """A cosmic-ray entry point beside the running interpreter (the venv it is installed in)."""
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else name


def scratch_copy(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked-but-not-ignored files), nothing else."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def function_names(module: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(module.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def kept_operator(name: str) -> bool:
    m = re.fullmatch(r"core/ReplaceBinaryOperator_(\w+)", name)
    return m is None or m.group(1) in KEPT_BINARY


def test_command(target: Target, root: Path) -> str:
    """pytest on the target's selection in the copy at `root`.

    Its tmp_path lives beside the copy and sorts before it, as /tmp sorts before a checkout under
    /home or /work: code that compares a user's directory with the bundled one (templates'
    search path) must see the same order as in a real checkout.
    """
    temp = root.parent / "pytest"
    return shlex.join([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--basetemp={temp}", "-m", MARKERS, *target.tests])


def run_target(target: Target, snapshot: Path, args: argparse.Namespace, budget_s: float) -> Outcome:
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    began = time.monotonic()
    counts: Counter = Counter()
    note = ""
    with tempfile.TemporaryDirectory(prefix=f"hpcrl-mutation-{target.name.replace(':', '-')}-") as tmp:
        root = Path(tmp) / "tree"
        shutil.copytree(snapshot, root, symlinks=True)
        module = root / target.module
        if not module.exists():
            return Outcome(target, counts, [], f"module {target.module} is missing: edit TARGETS")
        missing = set(target.functions) - function_names(module)
        if missing:
            return Outcome(target, counts, [], f"functions {sorted(missing)} are not in {target.module}: edit TARGETS")
        present = [t for t in target.tests if (root / t.split("::")[0]).exists() and t.startswith(args.tests_under)]
        if not present:
            return Outcome(target, counts, [], "none of its tests exist")
        target = Target(target.name, target.module, tuple(present), target.functions)

        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
        t0 = time.monotonic()
        base = subprocess.run(shlex.split(test_command(target, root)), cwd=root, env=env, capture_output=True, text=True)
        baseline_s = time.monotonic() - t0
        if base.returncode != 0:
            return Outcome(target, counts, [], f"baseline fails on the unmutated code:\n{base.stdout[-2000:]}{base.stderr[-2000:]}", time.monotonic() - began)
        timeout = max(args.min_timeout, args.timeout_factor * baseline_s)

        config = root / "mutation.toml"
        config.write_text(f'[cosmic-ray]\nmodule-path = "{target.module}"\ntimeout = {timeout:.0f}\nexcluded-modules = []\ntest-command = ""\n')
        session = root / "mutation.sqlite"
        subprocess.run([_tool("cosmic-ray"), "init", str(config), str(session)], cwd=root, env=env, check=True, capture_output=True)
        with use_db(str(session), WorkDB.Mode.open) as db:
            wanted = []
            for item in db.pending_work_items:
                (mutation,) = item.mutations
                if target.functions and mutation.definition_name not in target.functions:
                    db.set_result(item.job_id, WorkResult(output="outside the target functions", worker_outcome=WorkerOutcome.SKIPPED))
                elif not kept_operator(mutation.operator_name):
                    db.set_result(item.job_id, WorkResult(output="binary-operator swap not kept", worker_outcome=WorkerOutcome.SKIPPED))
                    counts["filtered"] += 1
                elif args.survivors_of is not None and (str(mutation.module_path), *mutation.start_pos, mutation.operator_name) not in args.survivors_of:
                    db.set_result(item.job_id, WorkResult(output="not a survivor of the earlier report", worker_outcome=WorkerOutcome.SKIPPED))
                else:
                    wanted.append(item)
            # Job ids are random: order by what the mutant is, so one seed samples the same mutants every run.
            wanted.sort(key=lambda item: (item.mutations[0].start_pos, item.mutations[0].operator_name, item.mutations[0].occurrence))
            random.Random(args.seed).shuffle(wanted)  # a seeded sample when the cap or the budget cuts the list
            counts["sampled out"] = max(0, len(wanted) - args.max_mutants)
            wanted = wanted[: args.max_mutants]
            print(f"[{target.name}] {len(wanted)} mutants, baseline {baseline_s:.1f} s, per-mutant timeout {timeout:.0f} s, {budget_s / 60:.1f} min of budget", flush=True)
            # cosmic-ray's own worker, run here rather than through `cosmic-ray exec` so that the
            # budget is checked between mutants (a mutant's test process is never killed half-way).
            # It edits the module in place, relative to the working directory, and restores it.
            here, saved_env = Path.cwd(), dict(os.environ)
            os.chdir(root)
            os.environ.update(env)
            try:
                for n, item in enumerate(wanted):
                    if time.monotonic() - began > budget_s:
                        counts["not run"] = len(wanted) - n
                        note = f"budget spent: {len(wanted) - n} sampled mutants not run"
                        break
                    db.set_result(item.job_id, mutate_and_test(item.mutations, test_command(target, root), timeout))
            finally:
                os.chdir(here)
                os.environ.clear()
                os.environ.update(saved_env)

        survivors = []
        with use_db(str(session), WorkDB.Mode.open) as db:
            for item, result in db.completed_work_items:
                (mutation,) = item.mutations
                if result.worker_outcome == WorkerOutcome.SKIPPED:
                    continue
                if result.worker_outcome == WorkerOutcome.NO_TEST:
                    counts["no mutation"] += 1
                elif result.test_outcome == TestOutcome.SURVIVED:
                    counts["survived"] += 1
                    where = f"{mutation.module_path}:{mutation.start_pos[0]}:{mutation.start_pos[1]} in {mutation.definition_name}()"
                    survivors.append(f"{where} {mutation.operator_name}\n{result.diff}")
                elif result.output == "timeout":
                    counts["timeout"] += 1
                elif result.test_outcome == TestOutcome.INCOMPETENT:
                    counts["incompetent"] += 1
                else:
                    counts["killed"] += 1
    return Outcome(target, counts, sorted(survivors), note, time.monotonic() - began)


def report(outcomes: list[Outcome], command: str, wall_s: float) -> str:
    lines = [f"# hpcrl mutation audit (cosmic-ray), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", f"# command: {command}", ""]
    columns = ("killed", "survived", "timeout", "incompetent", "no mutation", "not run", "sampled out", "filtered")
    lines.append(f"{'target':<20}" + "".join(f"{c:>13}" for c in columns) + f"{'wall':>9}")
    for o in outcomes:
        lines.append(f"{o.target.name:<20}" + "".join(f"{o.counts[c]:>13}" for c in columns) + f"{o.wall_s:>8.0f}s")
    total = sum((o.counts for o in outcomes), Counter())
    lines.append(f"{'total':<20}" + "".join(f"{total[c]:>13}" for c in columns) + f"{wall_s:>8.0f}s")
    for o in outcomes:
        lines += ["", f"## {o.target.name}: {o.target.module}" + (f" ({', '.join(o.target.functions)})" if o.target.functions else ""), f"tests: {' '.join(o.target.tests)}"]
        if o.note:
            lines.append(f"note: {o.note}")
        for s in o.survivors:
            lines += ["", f"SURVIVED {s}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", metavar="TARGET", help=f"targets to run (default: all of {', '.join(t.name for t in TARGETS)})")
    p.add_argument("--max-mutants", type=_args.positive_integer, default=60, help="per target; the rest are sampled out, seeded (default 60)")
    p.add_argument("--seed", type=_args.seed, default=0)
    p.add_argument("--timeout-factor", type=_args.positive_number, default=4.0, help="per-mutant timeout = factor x the unmutated selection's time (default 4)")
    p.add_argument("--min-timeout", type=_args.positive_number, default=30.0, help="seconds, at least (default 30)")
    p.add_argument("--budget-minutes", type=_args.positive_number, default=40.0, help="whole run; later targets are not run past it (default 40)")
    p.add_argument("--report", type=Path, help="also write the report to this file")
    p.add_argument("--survivors-of", type=Path, metavar="REPORT", help="only the mutants an earlier report lists as SURVIVED (re-check them after adding tests)")
    p.add_argument("--tests-under", default="", metavar="PREFIX", help="keep only the selected tests whose path starts with this (e.g. tests/test_contracts.py)")
    args = p.parse_args(argv)
    if args.survivors_of is not None:
        found = re.findall(r"^SURVIVED (\S+):(\d+):(\d+) in \S+ (\S+)$", args.survivors_of.read_text(), re.M)
        args.survivors_of = {(path, int(line), int(col), op) for path, line, col, op in found}
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        print("mutation.py: cosmic-ray is not installed: pip install 'cosmic-ray>=8.7'", file=sys.stderr)
        return 2
    unknown = set(args.only or ()) - {t.name for t in TARGETS}
    if unknown:
        print(f"mutation.py: --only: unknown targets {sorted(unknown)}", file=sys.stderr)
        return 2
    targets = [t for t in TARGETS if not args.only or t.name in args.only]
    began = time.monotonic()
    outcomes = []
    # One snapshot of the working tree for the whole run: edits made while it runs do not leak into later targets.
    snapshot_dir = tempfile.TemporaryDirectory(prefix="hpcrl-mutation-snapshot-")
    snapshot = Path(snapshot_dir.name)
    scratch_copy(snapshot)
    for i, target in enumerate(targets):
        left = args.budget_minutes * 60 - (time.monotonic() - began)
        if left <= 0:
            outcomes.append(Outcome(target, Counter(), [], "not run: the time budget was spent"))
            continue
        outcomes.append(run_target(target, snapshot, args, left / (len(targets) - i)))  # an even share of what is left
        o = outcomes[-1]
        print(f"[{target.name}] killed {o.counts['killed']}, survived {o.counts['survived']}, timeout {o.counts['timeout']} in {o.wall_s:.0f} s {o.note}", flush=True)
    snapshot_dir.cleanup()
    text = report(outcomes, shlex.join([Path(sys.executable).name, *sys.argv]), time.monotonic() - began)
    print(text)
    if args.report:
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
