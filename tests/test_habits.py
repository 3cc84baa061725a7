"""The habits users bring (issue 18): did-you-mean on unknown keys, seed counts and ranges.

What a user relies on:
- a typo in a key names the closest known keys, in the one line with exit 2 (in a file, in `-p`,
  in the grid);
- `sweep.seeds: 5` is seeds 0..4 and `"10..19"` an inclusive range, giving the same runs (and run
  ids) as the list written out; a count of 0, -1 or 10^9, a reversed range or a bad string is one
  line and exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from factories import write_config

from hpcrl.cli import main, parser
from hpcrl.config.load import load_experiment
from hpcrl.sweep.runs import expand


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "override,expected",
    [
        ("train.lrr=1e-3", "-p train.lrr: unknown key (did you mean train.lr?)"),
        ("trian.lr=1e-3", "-p trian.lr: unknown key (did you mean train.lr?)"),
        ("env.num_env=3", "-p env.num_env: unknown key (did you mean env.num_envs?)"),
        ("sweep.grid={train.gamm: [0.9, 0.99]}", "sweep.grid.train.gamm: unknown key (did you mean train.gamma"),
        ("zzzz=1", "-p zzzz: unknown key\n"),  # nothing close: no guess
    ],
)
def test_an_unknown_key_names_the_closest_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, expected: str) -> None:
    err = _refused(["sweep", str(write_config(tmp_path)), "--scheduler", "local", "--dry-run", "-p", override], capsys)
    assert expected in err, err


@pytest.mark.parametrize(
    "override,expected",
    [
        ("algo=ppoo", "algo: expected one of 'ppo', 'a2c', 'dqn', 'alphazero', 'program', got 'ppoo' (did you mean 'ppo'?)\n"),
        ("env.backend=vizdom", "env.backend: expected one of 'gymnasium', 'vizdoom', 'habitat', 'openspiel', 'game', got 'vizdom' (did you mean 'vizdoom'?)\n"),
        ("algo=zzzz", "got 'zzzz'\n"),  # nothing close: no guess
    ],
)
def test_a_value_outside_a_fixed_set_names_the_closest_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, expected: str) -> None:
    err = _refused(["sweep", str(write_config(tmp_path)), "--scheduler", "local", "--dry-run", override], capsys)
    assert expected in err, err


def test_the_api_names_every_scheduler_the_cli_takes(tmp_path: Path) -> None:
    """The API's unknown-scheduler error listed auto, local, slurm and sge (a ValueError), not debug."""
    from hpcrl import api
    from hpcrl.schedulers import SWEEP_CHOICES

    with pytest.raises(api.ConfigError, match=r"^--scheduler: expected one of 'auto', 'local', 'slurm', 'sge', 'debug', got 'debgu' \(did you mean 'debug'\?\)$"):
        api.sweep(write_config(tmp_path), scheduler="debgu")
    assert not (tmp_path / "logs").exists()
    choices = next(a.choices for a in parser()._subparsers._group_actions[0].choices["sweep"]._actions if a.dest == "scheduler")  # type: ignore[union-attr]
    assert tuple(choices) == SWEEP_CHOICES


def test_a_typo_in_the_file_names_the_closest_key_of_its_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["sweep", str(write_config(tmp_path, {"train": {"lrr": 1e-3}})), "--scheduler", "local", "--dry-run"], capsys)
    assert "train.lrr: unknown key (did you mean train.lr? expected one of: " in err, err


@pytest.mark.parametrize("short,listed", [(5, [0, 1, 2, 3, 4]), ("10..12", [10, 11, 12]), (" 7 .. 7 ", [7]), (1, [0])])
def test_a_seed_count_or_range_is_the_list_it_stands_for(tmp_path: Path, short: object, listed: list[int]) -> None:
    written = expand(load_experiment(write_config(tmp_path, {"sweep": {"seeds": listed}}, name="listed.yaml")))
    shorthand = expand(load_experiment(write_config(tmp_path, {"sweep": {"seeds": short}}, name="short.yaml")))
    assert [r.seed for r in shorthand] == listed
    assert [r.run_id for r in shorthand] == [r.run_id for r in written]  # run ids of existing experiments do not change
    from_cli = expand(load_experiment(write_config(tmp_path, name="cli.yaml"), [f"sweep.seeds={yaml.safe_dump(short).splitlines()[0]}"]))
    assert [r.run_id for r in from_cli] == [r.run_id for r in written]


