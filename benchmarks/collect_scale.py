"""How long `hpcrl collect` takes over many runs, evaluation excluded, beside collect as it was before.

Writes a synthetic experiment per size (runs.csv, per-run train.csv with ROWS logged iterations,
eval.csv and markers, as train and eval leave them; SEEDS seeds a setting) and times `collect` on
it: reading every CSV, the summary with bootstrap CIs, the curves, improvement.csv, the plots and
the report. Beside it, in the same run and on the same files, the reference: the `hpcrl` package
of the commit before issue 17 (REFERENCE_COMMIT, extracted with `git archive`). Each collect runs
in a process of its own (the call timed, not the imports), the two alternate, and the median and
the best of REPEAT are printed with the machine's load average, because other work on a 2-core
machine moves single timings by seconds. The results of the last two collects are compared byte
for byte (every CSV, report.md, report.html with its plots, the terminal's tables): a speed-up that
changed a number would say so here. Against the reference, whose outputs predate deliberate format
changes, what differs byte for byte is compared figure by figure (a CSV's cells on the columns both
write, the reports' table cells) and named as a format change when every figure is the same. Target (issue 17): 10,000 runs x 1,000 settings in <= 5 s.

    python benchmarks/collect_scale.py [--runs 1000 10000] [--seeds 10] [--rows 400] [--repeat 3]
    python benchmarks/collect_scale.py --runs 10000 --settings 1000 --no-reference
    python benchmarks/collect_scale.py --runs 10000 --settings 1000 --before main   # a change against the code it changes
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path
import numpy as np

REPO = Path(__file__).resolve().parent.parent
REFERENCE_COMMIT = "eefd824"
"""The last commit before issue 17's collect work: `hpcrl collect` as it was measured in the issue."""
REFERENCE_MODULE, CURRENT_MODULE = "hpcrl.collect", "hpcrl.results.collect"
"""Where each side's `collect` lives: the reference predates the stage-folder layout (hpcrl/results/)."""
TARGET_RUNS, TARGET_S = 10_000, 5.0
COMPARED = ("summary.csv", "aggregate.csv", "improvement.csv", "curves.csv", "eval_curves.csv", "report.md", "report.html")

DRIVER = """
import importlib, io, sys, time
from pathlib import Path
import hpcrl
collect = importlib.import_module(sys.argv[3]).collect
out = io.StringIO()
wall, cpu = time.perf_counter(), time.process_time()
rc = collect(Path(sys.argv[1]), out=out)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
Path(sys.argv[2]).write_text(out.getvalue())
print(wall, cpu, rc, hpcrl.__file__)
"""


def make_experiment(root: Path, runs: int, settings: int, rows: int) -> Path:
    exp = root / "scale"
    (exp / "runs").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = ["index,run_id,seed,train.lr"]
    for i in range(runs):
        setting, seed = i % settings, i // settings
        run_id = f"{setting:08x}ab-s{seed}"
        lines.append(f"{i},{run_id},{seed},{10 ** -(2 + setting / settings):.6g}")
        rd = exp / "runs" / run_id
        rd.mkdir()
        steps = np.arange(1, rows + 1) * 256
        returns = np.clip(500 * (1 - np.exp(-steps / 3e4)) + rng.normal(0, 20, rows), 0, 500)
        body = "\n".join(f"{s},{k},{k * 0.1:.1f},2500,1,{r:.2f},{r:.0f},0.01,0.5,0.6,0.001,0.1,0.001" for k, (s, r) in enumerate(zip(steps, returns), 1))
        (rd / "train.csv").write_text("step,iteration,wall_time,sps,episodes,episodic_return,episodic_length,policy_loss,value_loss,entropy,approx_kl,clipfrac,lr\n" + body + "\n")
        (rd / "eval.csv").write_text("episode,return,length\n" + "".join(f"{e},{returns[-1] + e:.1f},500\n" for e in range(10)))
        (rd / "DONE").write_text("done\n")
        (rd / "EVAL_DONE").write_text("done\n")
    (exp / "runs.csv").write_text("\n".join(lines) + "\n")
    return exp


