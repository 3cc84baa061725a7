"""collect's numbers stay byte-identical: every results CSV, the terminal tables and the report text
of fixed synthetic experiments are compared with references made by the code before it was sped up
(issue 17, collect over 10,000 runs). A change that moves any number, by one bootstrap draw or one
rounding, fails here.

The experiments are written from `random.Random` (whose stream Python keeps stable), and cover what
the fast paths must treat as the slow ones did: more settings than a figure shows (the cut to the
best 12), settings of one seed, seeds whose logs are ragged, overlap partly or not at all, repeat a
step (a resume) or miss returns, evaluations during training, failed, missing and corrupt runs,
ties between settings, several tasks with normalised scores and a seed missing on one task.

    python tests/results/test_collect_identity.py     # rewrite the references (only when a number must change)
"""

from __future__ import annotations

import random
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from hpcrl import halves
from hpcrl.cores import usable_cores
from hpcrl.results import collect as collect_module
from hpcrl.results import tables
from hpcrl.results.collect import collect

REFERENCE = Path(__file__).parents[1] / "data" / "collect_reference"
COMPARED = ("summary.csv", "aggregate.csv", "improvement.csv", "curves.csv", "eval_curves.csv", "report.md", "stdout.txt")
CASES = {"single-iqm": ("single", "iqm"), "single-mean": ("single", "mean"), "multi-iqm": ("multi", "iqm")}
CASE_PARAMS = [pytest.param(case, marks=pytest.mark.slow) if case == "multi-iqm" else case for case in sorted(CASES)]
"""The multi-setting case takes ~6 CPU-s (its settings' bootstrap bands and figures): over the unit tier's 5, so
`scripts/test --fast` failed it; the full suite runs all three."""


def _train_csv(rng: random.Random, rows: int, start: int, every: int, final: float, holes: bool, resume: bool) -> str:
    lines = ["step,iteration,wall_time,sps,episodes,episodic_return,episodic_length"]
    for k in range(rows):
        step = start + k * every
        ret = "" if holes and rng.random() < 0.2 else f"{final * (1 - 0.9 ** (k + 1)) + rng.uniform(-5, 5):.2f}"
        lines.append(f"{step},{k + 1},{k * 0.1:.1f},1000,1,{ret},100")
        if resume and k == rows // 2:  # a resumed job logs some steps again; the later row wins
            for j in range(max(1, k - 2), k + 1):
                lines.append(f"{start + j * every},{j + 1},{j * 0.1:.1f},1000,1,{final * (1 - 0.9 ** (j + 1)) + rng.uniform(-5, 5):.2f},100")
    return "\n".join(lines) + "\n"


def make_experiment(root: Path, kind: str) -> Path:
    """A finished experiment as train and eval leave it, every number drawn from one fixed stream."""
    rng = random.Random(17)
    exp = root / f"exp-{kind}"
    (exp / "runs").mkdir(parents=True)
    tasks = ["CartPole-v1", "Acrobot-v1", "Pendulum-v1"] if kind == "multi" else [None]
    n_settings = 15 if kind == "single" else 14
    config: dict = {"algo": "ppo", "env": {"id": "CartPole-v1"}, "train": {"total_steps": 4000}}
    if kind == "multi":
        config["sweep"] = {"grid": {"env.id": tasks, "train.lr": []}}
        config["results"] = {"normalize": True, "scores": {"Pendulum-v1": {"random": -1200, "reference": -200}}}
    header = ["index", "run_id", "seed", "train.lr"] + (["env.id"] if kind == "multi" else [])
    rows, index = [",".join(header)], 0
    for setting in range(n_settings):
        lr = f"{10 ** -(2 + setting / n_settings):.6g}"
        seeds = 1 if setting == 3 else 2 if setting == 4 else 3 + setting % 4
        quality = 100 + 25 * (setting % 7) if setting != 9 else 100 + 25 * (8 % 7)  # 9 ties 8 on average
        for ti, task in enumerate(tasks):
            for seed in range(seeds):
                run_id = f"{setting:04x}{ti:02x}abcd-s{seed}"
                rows.append(",".join([str(index), run_id, str(seed), lr] + ([task] if task else [])))
                index += 1
                rd = exp / "runs" / run_id
                if setting == 5 and seed == 1 and ti == 0:
                    continue  # never started: no run directory
                rd.mkdir()
                scale = {None: 1.0, "CartPole-v1": 1.0, "Acrobot-v1": -0.5, "Pendulum-v1": -3.0}[task]
                final = quality * scale + rng.uniform(-30, 30)
                if setting == 6 and seed == 2:
                    start, every, n_rows = 4000, 200, 30  # a seed that starts after the others stop: no curve
                else:
                    start, every, n_rows = rng.choice([100, 128, 200]), rng.choice([100, 128]), rng.randint(12, 40)
                if setting == 7 and seed == 0:
                    n_rows = 1  # one logged row: no usable curve, still a score
                log = _train_csv(rng, n_rows, start, every, final, holes=setting % 3 == 0, resume=setting % 5 == 1)
                if setting == 12 and seed == 1:
                    log = log.replace("\n", "\n12x4,1,0.1,1000,1,5.0,100\n", 5)  # damage in the middle: the curve left out, named; the score counts
                elif setting % 6 == 1 and seed == 0:
                    log += f"{start + every * n_rows},{n_rows + 1},9.9,10"  # a torn last line, dropped
                elif setting % 6 == 2 and seed == 0:
                    log += "\0" * 40  # a dead node's NUL tail, dropped
                (rd / "train.csv").write_text(log)
                if setting % 4 == 2:
                    curve = ["step,wall_time,mean_return,std_return,mean_length,episodes"]
                    curve += [f"{(k + 1) * 500},{k:.1f},{final * (1 - 0.8 ** (k + 1)) + rng.uniform(-3, 3):.3f},1.0,100,5" for k in range(rng.randint(2, 6))]
                    (rd / "eval_curve.csv").write_text("\n".join(curve) + "\n")
                if setting == 8 and seed == 0:
                    (rd / "FAILED").write_text("CUDA error: out of memory\n")
                    continue
                (rd / "DONE").write_text(f"step {start + every * n_rows}\n")
                if setting == 10 and seed == 1:
                    continue  # trained, not evaluated
                if setting == 11 and seed == 0 and ti == (1 if kind == "multi" else 0):
                    (rd / "eval.csv").write_text("garbage\x00\x01,\n1,2,3\n")
                else:
                    base = round(final, -1) if setting in (8, 9) else final  # ties between two settings' runs
                    (rd / "eval.csv").write_text("episode,return,length\n" + "".join(f"{e},{base + (e - 1) * (0 if setting in (8, 9) else rng.uniform(0, 4)):.4g},100\n" for e in range(3)))
                (rd / "EVAL_DONE").write_text("done\n")
    (exp / "runs.csv").write_text("\n".join(rows) + "\n")
    (exp / "experiment.yaml").write_text(yaml.safe_dump({"config": config, "provenance": {"hpcrl_version": "test"}}))
    return exp


