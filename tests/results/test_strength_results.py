"""Strength across seeds (issue 28 item 4): the Elo fit, the per-opponent tables and curves and the
Elo ladder that `hpcrl collect` makes from real eval rows, and runs whose strength files are
missing or damaged, named and left out."""

from __future__ import annotations

import csv
import html
import io
import math
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
import yaml
from factories import write_config
from trainruns import train

from hpcrl.config.load import load_experiment
from hpcrl.results import strength as results_strength
from hpcrl.results.collect import collect, scoring_of
from hpcrl.results.strength import fit_elo
from hpcrl.rl import checkpoint, strength
from hpcrl.rl.evaluate import evaluate_run
from hpcrl.store import rundir
from hpcrl.store.expdir import write_experiment
from hpcrl.sweep.runs import expand

TINY_AZ = {"total_steps": 60, "simulations": 4, "games_per_iteration": 4, "train_steps_per_iteration": 2, "batch_size": 8, "hidden_sizes": [16],
           "checkpoint_every": 1, "opponents": ["random", "perfect"], "ladder_games": 4}  # fmt: skip


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------- the Elo fit


def test_a_player_who_scores_75_percent_is_rated_191_elo_above():
    ratings = fit_elo([("A", "B", 300, 400)], anchor="B")
    assert ratings["B"] == 0
    assert ratings["A"] == pytest.approx(400 * math.log10(3), abs=1.0)  # 190.8; the prior's one virtual draw moves it 0.4


def test_a_consistent_ladder_is_recovered_and_anchored_at_random():
    truth = {"random": 0.0, "a": 200.0, "b": 500.0, "c": 650.0}
    expected = lambda x, y: 1 / (1 + 10 ** ((truth[y] - truth[x]) / 400))
    names = list(truth)
    pairs = [(x, y, 10_000 * expected(x, y), 10_000) for i, x in enumerate(names) for y in names[i + 1 :]]
    ratings = fit_elo(pairs)
    assert ratings == pytest.approx(truth, abs=2.0)


def test_a_player_who_won_every_game_gets_a_finite_rating():
    ratings = fit_elo([("random", "p1", 0, 10), ("random", "p2", 0, 10), ("p1", "p2", 5, 10)])
    assert ratings["random"] == 0 and all(math.isfinite(e) and e > 300 for e in ratings.values() if e)
    assert ratings["p1"] == pytest.approx(ratings["p2"], abs=1e-6)
    with pytest.raises(ValueError, match="a score of 12 in 10 games"):
        fit_elo([("a", "b", 12, 10)])


def test_ladder_players_are_evenly_spaced_with_first_and_last():
    assert strength.ladder_players([5, 1, 3], limit=8) == [1, 3, 5]
    picked = strength.ladder_players(list(range(100, 2100, 100)), limit=5)
    assert picked[0] == 100 and picked[-1] == 2000 and len(picked) == 5
    assert strength.ladder_players([100, 200, 300], limit=1) == [300]  # train.ladder_players: 1 keeps the newest


# ---------------------------------------------------------------------------- collect on real runs


def nim_experiment(tmp_path: Path, seeds: list[int]):
    """Nim (tests/user_games.py) trained for a few iterations per seed, with evaluations during
    training and the eval stage, as `hpcrl sweep` would run them."""
    config = write_config(tmp_path, {"name": "nim", "algo": "alphazero", "env": {"backend": "game", "id": "user_games:Nim", "kwargs": {"pile": 5}, "num_envs": 1},
                                     "sweep": {"seeds": seeds}, "eval": {"episodes": 4, "every_steps": 20, "periodic_episodes": 2}})  # fmt: skip
    data = yaml.safe_load(config.read_text())
    data["train"] = TINY_AZ
    config.write_text(yaml.safe_dump(data))
    exp = load_experiment(config)
    runs = expand(exp)
    write_experiment(exp, runs, {})
    for run in runs:
        assert train(exp.dir, run) == 0
        assert evaluate_run(exp.dir, run) == 0
    return exp.dir, [exp.dir / "runs" / run.run_id for run in runs]