def reference_package(tmp: Path, commit: str = REFERENCE_COMMIT, name: str = "reference") -> Path:
    """The `hpcrl` package of `commit`, importable from the returned directory."""
    target = tmp / name
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "hpcrl"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def timed_collect(exp: Path, package_root: Path, module: str, terminal: Path, blas_threads: int | None) -> tuple[float, float]:
    """(wall s, CPU s of all its threads) of one `collect` call, in a fresh process that imports hpcrl
    from `package_root` and `collect` from its `module`."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    if blas_threads:
        env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(blas_threads)
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(exp), str(terminal), module], capture_output=True, text=True, env=env, cwd=terminal.parent)
    if proc.returncode != 0:
        raise SystemExit(f"collect with {package_root} failed:\n{proc.stderr[-3000:]}")
    wall, cpu, rc, where = proc.stdout.split()
    if not Path(where).is_relative_to(package_root) or rc != "0":
        raise SystemExit(f"collect imported {where} (wanted one under {package_root}) and exited {rc}")
    return float(wall), float(cpu)


def snapshot(exp: Path, terminal: Path) -> dict[str, str]:
    """What collect wrote, with the one thing that differs between two runs (the time) taken out."""
    found = {"terminal": terminal.read_text()}
    for name in COMPARED:
        path = exp / "results" / name
        if path.exists():
            found[name] = path.read_text()
    clock = re.compile(r"(collected(?:</dt><dd>|\W+))[0-9T:+-]+")
    return {k: clock.sub(r"\1-", v) for k, v in found.items()}


def figures(name: str, text: str) -> list:
    """The figures of one output, without its presentation: a CSV's cells by column, a report's or the terminal's
    table cells. Against the reference, which predates deliberate format changes (issue 38 added improvement.csv's
    no_ci column, the reports' notes and phone-width markup, and withholds the intervals that say nothing), these
    are what must not have moved."""
    if name.endswith(".csv"):  # csv, not split(","): a setting such as `train.hidden_sizes=[64, 64]` is quoted
        return list(csv.DictReader(io.StringIO(text)))
    if name == "report.md":
        return [cell.strip() for line in text.splitlines() if line.startswith("|") for cell in line.strip("|").split("|")]
    if name == "report.html":
        return [re.sub(r"<[^>]+>|\s+", "", cell) for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", text, re.S)]
    return [cell for line in text.splitlines() for cell in re.split(r"\s{2,}", line.strip())]  # columns as aligned


WITHHELD = re.compile(r"(.*?)\s*\(no\s*CI:[^)]*\)")
"""A figure whose interval hpcrl withholds (stats.interval_withheld): `1 (no CI: no spread)`, where the
reference printed `1 [1, 1]`."""


def same_cell(ours: str, theirs: str) -> bool:
    """The same figure: equal; or ours with its interval withheld where theirs shows one beside the same value;
    or ours `-` where theirs is an interval of zero width (one seed's `[20.1, 20.1]`)."""
    if ours == theirs:
        return True
    if ours == "-":
        return re.fullmatch(r"\[\s*([^,\]]+?)\s*,\s*\1\s*\]", theirs) is not None
    withheld = WITHHELD.fullmatch(ours)
    return withheld is not None and re.fullmatch(rf"{re.escape(withheld[1])}\s*\[[^\]]*\]", theirs) is not None


def same_figures(name: str, ours: str, theirs: str) -> bool:
    """Equal figures; in a CSV, on the columns both sides write (a column added since is not a changed figure)
    and without the interval of a row whose interval ours withholds (its no_ci says why)."""
    a, b = figures(name, ours), figures(name, theirs)
    if len(a) != len(b):
        return False
    if name.endswith(".csv"):
        return all(x[k] == y[k] for x, y in zip(a, b) for k in (set(x) & set(y)) - ({"ci_low", "ci_high"} if x.get("no_ci") else set()))
    return all(same_cell(x, y) for x, y in zip(a, b))


def verdict(ours: dict[str, str], theirs: dict[str, str], figures_only: bool) -> str:
    """Byte-identical, or (against the reference, `figures_only`) the same figures in a changed format, or which differ."""
    differ = [name for name in sorted(set(ours) | set(theirs)) if ours.get(name) != theirs.get(name)]
    if not differ:
        return f"byte-identical ({', '.join(sorted(ours))})"
    if not figures_only:
        return f"DIFFERENT: {', '.join(differ)}"
    moved = [name for name in differ if name not in ours or name not in theirs or not same_figures(name, ours[name], theirs[name])]
    if moved:
        return f"DIFFERENT figures: {', '.join(moved)}"
    return f"the same figures (format changed since, on purpose: {', '.join(differ)}; every other output byte-identical)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=_args.runs, nargs="+", default=[1000, 10000])
    parser.add_argument("--seeds", type=_args.positive_integer, default=10, help="seeds a setting: settings = runs / seeds")
    parser.add_argument("--settings", type=_args.positive_integer, help="settings for every size (instead of runs / seeds)")
    parser.add_argument("--rows", type=_args.positive_integer, default=400, help="logged iterations per run")
    parser.add_argument("--repeat", type=_args.positive_integer, default=3, help="timed collects of each; the median and the best are printed")
    parser.add_argument("--no-reference", action="store_true", help="time the current collect only")
    parser.add_argument("--before", metavar="REV", type=_args.commit(REPO), help="also time collect as it was at this commit (say, the one before a speed-up), alternating with the others, its results compared too")
    parser.add_argument("--blas-threads", type=_args.positive_integer, help="OPENBLAS_NUM_THREADS for both collects (default: as the environment has it)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        reference = None if args.no_reference else reference_package(tmp)
        before = reference_package(tmp, args.before, "before") if args.before else None
        blas = f"OPENBLAS_NUM_THREADS={args.blas_threads}" if args.blas_threads else f"BLAS threads as the environment has them ({os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})"
        print(f"hpcrl collect (no evaluation), {args.rows} rows per train.csv, {os.cpu_count()} CPUs, {blas}; each collect in its own process, "
              f"median (best) of {args.repeat}{', alternating with the reference' if reference else ''}")  # fmt: skip
        print(f"{'runs':>6} {'settings':>8}  {'what':40} {'wall s':>15} {'cpu s':>7}  load before/after")
        for runs in args.runs:
            settings = args.settings or max(1, runs // args.seeds)
            began = time.perf_counter()
            exp = make_experiment(tmp / f"exp{runs}", runs, settings, args.rows)
            made = time.perf_counter() - began
            contenders = ([("reference: collect before issue 17", reference, REFERENCE_MODULE)] if reference else []) + [("hpcrl collect", REPO, CURRENT_MODULE)]
            contenders += [(f"before: hpcrl collect at {args.before}", before, CURRENT_MODULE)] if before else []
            times: dict[str, list[tuple[float, float]]] = {what: [] for what, _, _ in contenders}
            outputs: dict[str, dict[str, str]] = {}
            load_before = os.getloadavg()[0]
            for _ in range(args.repeat):
                for what, root, module in contenders:
                    terminal = tmp / "terminal.txt"
                    times[what].append(timed_collect(exp, root, module, terminal, args.blas_threads))
                    outputs[what] = snapshot(exp, terminal)
            load_after = os.getloadavg()[0]
            for what, _, _ in contenders:
                walls, cpus = [w for w, _ in times[what]], [c for _, c in times[what]]
                print(f"{runs:>6} {settings:>8}  {what:40} {statistics.median(walls):>7.2f} ({min(walls):5.2f}) {statistics.median(cpus):>7.2f}  {load_before:.1f}/{load_after:.1f}")
            if reference:
                speedup = statistics.median(w for w, _ in times["reference: collect before issue 17"]) / statistics.median(w for w, _ in times["hpcrl collect"])
                print(f"{'':16}  speed-up {speedup:.1f}x; results {verdict(outputs['hpcrl collect'], outputs['reference: collect before issue 17'], True)}")
            if before:
                speedup = statistics.median(w for w, _ in times[f"before: hpcrl collect at {args.before}"]) / statistics.median(w for w, _ in times["hpcrl collect"])
                print(f"{'':16}  against {args.before}: speed-up {speedup:.2f}x; results {verdict(outputs['hpcrl collect'], outputs[f'before: hpcrl collect at {args.before}'], False)}")
            if runs == TARGET_RUNS:
                median = statistics.median(w for w, _ in times["hpcrl collect"])
                print(f"{'':16}  target: {TARGET_RUNS} runs x {settings} settings <= {TARGET_S:.0f} s: {'met' if median <= TARGET_S else 'MISSED'} (median {median:.2f} s)")
            print(f"{'':16}  (experiment written in {made:.1f} s)")


if __name__ == "__main__":
    main()