@pytest.mark.parametrize(
    "value,expected",
    [
        ("0", "sweep.seeds: a count of seeds is 1..100,000, got 0"),
        ("-1", "sweep.seeds: a count of seeds is 1..100,000, got -1"),
        ("1000000000", "sweep.seeds: a count of seeds is 1..100,000, got 1000000000"),
        ("12..10", "sweep.seeds: a range of seeds is LOW..HIGH with LOW <= HIGH"),
        ("0..4294967296", "sweep.seeds: a range of seeds is LOW..HIGH"),
        ("0..200000", "sweep.seeds: a range of seeds is LOW..HIGH"),
        ("a..b", "sweep.seeds: expected a list of seeds, a count (5) or a range ('10..19'), got 'a..b'"),
        ("1e9", "sweep.seeds: expected a list of seeds, a count (5) or a range"),
        ("2.5", "sweep.seeds: expected a list, got 2.5"),
        ("true", "sweep.seeds: expected a list, got True"),
    ],
)
def test_a_bad_seed_count_or_range_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, expected: str) -> None:
    err = _refused(["sweep", str(write_config(tmp_path)), "--scheduler", "local", "-p", f"sweep.seeds={value}"], capsys)
    assert expected in err, err
    assert not (tmp_path / "logs").exists()


# ------------------------------------------------------------------------------------ the JSON Schema

BUNDLED = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))
BAD_CONFIGS = [  # each refused by hpcrl and by the schema
    ({"trian": {"lr": 1e-3}}, "an unknown section"),
    ({"train": {"lrr": 1e-3}}, "an unknown key of train"),
    ({"train": {"lr": "fast"}}, "a word for a number"),
    ({"train": {"lr": -1.0}}, "lr > 0"),
    ({"train": {"gamma": 1.5}}, "gamma in [0, 1]"),
    ({"env": {"num_envs": 0}}, "num_envs >= 1"),
    ({"algo": "sac"}, "an algorithm hpcrl lacks"),
    ({"env": {"backend": "atari"}}, "a backend hpcrl lacks"),
    ({"sweep": {"seeds": []}}, "no seed"),
    ({"sweep": {"seeds": 0}}, "a seed count of 0"),
    ({"sweep": {"seeds": "a..b"}}, "a bad seed range"),
    ({"resources": {"ranks": 0}}, "ranks >= 1"),
    ({"resources": {"gpus": 1.5}}, "a fraction of a GPU"),
    ({"algo": "dqn", "train": {"buffer_size": -5}}, "a DQN key checked with DQN's fields"),
    ({"algo": "dqn", "train": {"clip_coef": 0.2}}, "a PPO key under algo dqn"),
    ({"eval": {"checkpoint": "newest"}}, "a choice that does not exist"),
]


def _validator() -> object:
    jsonschema = pytest.importorskip("jsonschema", reason="the schema is checked with jsonschema (in the dev extra)")
    from hpcrl.config.json_schema import config_schema

    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _read(path: Path) -> dict:
    from hpcrl.config import strict_yaml
    from hpcrl.config.schema import plain

    return plain(strict_yaml.load(path.read_text()))


@pytest.mark.parametrize("path", BUNDLED, ids=[p.stem for p in BUNDLED])
def test_every_bundled_config_is_valid_under_the_schema(path: Path) -> None:
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in _validator().iter_errors(_read(path))]  # type: ignore[attr-defined]
    assert not errors, errors


@pytest.mark.parametrize("change,what", BAD_CONFIGS, ids=[w for _, w in BAD_CONFIGS])
def test_schema_and_validator_agree_on_a_bad_config(tmp_path: Path, change: dict, what: str) -> None:
    from factories import TINY, deep_update

    from hpcrl.config.schema import ConfigError

    data = deep_update(TINY, {"output": str(tmp_path / "logs"), **change})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError):
        load_experiment(path)
    assert list(_validator().iter_errors(_read(path))), f"the schema accepts {what}"  # type: ignore[attr-defined]
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(deep_update(TINY, {"output": str(tmp_path / "logs")})))
    load_experiment(good)
    assert not list(_validator().iter_errors(_read(good)))  # type: ignore[attr-defined]


