"""`algo: program`: the config of a user's own trainer and the command line it renders.

What a user relies on: the job script shows the program's command line literally (the seed's
`python baselines/train_ppo.py --lr 2.5e-4 ...`), in the style the program parses, quoted so that
no parameter can run a command; program parameters sweep and hash like hpcrl's own settings; and
bad input (an unknown placeholder, a command that is not there) is one line and exit 2, before
anything is written.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hpcrl.cli import main
from hpcrl.config import program_spec
from hpcrl.config.load import experiment_from_dict, load_experiment
from hpcrl.schedulers import get_scheduler
from hpcrl.submit.pipeline import plan_scripts
from hpcrl.sweep import runs as sweep

REPO = Path(__file__).resolve().parents[2]
VALUES = {"run_dir": "/e/runs/r", "checkpoint_dir": "/e/runs/r/checkpoints", "seed": "3", "run_id": "r", "experiment_dir": "/e"}


def program_exp(program: dict, **top) -> object:
    return experiment_from_dict({"name": "p", "algo": "program", "program": program, **top})


def argv(program: dict) -> list[str]:
    return program_spec.argv(program_exp(program).program, VALUES)


def test_the_seed_command_line_renders_as_the_seed_wrote_it() -> None:
    exp = load_experiment(REPO / "configs" / "habitat_own_trainer.yaml", ["program.workdir=/w"])
    words = program_spec.argv(exp.program, VALUES)
    seed = ("python baselines/train_ppo.py --lr 2.5e-4 --clip-param 0.1 --value-loss-coef 0.5 --num-processes 32 --num-steps 128 "
            "--num-mini-batch 4 --entropy-coef 0.01 --hidden-size 512 --num_gpu 4 --checkpoint-interval 1000").split()
    assert words[: len(seed)] == seed
    assert words[len(seed):] == ["--checkpoint-folder", "/e/runs/r/checkpoints", "--log-file", "/e/runs/r/train.log"]


@pytest.mark.parametrize(
    "style,expected",
    [
        ("argparse", ["--lr", "3e-4", "--sizes", "64", "64", "--cuda", "--name", "a b"]),
        ("equals", ["--lr=3e-4", "--sizes=64,64", "--cuda=true", "--no_video=false", "--name=a b"]),
        ("hydra", ["lr=3e-4", "sizes=[64,64]", "cuda=true", "no_video=false", "name=a b", "gone=null"]),
        ("none", []),
    ],
)
def test_styles(style: str, expected: list[str]) -> None:
    params = {"lr": "3e-4", "sizes": [64, 64], "cuda": True, "no_video": False, "name": "a b", "gone": None}
    assert argv({"command": ["t"], "style": style, "params": params}) == ["t", *expected]


def test_names_map_underscores_and_dashes_and_hydra_nests() -> None:
    assert argv({"command": ["t"], "names": "dashes", "params": {"clip_param": 0.1}}) == ["t", "--clip-param", "0.1"]
    assert argv({"command": ["t"], "names": "underscores", "params": {"num-gpu": 4}}) == ["t", "--num_gpu", "4"]
    flat = argv({"command": ["t"], "style": "hydra", "params": {"habitat_baselines.rl.ppo.lr": 2.5e-4, "+extra": 1}})
    nested = argv({"command": ["t"], "style": "hydra", "params": {"habitat_baselines": {"rl": {"ppo": {"lr": 2.5e-4}}}, "+extra": 1}})
    assert flat == nested == ["t", "habitat_baselines.rl.ppo.lr=0.00025", "+extra=1"]


def test_numbers_keep_their_spelling_from_yaml(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("name: p\nalgo: program\nprogram:\n  command: [t]\n  params: {lr: 2.5e-4, eps: 1e-5, n: 0x10}\n")
    exp = load_experiment(tmp_path / "c.yaml")
    assert program_spec.argv(exp.program, VALUES) == ["t", "--lr", "2.5e-4", "--eps", "1e-5", "--n", "0x10"]


def test_placeholders_fill_and_shell_or_hydra_interpolations_stay() -> None:
    words = argv({"command": ["t"], "params": {"lr": 1}, "args": ["{run_dir}/x", "--seed={seed}", "${oc.env:HOME}", "{{literal}}", "lr:{params.lr}"]})
    assert words == ["t", "--lr", "1", "/e/runs/r/x", "--seed=3", "${oc.env:HOME}", "{literal}", "lr:1"]


def test_placeholders_in_string_parameters_fill_like_in_args() -> None:
    """README: placeholders work in string parameters too (`log_dir: "{run_dir}/tb"`), in every style."""
    for style, expected in (("argparse", ["--log_dir", "/e/runs/r/tb"]), ("equals", ["--log_dir=/e/runs/r/tb"]), ("hydra", ["log_dir=/e/runs/r/tb"])):
        assert argv({"command": ["t"], "style": style, "params": {"log_dir": "{run_dir}/tb"}})[1:] == expected, style


def test_a_one_word_eval_command_is_accepted_and_an_empty_one_refused() -> None:
    """`program.eval.command: [./eval.sh]` is a whole command, as `program.command` may be one word."""
    exp = program_exp({"command": ["t"], "eval": {"command": ["./eval.sh"]}})
    assert exp.program.eval.command == ["./eval.sh"]
    with pytest.raises(ValueError, match="program.eval.command: expected at least 1 item"):
        program_exp({"command": ["t"], "eval": {"command": []}})


def test_grid_over_program_params_makes_distinct_runs_and_typed_values_hash_alike() -> None:
    base = {"name": "p", "algo": "program", "program": {"command": ["t"], "params": {"lr": 1e-3}}}
    grid = experiment_from_dict({**base, "sweep": {"seeds": [0, 1], "grid": {"program.params.lr": [1e-3, 3e-4]}}})
    runs = sweep.expand(grid)
    assert len({r.run_id for r in runs}) == 4 and len({r.setting_label for r in runs}) == 2
    # 1e-3 written as 0.001 is the same setting, so the same run id; a run-only setting is not hashed.
    same = experiment_from_dict({**base, "program": {"command": ["t"], "params": {"lr": 0.001}, "stop_signal": "TERM", "resume_args": ["--resume"]}})
    assert sweep.run_hash(same) == sweep.run_hash(experiment_from_dict(base))
    other = experiment_from_dict({**base, "program": {"command": ["t2"], "params": {"lr": 0.001}}})
    assert sweep.run_hash(other) != sweep.run_hash(experiment_from_dict(base))


@pytest.mark.parametrize(
    "program,extra,message",
    [
        ({"command": ["t", "{rundir}"]}, {}, "program.command[1]: unknown placeholder {rundir}"),
        ({"command": ["t"], "args": ["{params.lr}"]}, {}, "program.args: {params.lr}: no parameter 'lr'"),
        ({"command": ["t"], "resume_args": ["{latest}"]}, {}, "program.resume_args[0]: unknown placeholder {latest}"),
        ({"command": []}, {}, "program.command: expected at least 1 item"),
        ({"command": ["t"], "params": {"a b": 1}}, {}, "program.params.a b: expected a parameter name"),
        ({"command": ["t"], "params": {"lr": ".nan"}}, {}, "program.params.lr: expected a finite number"),
        ({"command": ["t"], "params": {"lr": [[1]]}}, {}, "program.params.lr: expected a value or a list of values"),
        ({"command": ["t"], "metrics": {"source": "csv"}}, {}, "program.metrics.path: required for source 'csv'"),
        ({"command": ["t"], "stop_signal": "KILL"}, {}, "program.stop_signal: expected one of"),
        ({"command": ["t"]}, {"train": {"lr": 1}}, "train: not used with algo 'program'"),
        ({"command": ["t"]}, {"env": {"id": "CartPole-v1"}}, "env: not used with algo 'program'"),
    ],
)
def test_bad_program_sections_are_one_line_and_exit_2(tmp_path: Path, capsys, program: dict, extra: dict, message: str) -> None:
    data = {"name": "p", "algo": "program", "output": str(tmp_path / "logs"), "program": program, **extra}
    text = yaml.safe_dump(data).replace("'.nan'", ".nan")
    (tmp_path / "c.yaml").write_text(text)
    assert main(["sweep", str(tmp_path / "c.yaml"), "--scheduler", "local"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "logs").exists()


def test_a_program_section_without_algo_program_and_the_reverse_are_refused() -> None:
    with pytest.raises(ValueError, match="program: required with algo 'program'"):
        experiment_from_dict({"name": "p", "algo": "program"})
    with pytest.raises(ValueError, match="program: only used with algo 'program'"):
        experiment_from_dict({"name": "p", "algo": "ppo", "program": {"command": ["t"]}})
    with pytest.raises(ValueError, match="-p train.lr: not used with algo 'program'"):
        experiment_from_dict({"name": "p", "algo": "program", "program": {"command": ["t"]}}, ["train.lr=1"])


def test_a_command_that_is_not_there_is_refused_at_sweep_time(tmp_path: Path, capsys) -> None:
    for command, message in (
        (["no-such-program-xyz"], "program.command[0]: 'no-such-program-xyz' is not found on the PATH"),
        ([sys.executable, "missing/train.py"], "program.command[1]: 'missing/train.py' is not found in"),
        (["./nothing.sh"], "program.command[0]: './nothing.sh' is not found in"),
    ):
        data = {"name": "p", "algo": "program", "output": str(tmp_path / "logs"), "program": {"command": command, "workdir": str(tmp_path)}}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
        assert main(["sweep", str(tmp_path / "c.yaml"), "--scheduler", "local"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not (tmp_path / "logs").exists()
    # Inside a container the command is the image's: not checked on this machine.
    data["container"] = {"image": str(tmp_path / "x.sif")}
    (tmp_path / "x.sif").write_text("")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    assert main(["sweep", str(tmp_path / "c.yaml"), "--scheduler", "local", "--dry-run"]) == 0


HOSTILE = ["$(touch pwned)", "`touch pwned`", "; touch pwned", "' \" \\ *", "--lr", "a  b", "~", "x > pwned", "$HOME", "a|touch pwned"]


@pytest.mark.parametrize("style", ["argparse", "equals", "hydra"])
def test_hostile_parameters_reach_the_program_as_words_and_run_nothing(tmp_path: Path, style: str) -> None:
    """A parameter value is one argument of the program, whatever it holds, in every style (an
    unquoted `--NAME=VALUE` would run it): the rendered script, run by bash, passes it through
    untouched and runs none of it."""
    exp = program_exp({"command": [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"], "style": style, "params": {f"p{i}": v for i, v in enumerate(HOSTILE)}},
                      output=str(tmp_path / "logs"))
    runs = sweep.expand(exp)
    text = plan_scripts(exp, get_scheduler("local", exp.dir), [0], 0, runs=runs)[0].text
    case = text[text.index('case "$TASK_ID"'): text.index("esac") + 4]
    script = f'TASK_ID=1\n{case}\n"${{PROGRAM[@]}}"\n'
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    expected = {
        "argparse": [w for i, v in enumerate(HOSTILE) for w in (f"--p{i}", v)],
        "equals": [f"--p{i}={v}" for i, v in enumerate(HOSTILE)],
        "hydra": [f"p{i}={v}" for i, v in enumerate(HOSTILE)],
    }[style]
    assert yaml.safe_load(out) == expected
    assert not (tmp_path / "pwned").exists()


def test_line_breaks_in_program_words_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"program.args\[0\]: expected a single line"):
        program_exp({"command": ["t"], "args": ["a\nrm -rf ~"]})
    with pytest.raises(ValueError, match="program.params.x: expected a single line"):
        program_exp({"command": ["t"], "params": {"x": "a\nb"}})
    with pytest.raises(ValueError, match="program.params.a.b: expected a single line"):
        program_exp({"command": ["t"], "style": "hydra", "params": {"a": {"b": "x\rtouch pwned"}}})


def test_arrays_split_into_chunks_keep_each_task_on_its_own_run(tmp_path: Path) -> None:
    """An array larger than the cluster allows is split; task i of each chunk runs the command of
    line i of that chunk's manifest, and nothing else."""
    exp = program_exp({"command": ["t"], "args": ["{run_id}"]}, output=str(tmp_path / "logs"), sweep={"seeds": [0, 1, 2, 3, 4]})
    runs = sweep.expand(exp)
    scheduler = get_scheduler("slurm", exp.dir)
    scheduler._max_array_size = 2  # what a cluster with MaxArraySize=2 answers
    trains = [p for p in plan_scripts(exp, scheduler, [r.index for r in runs], 0, runs=runs) if p.stage == "train"]
    assert [p.runs for p in trains] == [[0, 1], [2, 3], [4]]
    for planned in trains:
        for task, index in enumerate(planned.runs, start=1):
            assert f"  {task}) PROGRAM=(t {runs[index].run_id}) ;;" in planned.text
        assert f"  {len(planned.runs) + 1}) PROGRAM" not in planned.text