@pytest.fixture(scope="module")
def nim_collected(tmp_path_factory) -> tuple[Path, list[Path], str]:
    """Two seeds of nim trained, evaluated and collected once for the tests that only read what that
    wrote: (experiment directory, run directories, what collect printed)."""
    exp_dir, run_dirs = nim_experiment(tmp_path_factory.mktemp("nim"), [0, 1])
    out = io.StringIO()
    assert collect(exp_dir, out=out) == 0
    return exp_dir, run_dirs, out.getvalue()


@pytest.mark.slow  # the report rendered in headless Chromium: 5-6 s of CPU on the 2-core VM, over --fast's 5
def test_collect_reports_strength_per_opponent_curves_and_the_elo_ladder(nim_collected, tmp_path, chromium):
    exp_dir, run_dirs, out = nim_collected
    snaps = [s for s, _ in checkpoint.snapshots(run_dirs[0] / "checkpoints")]
    assert len(snaps) >= 3  # an evaluation every 20 of 60 positions: the ladder's players
    pairs = read_csv(run_dirs[0] / "ladder.csv")
    players = {p for row in pairs for p in (row["player_a"], row["player_b"])}
    assert "random" in players and {str(s) for s in snaps} <= players
    assert len(pairs) == len(players) * (len(players) - 1) // 2 and all(int(r["games"]) == 4 for r in pairs)

    results = exp_dir / "results"
    table = read_csv(results / "strength.csv")
    assert [r["opponent"] for r in table] == ["perfect", "random"] and all(r["seeds"] == "2" for r in table)  # the strongest first
    for row in table:
        rates = [next(float(r["win_rate"]) for r in rundir.read_strength(rd / "strength.csv") if r["opponent"] == row["opponent"]) for rd in run_dirs]
        assert float(row["win_mean"]) == pytest.approx(sum(rates) / 2, abs=1e-5)
        assert float(row["win_ci_low"]) <= float(row["win_mean"]) <= float(row["win_ci_high"])
    curves = read_csv(results / "strength_curves.csv")
    assert {(r["opponent"], r["rate"]) for r in curves} == {(o, k) for o in ("random", "perfect") for k in ("win_rate", "loss_rate")}
    elo = read_csv(results / "elo.csv")
    assert {r["seed"] for r in elo} == {"0", "1"} and all(float(r["elo"]) == 0 for r in elo if r["player"] == "random")
    ladder = read_csv(results / "elo_ladder.csv")
    assert ladder[0]["player"] == "random" and ladder[1]["player"] == "policy 1" and ladder[1]["seeds"] == "2"
    for png in ("strength_win_rate.png", "strength_loss_rate.png", "elo.png"):
        assert (results / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    for words in ("Against perfect:", "Elo ladder of the run's policies:", "policy 1"):
        assert words in out
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", (results / "report.html").as_uri()]
    dom = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout  # the page as a browser shows it
    for words in ("Strength against fixed opponents", "Against random", "Strength during training", "Elo ladder of the run's policies", "Win rate during training", "policy 1"):
        assert words in html.unescape(dom)
    assert dom.count("data:image/png;base64,") >= 3 + 2  # the strength curves and the Elo curve, besides collect's own


class _Page(HTMLParser):
    """report.html's headings in order, and its figures (an <img>, with a <picture>'s <source> where it has one)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.headings: list[tuple[str, str]] = []
        self.figures: list[dict[str, str]] = []
        self._heading: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("h2", "h3"):
            self._heading = tag
            self.headings.append((tag, ""))
        elif tag == "figure":
            self.figures.append({})
        elif tag in ("img", "source") and self.figures:
            self.figures[-1][tag] = dict(attrs).get("src" if tag == "img" else "media") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == self._heading:
            self._heading = None

    def handle_data(self, data: str) -> None:
        if self._heading:
            tag, text = self.headings[-1]
            self.headings[-1] = (tag, text + data)


def test_a_game_s_summary_opens_with_its_strength(nim_collected):
    """Issue 38 item 2: collect opened a game's results with "Final evaluation return 0.3789", +1 / 0 / -1 pooled
    over random, perfect and MCTS opponents. It opens with the strength against each opponent, the strongest
    first, then the Elo ladder; the pooled return, and P(X > Y) of it, are not shown."""
    _, _, out = nim_collected
    lines = out.splitlines()
    assert lines[0].startswith("Strength against fixed opponents: Win / draw / loss rates of the final policy")
    heads = [line for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert heads == ["Against perfect:", "Against random:", "Elo ladder of the run's policies:"]
    for pooled in ("Final evaluation return", "P(row > column)", "P(X > Y)"):
        assert pooled not in out


def test_a_game_s_report_leads_with_strength_and_names_self_play_for_what_it_is(nim_collected):
    """Issue 38 item 2: report.html opened with the pooled return, a self-play return curve that falls as play
    improves (games become draws) and read as a collapse, a pooled IQM interval and a performance profile.
    It leads with the strength sections; self-play's curve comes after them, named and captioned as what it
    is; nothing pooled over opponents is drawn."""
    exp_dir, _, _ = nim_collected
    page = (exp_dir / "results" / "report.html").read_text()
    top = [text for tag, text in _Page(page).headings if tag == "h2"]
    assert top == ["Strength against fixed opponents", "Elo ladder of the run's policies", "Strength during training", "Self-play outcome", "Runs"]
    assert [text for tag, text in _Page(page).headings if tag == "h3"][:2] == ["Against perfect", "Against random"]
    assert "it falls toward 0 as both sides improve and more games are drawn, so it is no measure of strength" in html.unescape(page)
    for pooled in ("Final evaluation return", "Performance profile", "Probability of improvement", "Evaluation during training", "Training curves"):
        assert pooled not in page
    assert not (exp_dir / "results" / "improvement.csv").exists() and not (exp_dir / "results" / "eval_curves.csv").exists()
    assert "Final evaluation return" not in (exp_dir / "results" / "report.md").read_text()


def test_collect_counts_every_plot_it_writes(nim_collected):
    """Issue 38 item 6: collect's "wrote ... and 4 plots" counted 4 of the 7 it wrote (not the strength
    curves nor the Elo curve). The count is the report's figures: every plot in plots/, each shown once."""
    exp_dir, _, out = nim_collected
    (count,) = re.findall(r"report\.html and (\d+) plots in ", out)
    written = sorted(p.name for p in (exp_dir / "results" / "plots").glob("*.png"))
    assert written == ["curves.png", "elo.png", "strength_loss_rate.png", "strength_win_rate.png"]
    figures = _Page((exp_dir / "results" / "report.html").read_text()).figures
    assert int(count) == len(written) == len([f for f in figures if "img" in f])