def test_the_schema_is_the_config_s_own_fields_with_their_docs() -> None:
    from hpcrl.config.json_schema import config_schema
    from hpcrl.config.key_paths import known_paths

    schema = config_schema()
    for algo, rule in zip(("ppo", "a2c", "dqn"), schema["allOf"]):
        assert rule["if"]["properties"]["algo"]["const"] == algo
        train = rule["then"]["properties"]["train"]["properties"]
        assert {p.split(".", 1)[1] for p in known_paths(algo) if p.startswith("train.")} == set(train)
    resources = schema["properties"]["resources"]["properties"]
    assert resources["ranks"]["minimum"] == 1 and resources["ranks"]["maximum"] == 4096 and resources["ranks"]["default"] == 1
    assert resources["ranks"]["description"].startswith("Processes of one run")
    assert {p.split(".")[0] for p in known_paths("ppo")} <= set(schema["properties"])


# ------------------------------------------------------------------------------------ --scheduler debug


@pytest.mark.e2e
def test_debug_runs_every_stage_in_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    import hpcrl.rl.train as train

    pids = []
    real = train._train_ranks
    monkeypatch.setattr(train, "_train_ranks", lambda *a, **k: pids.append(os.getpid()) or real(*a, **k))
    config = write_config(tmp_path)
    assert main(["sweep", str(config), "--scheduler", "debug"]) == 0
    exp = tmp_path / "logs" / "tiny"
    assert pids == [os.getpid()] * 2  # both seeds trained here, where a breakpoint stops
    for rd in (exp / "runs").iterdir():
        assert (rd / "DONE").exists() and (rd / "EVAL_DONE").exists()
    assert (exp / "results" / "summary.csv").exists() and not list(exp.glob("jobs/*.sh"))  # no job script: nothing was submitted
    out = capsys.readouterr().out
    assert out.count("[debug] train") == 2 and out.count("[debug] eval") == 2
    # The same run directories a scheduler's jobs would use: a second sweep finds everything done.
    assert main(["sweep", str(config), "--scheduler", "debug"]) == 0
    assert "nothing submitted" in capsys.readouterr().out and pids == [os.getpid()] * 2  # done: not trained again


