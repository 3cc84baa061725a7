"""`hpcrl status --state WORD`, in both views and in `--json`, on an experiment with runs in every
state (test_status_scale's synthetic one, small): each word selects exactly the runs in its states,
and `--json`'s counts and settings cover the selection, not the whole experiment.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_status_scale import live_runner, run_cli, state_of, synthetic

from hpcrl.status import STATE_WORDS
from hpcrl.store.expdir import load_runs

RUNS = 50


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    exp = synthetic(tmp_path_factory.mktemp("mixed"), settings=5, seeds=10)
    with live_runner(exp):
        yield exp


@pytest.mark.parametrize("word", list(STATE_WORDS))
def test_each_state_word_selects_its_runs_and_json_counts_only_them(mixed: Path, capsys, word: str) -> None:
    expected = {r.run_id for r in load_runs(mixed) if state_of(r.index) == word}
    by_state = Counter(state_of(r.index) for r in load_runs(mixed))
    assert set(by_state) == {"done", "failed", "running", "cancelled", "pending"}  # every state the words below tell apart

    rc, out, _ = run_cli(["status", str(mixed), "--state", word, "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["total_runs"] == RUNS and doc["selection"]["state"] == [word]
    assert {r["run_id"] for r in doc["runs"]} == expected
    assert doc["counts"]["runs"] == len(expected)
    assert doc["counts"]["state"] == ({word: len(expected)} if expected else {})
    assert sum(s["runs"] for s in doc["settings"]) == len(expected)
    assert sum(sum(s["state"].values()) for s in doc["settings"]) == len(expected)

    rc, out, _ = run_cli(["status", str(mixed), "--state", word], capsys)
    lines = out.splitlines()
    assert rc == 0 and {line.split()[1] for line in lines[1:-2]} == expected
    counted = f": {len(expected)} {word}" if expected else ": none"
    assert lines[-1].startswith(f"{len(expected)} of {RUNS} runs selected{counted}"), lines[-1]
    settings = len(doc["settings"])  # a selection of no run has "0 settings", as English counts
    assert f"; {settings} setting{'' if settings == 1 else 's'}; aggregate: " in lines[-1], lines[-1]