def test_eval_csv_names_the_opponent_of_every_game(nim_collected):
    """Issue 38 item 2: a game's eval.csv pooled every opponent's games with nothing to tell them apart."""
    _, run_dirs, _ = nim_collected
    for rd in run_dirs:
        games = read_csv(rd / "eval.csv")
        assert list(games[0])[:3] == ["episode", "opponent", "return"]
        for row in rundir.read_strength(rd / "strength.csv"):
            mine = [g for g in games if g["opponent"] == row["opponent"]]
            assert len(mine) == row["games"] and sum(float(g["return"]) > 0 for g in mine) == row["wins"]


def _rows(rates: dict[str, list[float]], steps: list[int]) -> list[dict]:
    """strength_curve.csv rows as rundir.read_strength gives them: per step, a row per opponent with its win and loss rate."""
    out = []
    for k, step in enumerate(steps):
        for opponent, (win, loss) in rates.items():
            out.append({"step": float(step), "opponent": opponent, "win_rate": win[k], "loss_rate": loss[k]})
    return out


def test_rate_curves_go_through_the_evaluations_on_0_to_1():
    """Issue 38 item 2: a loss rate that stayed 0 was drawn on an axis from -0.04 to 0.04 (negative rates), and
    curves through 4 evaluations were interpolated onto 100 points without a marker. Each panel is on [0, 1],
    the curve has a marker at each evaluation (the k-th of every seed, at the median of their steps), and the
    x axis is named as collect names the runs' steps."""
    seeds = [
        _rows({"perfect": ([0.0] * 4, [0.0] * 4), "mcts:50": ([0.1, 0.2, 0.3, 0.2], [0.5, 0.3, 0.2, 0.1])}, [1010, 2030, 3001, 4020]),
        _rows({"perfect": ([0.0] * 4, [0.0] * 4), "mcts:50": ([0.2, 0.2, 0.4, 0.5], [0.4, 0.4, 0.1, 0.0])}, [1000, 2010, 3040, 4000]),
        _rows({"perfect": ([0.0] * 4, [0.0] * 4), "mcts:50": ([0.0, 0.3, 0.3, 0.4], [0.6, 0.2, 0.2, 0.1])}, [1020, 2000, 3020, 4010]),
    ]
    curves, csv_rows, notes = results_strength.rate_curves({"default": seeds}, "iqm")
    assert not notes and list(curves["loss_rate"]) == ["perfect", "mcts:50"]  # the strongest first
    steps = scoring_of({"algo": "alphazero"}, "iqm", None, ["nim"]).steps
    assert steps == "self-play positions" and scoring_of({"algo": "ppo"}, "iqm", None, ["CartPole-v1"]).steps == "environment steps"
    for narrow in (False, True):
        fig = results_strength.rate_figure(curves["loss_rate"], "loss_rate", "iqm", steps, narrow)
        panels = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
        assert [ax.get_title() for ax in panels] == ["perfect", "mcts:50"]
        for ax in panels:
            low, high = ax.get_ylim()
            assert -0.05 < low <= 0 and 1 <= high < 1.05, f"a rate drawn on {low:g}..{high:g}"
            (line,) = [line for line in ax.lines if len(line.get_xdata())]
            assert list(line.get_xdata()) == [1010, 2010, 3020, 4010] and line.get_marker() == "o"
        assert panels[-1].get_xlabel() == "self-play positions"
    assert [float(r[4]) for r in csv_rows if r[1:3] == ["perfect", "loss_rate"]] == [0.0] * 4