def test_build_image_installs_what_the_program_metrics_need(tmp_path: Path) -> None:
    from hpcrl.image import build as image

    data = {
        "name": "p", "algo": "program", "output": str(tmp_path / "logs"),
        "program": {"command": ["python", "-m", "rl_zoo3.train"], "metrics": {"source": "tensorboard"}},
        "image": {"pip": ["rl_zoo3>=2.3"]},
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    text = image.render_definition(load_experiment(tmp_path / "c.yaml")).text
    assert "/src[tensorboard]" in text and "rl_zoo3>=2.3" in text and ", tensorboard;" in text


ARGPARSE_TRAINER = """
import argparse, pathlib
p = argparse.ArgumentParser()
p.add_argument("--learning-rate", type=float)
p.add_argument("--total-steps", type=int)
args = p.parse_args()
pathlib.Path("trained").write_text("")
"""


def program_config(tmp_path: Path, script: str, params: dict, grid: dict | None = None) -> Path:
    (tmp_path / "train.py").write_text(script)
    data = {"name": "p", "algo": "program", "output": str(tmp_path / "logs"), "sweep": {"seeds": [0], "grid": grid or {}},
            "program": {"command": ["python3", "train.py"], "names": "dashes", "params": params, "workdir": str(tmp_path)}}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "c.yaml"


def test_the_dry_run_shows_the_first_runs_command_line_and_names_flags_the_program_lacks(tmp_path: Path, capsys) -> None:
    """A misspelled grid key would be passed as a new flag and fail every job after its queue wait:
    the dry run shows the command line, and the program's own --help names what it does not take."""
    config = program_config(tmp_path, ARGPARSE_TRAINER, {"learning_rate": 0.1, "total_steps": 5}, {"program.params.learning_rat": [1, 2]})
    assert main(["sweep", str(config), "--scheduler", "local", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    python = shutil.which("python3")
    assert f"# first run's command line: {python} train.py --learning-rate 0.1 --total-steps 5 --learning-rat 1\n" in out
    assert err == (f"hpcrl: warning: {config}: program.params: train.py --help does not list --learning-rat (program.params.learning_rat): "
                   "a misspelled key is passed as a flag the program does not take\n")
    assert not (tmp_path / "trained").exists() and not (tmp_path / "logs").exists()  # --help only: nothing trained
    config = program_config(tmp_path, ARGPARSE_TRAINER, {"learning_rate": 0.1}, {"program.params.total_steps": [1, 2]})
    assert main(["sweep", str(config), "--scheduler", "local", "--dry-run"]) == 0
    assert capsys.readouterr().err == ""  # every flag listed: nothing to say


def test_the_help_is_asked_only_of_argparse_scripts_and_within_a_time_limit(tmp_path: Path) -> None:
    from hpcrl.submit import program_help

    # A script without a parser would train when run with --help: it is not run at all.
    config = program_config(tmp_path, "import pathlib\npathlib.Path('trained').write_text('')\n", {"lr": 1})
    assert program_help.unlisted_flags(load_experiment(config)) is None and not (tmp_path / "trained").exists()
    # One that hangs before its parser is killed at the limit, and the sweep goes on.
    config = program_config(tmp_path, "import argparse, time\ntime.sleep(60)\n", {"lr": 1})
    started = time.monotonic()
    note = program_help.unlisted_flags(load_experiment(config), timeout=0.5)
    assert note == "train.py --help did not answer within 0.5 s (killed); program.params flags not checked"
    assert time.monotonic() - started < 10