def test_debug_evaluates_what_the_other_backends_would(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A debug sweep plans the same jobs as the others: of the trained runs, only those whose
    evaluation failed or never ran are evaluated again; a skipped evaluation stays skipped (the
    debug sweep used to evaluate it, a second copy of the stage graph with its own rule)."""
    from hpcrl.store import rundir

    config = write_config(tmp_path)
    assert main(["sweep", str(config), "--scheduler", "debug"]) == 0
    skipped, failed = sorted((tmp_path / "logs" / "tiny" / "runs").iterdir())
    rundir.mark(skipped, rundir.EVAL_SKIPPED, "train unfinished")
    rundir.mark(failed, rundir.EVAL_FAILED, "evaluation failed")
    capsys.readouterr()
    assert main(["sweep", str(config), "--scheduler", "debug"]) == 0
    out = capsys.readouterr().out
    assert f"[debug] eval {failed.name}" in out and f"[debug] eval {skipped.name}" not in out and "[debug] train" not in out
    assert rundir.eval_state(failed) == "done" and rundir.eval_state(skipped) == "skipped"


@pytest.mark.e2e
def test_a_debugger_stops_inside_the_training_of_a_debug_sweep(tmp_path: Path) -> None:
    import inspect
    import subprocess
    import sys

    from hpcrl.rl import ppo

    lines, start = inspect.getsourcelines(ppo.OnPolicyAgent.train_iteration)
    line = start + next(i for i, text in enumerate(lines) if "self._next_rollout()" in text)
    config = write_config(tmp_path)
    commands = f"b {ppo.__file__}:{line}\nc\np self.iteration, self.num_envs\nq\n"
    proc = subprocess.run(
        [sys.executable, "-m", "pdb", "-m", "hpcrl", "sweep", str(config), "--scheduler", "debug"],
        input=commands, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert f"ppo.py({line})train_iteration()" in proc.stdout, proc.stdout[-2000:]
    assert "(0, 2)" in proc.stdout  # the first iteration of the run, its 2 envs, seen from the debugger


def test_debug_refuses_what_needs_several_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["sweep", str(write_config(tmp_path, {"resources": {"ranks": 2}})), "--scheduler", "debug"], capsys)
    assert "--scheduler debug: resources.ranks is 2; one process is one rank" in err
    apex = Path(__file__).resolve().parent.parent / "configs" / "cartpole_apex.yaml"
    err = _refused(["sweep", str(apex), "--scheduler", "debug", "-p", f"output={tmp_path / 'logs'}"], capsys)
    assert "--scheduler debug: distributed (Ape-X)" in err
    assert not (tmp_path / "logs").exists()


# ------------------------------------------------------------------------------------ the command line


def test_positional_overrides_are_parsed_as_p_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(write_config(tmp_path))
    assert main(["sweep", config, "train.lr=3e-4", "--scheduler", "local", "--dry-run", "sweep.seeds=3", "-p", "train.gamma=0.9"]) == 0
    assert "# dry run: 3 runs" in capsys.readouterr().out
    exp = load_experiment(config, ["train.lr=3e-4"])
    assert exp.train.lr == 3e-4
    err = _refused(["sweep", config, "--scheduler", "local", "train.lrr=3e-4"], capsys)
    assert "-p train.lrr: unknown key (did you mean train.lr?)" in err
    err = _refused(["sweep", config, "--scheduler", "local", "second.yaml"], capsys)
    assert "'second.yaml': expected KEY.PATH=VALUE after the config" in err
    err = _refused(["sweep", config, "--scheduler", "local", 'container.home="/x\\nrm -rf /"'], capsys)  # a YAML escape: a real line break
    assert "container.home: expected a single line" in err, err
    err = _refused(["sweep", config, "--scheduler", "local", "resources.partition=gpu\n#SBATCH --wrap=x"], capsys)  # YAML would read a comment
    assert "-p resources.partition: an override is one line, got a line break in 'gpu\\n#SBATCH --wrap=x'" in err, err
    assert not (tmp_path / "logs").exists()


def test_flow_mappings_in_overrides_read_alike_with_or_without_spaces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hydra's `{a:1,b:2}` was the key 'a:1' with no value (a section override: `train.lr:1: unknown
    key`; env.kwargs: a kwarg 'a:1'), and the spaced form split by the shell a stray word."""
    config = write_config(tmp_path)
    for text in ("{a:1,b:2}", "{a: 1, b: 2}", "{a:1, b: 2}"):
        assert load_experiment(config, [f"env.kwargs={text}"]).env.kwargs == {"a": 1, "b": 2}, text
    for text in ("{lr:1e-3,gamma:0.9}", "{lr: 1e-3, gamma: 0.9}"):
        train = load_experiment(config, [f"train={text}"]).train
        assert (train.lr, train.gamma) == (1e-3, 0.9), text
    assert load_experiment(config, ["env.kwargs={url:http://x:80,nested:{k:[1,2]}}"]).env.kwargs == {"url": "http://x:80", "nested": {"k": [1, 2]}}
    assert [r.config.train.lr for r in expand(load_experiment(config, ["sweep.grid={train.lr:[1e-3,3e-4]}", "sweep.seeds=[0]"]))] == [1e-3, 3e-4]
    err = _refused(["sweep", str(config), "--scheduler", "local", "train={lr:", "1e-3,", "gamma:", "0.9}"], capsys)
    assert "'train={lr:' '1e-3,': one override that the shell split at a space: quote it" in err, err
    err = _refused(["sweep", str(config), "--scheduler", "local", "train={lr:1e-3"], capsys)
    assert "-p train: malformed YAML: " in err and "in '{lr:1e-3'" in err, err
    assert not (tmp_path / "logs").exists()


def test_init_writes_a_starter_and_never_overwrites_by_surprise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hpcrl.starters import bundled

    assert main(["init", "mine", "--from", "cartpole_dqn", "--dir", str(tmp_path)]) == 0
    path = tmp_path / "mine.yaml"
    text = path.read_text()
    assert "name: mine\n" in text and text.replace("name: mine", "name: cartpole_dqn") == bundled()["cartpole_dqn"].read_text()
    assert load_experiment(path).algo == "dqn"
    path.write_text(text + "# my notes\n")
    err = _refused(["init", "mine", "--dir", str(tmp_path)], capsys)
    assert "exists; choose another name or pass --force" in err and path.read_text().endswith("# my notes\n")
    assert main(["init", "mine", "--dir", str(tmp_path), "--force"]) == 0 and "# my notes" not in path.read_text()
    for bad, expected in (("9lives", "expected a letter"), ("a b", "expected a letter"), ("x" * 201, "at most 200"), ("../up", "expected a letter")):
        assert expected in _refused(["init", bad, "--dir", str(tmp_path)], capsys)
    assert "did you mean cartpole_ppo" in _refused(["init", "x", "--from", "cartpole_ppp", "--dir", str(tmp_path)], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]


@pytest.mark.parametrize("given", ["x.yaml", "x.yml"])
def test_init_of_a_file_name_writes_that_file_named_by_its_stem(tmp_path: Path, given: str) -> None:
    """`hpcrl init x.yaml` wrote `x.yaml.yaml` named `x.yaml`."""
    assert main(["init", given, "--dir", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == [given]
    assert "name: x\n" in (tmp_path / given).read_text() and load_experiment(tmp_path / given).name == "x"


def test_configs_lists_every_bundled_config_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [p.stem for p in BUNDLED] and all(len(line.split()) > 3 for line in lines)


def test_schema_command_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from hpcrl.config.json_schema import config_schema

    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(config_schema()))


def test_shell_completion_completes_subcommands_options_configs_and_experiments(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    pytest.importorskip("argcomplete", reason="completion is the optional [completion] extra")
    (tmp_path / "logs" / "exp1").mkdir(parents=True)
    (tmp_path / "mine.yaml").write_text("name: mine\n")
    script = subprocess.run([sys.executable, "-m", "hpcrl", "completion", "bash"], capture_output=True, text=True, check=True).stdout
    assert "complete" in script and "hpcrl" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)

    def complete(line: str) -> list[str]:
        out = tmp_path / "completions"
        env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)), "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}
        subprocess.run([sys.executable, "-m", "hpcrl"], env=env, cwd=tmp_path, capture_output=True, timeout=60)
        return out.read_text().replace("\x0b", " ").split()

    assert complete("hpcrl sw") == ["sweep"]
    assert complete("hpcrl sweep --sch") == ["--scheduler"]
    assert complete("hpcrl sweep --scheduler ") == ["auto", "local", "slurm", "sge", "debug"]
    assert complete("hpcrl sweep mi") == ["mine.yaml"]
    assert complete("hpcrl status logs/") == ["logs/exp1/"]
    assert "cartpole_ppo" in complete("hpcrl init x --from cartpole_p")