def test_a_missing_or_corrupt_strength_file_is_named_and_the_rest_reported(tmp_path, capsys):
    """Issue 37 item 4: a ladder.csv cut mid-line (its last pair dropped unseen: 67/261/194 became
    0/280) and a strength.csv row of 9 wins in 4 games (a win rate of 2.25) are named and left out; a file there but
    unreadable is named as such."""
    exp_dir, run_dirs = nim_experiment(tmp_path, [0, 1, 2])
    (run_dirs[0] / "strength.csv").write_text(",".join(rundir.STRENGTH_COLUMNS) + "\nrandom,4,9,0,0,2.25,0,0\n")
    (run_dirs[1] / "strength.csv").unlink()
    ladder = (run_dirs[2] / "ladder.csv").read_text()
    (run_dirs[2] / "ladder.csv").write_text(ladder[: len(ladder) - 4])
    (run_dirs[1] / "strength_curve.csv").write_bytes(b"\xff\xfe")
    (run_dirs[0] / "ladder.csv").unlink()
    (run_dirs[0] / "ladder.csv").mkdir()  # there, and unreadable (another user's, an I/O error)
    assert collect(exp_dir) == 0
    out = capsys.readouterr().out
    ids = [rd.name for rd in run_dirs]
    assert f"run {ids[0]} (default, seed 0): corrupt strength.csv (ValueError: line 2: 9 wins, 0 draws, 0 losses in 4 games" in out
    assert f"run {ids[1]} (default, seed 1): no strength.csv" in out
    assert f"run {ids[1]} (default, seed 1): corrupt strength_curve.csv (UnicodeDecodeError: " in out
    assert f"run {ids[2]} (default, seed 2): corrupt ladder.csv (ValueError: line {ladder.count(chr(10))} is cut short" in out
    assert f"run {ids[0]} (default, seed 0): unreadable ladder.csv (Is a directory)" in out
    table = read_csv(exp_dir / "results" / "strength.csv")
    assert all(r["seeds"] == "1" for r in table) and "2.25" not in out  # seed 2 alone
    assert {r["seed"] for r in read_csv(exp_dir / "results" / "elo.csv")} == {"1"}
    assert "corrupt ladder.csv" in (exp_dir / "results" / "report.md").read_text()


STRENGTH_HEADER = ",".join(rundir.STRENGTH_COLUMNS) + "\n"
LADDER = "player_a,player_b,games,a_wins,draws,b_wins\nrandom,20,4,1,0,3\nrandom,40,4,0,1,3\n20,40,4,1,1,2\n"