def outputs(root: Path, case: str) -> dict[str, str]:
    """What collect writes on the case's experiment, with the temporary path and the clock taken out."""
    kind, agg = CASES[case]
    exp = make_experiment(root, kind)

    class Out:
        text = ""

        def write(self, s: str) -> None:
            Out.text += s

        def flush(self) -> None:
            pass

    assert collect(exp, out=Out(), agg=agg) == 0
    found = {"stdout.txt": Out.text}
    for name in COMPARED[:-1]:
        path = exp / "results" / name
        if path.exists():
            found[name] = path.read_text()
    return {k: re.sub(r"collected(\W+)[0-9T:+-]+", r"collected\1-", v.replace(str(exp), "<EXP>")) for k, v in found.items()}


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_collect_output_is_byte_identical_to_the_reference(tmp_path: Path, case: str) -> None:
    found = outputs(tmp_path, case)
    expected = {p.name: p.read_text() for p in sorted((REFERENCE / case).iterdir())}
    assert sorted(found) == sorted(expected)
    for name in expected:
        assert found[name] == expected[name], f"{case}/{name} differs from the reference"


@pytest.mark.skipif(usable_cores() < 2, reason="the split needs two cores")
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_collect_split_over_two_processes_writes_the_same_bytes(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The logs parsed and the curves' bands computed half in a forked child (hpcrl.halves), as a big sweep's
    are, here from two items on: the corrupt logs' errors and every number come back the same."""
    monkeypatch.setattr(collect_module, "LOGS_IN_TWO", 2)
    monkeypatch.setattr(tables, "CURVES_IN_TWO", 2)
    split, original = [], halves.map_in_halves
    monkeypatch.setattr(halves, "map_in_halves", lambda work, items, min_items: split.append(len(items)) or original(work, items, min_items))
    found = outputs(tmp_path, case)
    assert len(split) >= 2 and min(split) >= 2  # the logs and at least one task's curves were split
    for name in sorted(p.name for p in (REFERENCE / case).iterdir()):
        assert found[name] == (REFERENCE / case / name).read_text(), f"{case}/{name} differs from the reference when split"


def test_the_reference_cases_cover_what_they_claim(tmp_path: Path) -> None:
    """Guards the fixture itself: the cut to 12 settings, a partial curve, eval curves, every kind of bad run."""
    single = (REFERENCE / "single-iqm" / "stdout.txt").read_text()
    for words in ("training curve from 2 of 3 seeds", "corrupt eval.csv", "train failed", "not evaluated", "missing: no run directory", "no train curve", "no training curve: corrupt train.csv"):
        assert words in single, words
    assert (REFERENCE / "single-iqm" / "eval_curves.csv").exists()
    multi = (REFERENCE / "multi-iqm")
    assert (multi / "aggregate.csv").read_text().count("\n") > 10 and "left out of the aggregate" in (multi / "stdout.txt").read_text()
    assert len((REFERENCE / "single-iqm" / "summary.csv").read_text().splitlines()) == 1 + 15  # 15 settings, the best 12 compared:
    assert len((REFERENCE / "single-iqm" / "improvement.csv").read_text().splitlines()) == 1 + 12 * 11


if __name__ == "__main__":
    import tempfile

    for case in sorted(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            found = outputs(Path(tmp), case)
        shutil.rmtree(REFERENCE / case, ignore_errors=True)
        (REFERENCE / case).mkdir(parents=True)
        for name, text in found.items():
            (REFERENCE / case / name).write_text(text)
        print(f"{case}: {', '.join(sorted(found))}", file=sys.stderr)