def test_version_names_the_commit_of_a_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    import re

    with pytest.raises(SystemExit):
        main(["--version"])
    assert re.fullmatch(r"hpcrl \d+\.\d+\.\d+ \(git [0-9a-f]{12}, .+\)\n", capsys.readouterr().out)


# ------------------------------------------------------------------------------------ the Python API


@pytest.mark.e2e
def test_a_whole_local_sweep_through_the_python_api(tmp_path: Path) -> None:
    import io

    from hpcrl import api

    out = io.StringIO()
    exp_dir = api.sweep(write_config(tmp_path), "sweep.seeds=3", "train.total_steps=512", scheduler="local", out=out)
    assert exp_dir == tmp_path / "logs" / "tiny" and "submitted 3 of 3 runs to local" in out.getvalue()
    found = api.status(exp_dir)
    assert found["counts"]["runs"] == 3 and found["counts"]["state"] == {"done": 3} and found["aggregate"] == "done"
    assert [r["seed"] for r in found["runs"]] == [0, 1, 2] and all(r["step"] == 512 for r in found["runs"])
    assert api.status(exp_dir, settings=["default"])["counts"]["runs"] == 3
    assert api.collect(exp_dir, out=io.StringIO()) == 0 and (exp_dir / "results" / "report.html").exists()
    # The CLI's errors, as exceptions carrying the CLI's line.
    with pytest.raises(api.ConfigError, match=r"train.lrr: unknown key \(did you mean train.lr\?\)"):
        api.sweep(write_config(tmp_path), "train.lrr=1", scheduler="local")
    with pytest.raises(api.ConfigError, match="not an experiment directory"):
        api.status(tmp_path)
    with pytest.raises(api.ConfigError, match="bogus"):
        api.status(exp_dir, states=["bogus"])
    assert api.load(write_config(tmp_path), "train.lr=3e-4").train.lr == 3e-4