@pytest.mark.parametrize(("name", "text", "words"), [
    ("strength.csv", STRENGTH_HEADER + "random,4,9,0,0,2.25,0,0\n", "line 2: 9 wins, 0 draws, 0 losses in 4 games"),
    ("strength.csv", STRENGTH_HEADER + "random,0,0,0,0,0,0,0\n", "line 2: 0 wins, 0 draws, 0 losses in 0 games"),
    ("strength.csv", STRENGTH_HEADER + "random,4,3,0,1,0.75,0,0.25\nperfect,4,1,1,2,0.9,0.25,0.5\n", "line 3: win_rate 0.9 is not 1 wins in 4 games"),
    ("strength.csv", STRENGTH_HEADER + "random,4,2.5,0,1.5,0.625,0,0.375\n", "line 2: 2.5 wins"),
    ("strength.csv", STRENGTH_HEADER + "random,4,3,0,1,0.75,0,0.2", "line 2 is cut short"),
    ("strength.csv", "opponent,games,wins\nrandom,4,x\n", "no column draws"),
    ("strength.csv", STRENGTH_HEADER + "random,4,3,0,1,0.75,0,0.25\nperfect,4,three,0,1,0.75,0,0.25\n", "line 3 does not parse: perfect,4,three,0,1,0.75,0,0.25"),
    ("strength_curve.csv", "step," + STRENGTH_HEADER + "20,random,2,3,0,0,1.5,0,0\n", "line 2: 3 wins, 0 draws, 0 losses in 2 games"),
    ("ladder.csv", LADDER[:-4], "line 4 is cut short"),
    ("ladder.csv", LADDER[: LADDER.index("20,40")], "2 pairs of 3 players, where a round robin with random has every pair"),
    ("ladder.csv", LADDER.replace("random,20", "1,20").replace("random,40", "1,40"), "3 pairs of 3 players, where a round robin with random"),
    ("ladder.csv", LADDER + "40,random,4,1,0,3\n", "line 5: 40 vs random again"),
    ("ladder.csv", LADDER + "40,40,4,1,0,3\n", "line 5: 40 vs 40 is a player against itself"),
    ("ladder.csv", LADDER.replace("1,1,2", "1,1,3"), "line 4: 1 a_wins, 1 draws, 3 b_wins in 4 games"),
    ("ladder.csv", LADDER.replace("20,40", "20,best"), "line 4: player 'best' is neither random nor a policy's step"),
])  # fmt: skip
def test_the_one_reader_of_each_strength_file_names_the_damaged_line(tmp_path, name, text, words):
    path = tmp_path / name
    path.write_text(text)
    reader = {"ladder.csv": rundir.read_ladder, "strength.csv": rundir.read_strength, "strength_curve.csv": lambda p: rundir.read_strength(p, curve=True)}[name]
    with pytest.raises(ValueError, match=re.escape(words)):
        reader(path)


def test_the_strength_readers_take_whole_files_and_a_log_s_torn_last_line(tmp_path):
    (tmp_path / "ladder.csv").write_text(LADDER)
    assert [(r["player_a"], r["b_wins"]) for r in rundir.read_ladder(tmp_path / "ladder.csv")] == [("random", 3), ("random", 3), ("20", 2)]
    (tmp_path / "strength.csv").write_text(STRENGTH_HEADER + "random,3,2,0,1,0.6667,0,0.3333\n")
    assert rundir.read_strength(tmp_path / "strength.csv")[0]["win_rate"] == pytest.approx(2 / 3, abs=1e-4)
    (tmp_path / "strength_curve.csv").write_text("step," + STRENGTH_HEADER + "20,random,2,1,0,1,0.5,0,0.5\n40,rand")  # being written
    assert [r["step"] for r in rundir.read_strength(tmp_path / "strength_curve.csv", curve=True)] == [20]


def test_a_resumed_run_drops_the_snapshots_of_the_steps_it_redoes(tmp_path):
    weights = {"w": torch.zeros(2)}
    for step in (100, 200, 300):
        checkpoint.snapshot(tmp_path, step, weights)
    (tmp_path / checkpoint.LADDER / ".step-000000000400.pt.tmp").write_bytes(b"torn")  # a write killed midway
    checkpoint.drop_snapshots_after(tmp_path, 200)
    assert [s for s, _ in checkpoint.snapshots(tmp_path)] == [100, 200]
    assert sorted(p.name for p in (tmp_path / checkpoint.LADDER).iterdir()) == ["step-000000000100.pt", "step-000000000200.pt"]
    assert checkpoint.load(checkpoint.snapshots(tmp_path)[0][1])["step"] == 100
