"""`hpcrl build-image`: golden definitions, the grammar checker, and builds through a STAND-IN runtime.

No Apptainer exists on the development machines. Build tests put tests/standins/apptainer on PATH:
a stand-in that records each call (argv, cwd, cache/tmp variables, files it would copy) and writes
a fake image. Golden files: HPCRL_UPDATE_GOLDEN=1 pytest tests/image/test_image.py rewrites them.
"""

from __future__ import annotations

import importlib.util
import inspect
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcrl.config.load import experiment_from_dict, load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.image import build as image
from hpcrl.image.defcheck import check_def, files_entries
from hpcrl.schedulers import get_scheduler
from hpcrl.schedulers.base import Scheduler
from hpcrl.submit import image_job

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "defs"
STANDIN = ROOT / "tests" / "standins" / "apptainer"
UPDATE = os.environ.get("HPCRL_UPDATE_GOLDEN") == "1"


def image_configs() -> list[Path]:
    """Shipped configs with an `image:` section, and the test configs."""
    candidates = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "tests" / "data").glob("*_image.yaml"))
    return [p for p in candidates if "image" in (yaml.safe_load(p.read_text()) or {})]


def run(config: str | None = "exp.yaml", *params: str, **flags) -> tuple[int, str]:
    """build_image_command with the CLI's defaults; (exit code, what it printed to out)."""
    out = io.StringIO()
    options = dict(dry_run=False, force=False, sandbox=False, submit=False, scheduler="auto", from_dockerfile=None)
    rc = image_job.build_image_command(config, list(params), **{**options, **flags}, out=out)
    return rc, out.getvalue()


# --------------------------------------------------------------------------------------------
# Golden definitions of the shipped and test configs.


@pytest.mark.parametrize("config", image_configs(), ids=lambda p: p.stem)
def test_golden_definition(config: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the bundled template, no user override
    text = image.render_definition(load_experiment(config)).text
    assert check_def(text) == []
    golden = GOLDEN / f"{config.stem}.def"
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"no golden for {config}; create it with HPCRL_UPDATE_GOLDEN=1"
    assert text == golden.read_text()


def test_every_golden_has_a_config() -> None:
    assert {p.stem for p in GOLDEN.glob("*.def")} == {p.stem for p in image_configs()}


def habitat_config() -> Path:
    shipped = ROOT / "configs" / "habitat_ppo.yaml"
    return shipped if shipped in image_configs() else ROOT / "tests" / "data" / "habitat_image.yaml"


def test_habitat_dry_run_prints_a_checked_definition_that_installs_the_habitat_stack(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    rc, text = run(str(habitat_config()), dry_run=True)
    assert rc == 0
    assert check_def(text) == []
    # The simulator pinned (a rebuild months later installs the one the config was run with), from the channel
    # that has Python 3.10+ builds.
    assert "conda install -y -p /opt/hpcrl/env habitat-sim=0.3.3.2026.03.12 withbullet headless -c conda-forge -c aihabitat-nightly" in text
    assert "--index-url https://download.pytorch.org/whl/cu124" in text
    assert "'/opt/hpcrl/src[habitat,video]'" in text
    assert "import torch, gymnasium, hpcrl, habitat_sim;" in text
    assert " libegl1 " in text  # headless rendering goes through EGL
    assert text.rstrip().endswith("nothing written")
    assert not (ROOT / "images").exists() or not any((ROOT / "images").glob("habitat_ppo-*"))


def test_values_reach_shell_lines_quoted_and_extras_pull_their_os_packages(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    text = image.render_definition(load_experiment(ROOT / "tests" / "data" / "vizdoom_image.yaml")).text
    assert """export GREETING='it'"'"'s a '"'"'quoted'"'"' value; $HOME stays literal'""" in text
    assert "'numpy<2.3' 'tensorboard>=2.16'" in text
    assert "apt-get install -y --no-install-recommends ca-certificates curl redis-server htop tzdata=2024a-0ubuntu0.22.04\n" in text
    assert "redis-server --version" in text
    assert "import torch, gymnasium, hpcrl, vizdoom;" in text
    assert "habitat_sim" not in text and "aihabitat" not in text


# --------------------------------------------------------------------------------------------
# The grammar checker.

GOOD_MULTISTAGE = """\
# A two-stage build with everything the grammar allows.
Bootstrap: docker
From: python:3.11-slim
Stage: build

%files
    "my file.txt" /opt/in
    requirements.txt

%post
    pip wheel -r requirements.txt -w /wheels

Bootstrap: localimage
From: /images/base.sif
IncludeCmd: yes

%files from build
    /wheels /wheels
%labels
    maintainer someone
%appinstall tool
    echo installing
%apprun tool
    exec tool "$@"
%post -c /bin/bash
    echo from: this is a shell line, not a header
%runscript
    exec hpcrl "$@"
"""


def test_checker_accepts_a_valid_multistage_definition() -> None:
    assert check_def(GOOD_MULTISTAGE) == []


def test_files_entries_know_host_and_stage_sources() -> None:
    entries = [(e.line, e.src, e.dst, e.stage) for e in files_entries(GOOD_MULTISTAGE)]
    assert entries == [(7, "my file.txt", "/opt/in", None), (8, "requirements.txt", None, None), (18, "/wheels", "/wheels", "build")]


BAD = [
    ("unknown section", "Bootstrap: docker\nFrom: ubuntu\n%post\n  echo\n%postt\n  echo\n", 5, "unknown section '%postt' (did you mean '%post'?)"),
    ("header after a section", "Bootstrap: docker\nFrom: ubuntu\n%post\n  echo hi\nFrom: debian\n", 5, "header 'From: debian' inside '%post'"),
    ("indented header", "Bootstrap: docker\n  From: ubuntu\n%post\n", 2, "is indented; headers start at the beginning"),
    ("unknown header", "Bootstrap: docker\nFrom: ubuntu\nFrm: x\n%post\n", 3, "unknown header 'frm'"),
    ("unknown agent", "Bootstrap: dockr\nFrom: ubuntu\n", 1, "unknown bootstrap agent 'dockr'"),
    ("empty base", "Bootstrap: docker\nFrom:\n%post\n", 2, "'From:' is empty"),
    ("no base", "Bootstrap: localimage\n%post\n", 1, "needs a 'From:' header"),
    ("no bootstrap", "%post\n  echo\n", 1, "missing 'Bootstrap:' header"),
    ("text before bootstrap", "From: ubuntu\nBootstrap: docker\nFrom: ubuntu\n", 1, "expected 'Bootstrap:' before anything else"),
    ("repeated header", "Bootstrap: docker\nFrom: a\nFrom: b\n", 3, "header 'from' repeats (first on line 2)"),
    ("files with three fields", "Bootstrap: docker\nFrom: a\n%files\n  a b c\n", 4, "expected 'src [dst]' in %files, got 3 fields"),
    ("files unbalanced quote", 'Bootstrap: docker\nFrom: a\n%files\n  "a b /x\n', 4, "unbalanced double quote"),
    ("files from unknown stage", "Bootstrap: docker\nFrom: a\n%files from builder\n  /x /y\n", 3, "no earlier stage has 'Stage: builder'"),
    ("files bad arguments", "Bootstrap: docker\nFrom: a\n%files to x\n", 3, "expected '%files' or '%files from <stage>'"),
    ("indented section", "Bootstrap: docker\nFrom: a\n%post\n  echo\n  %environment\n", 5, "'%environment' is indented"),
    ("docker-style label", "Bootstrap: docker\nFrom: a\n%labels\n  maintainer=me\n", 4, "has '=' in its name"),
    ("app section without app", "Bootstrap: docker\nFrom: a\n%apprun\n  exec x\n", 3, "needs an app name"),
    ("repeated stage name", "Bootstrap: docker\nFrom: a\nStage: s\nBootstrap: docker\nFrom: b\nStage: s\n", 6, "stage 's' repeats"),
    ("empty", "\n\n", 1, "empty definition file"),
]


@pytest.mark.parametrize("text,line,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_checker_refuses_with_the_line_number(text: str, line: int, message: str) -> None:
    problems = check_def(text)
    assert any(p.line == line and message in p.message for p in problems), problems


# --------------------------------------------------------------------------------------------
# Building through the stand-in runtime.


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """A working directory with a small hpcrl checkout to copy in and a config that uses it."""
    src = tmp_path / "checkout"
    for rel, text in {
        "pyproject.toml": '[project]\nname = "hpcrl"\n',
        "README.md": "readme\n",
        "hpcrl/__init__.py": "__version__ = '0'\n",
        "job_templates/local.sh.j2": "#!/bin/bash\n",
        "tests/test_x.py": "def test(): pass\n",
        "hpcrl/__pycache__/x.cpython-311.pyc": "junk",
        "logs/exp/train.csv": "step\n",
        ".git/HEAD": "ref\n",
    }.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    write_config(work, {"hpcrl_source": str(src), "pip": ["numpy"]})
    return work


def write_config(work: Path, image_section: dict) -> None:
    (work / "exp.yaml").write_text(yaml.safe_dump({"name": "exp", "image": image_section}))


@pytest.fixture
def standin(tmp_path: Path, monkeypatch) -> Path:
    """PATH holds only the stand-in (as `apptainer`) and python3 for its shebang."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    (bin_dir / "apptainer").symlink_to(STANDIN)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("HPCRL_STANDIN_LOG", str(tmp_path / "standin.log"))
    return tmp_path / "standin.log"


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def images(work: Path) -> list[str]:
    return sorted(p.name for p in (work / "images").glob("exp-*") if not p.name.endswith(".def"))


def test_standin_first_build_runs_once_second_is_a_no_op_changed_pip_rebuilds(project: Path, standin: Path, monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    rc, out = run()
    assert rc == 0, out
    [built] = images(project)
    assert built.endswith(".sif") and len(built) == len("exp-") + 12 + len(".sif")
    [call] = calls(standin)
    partial = call["argv"][1]
    assert call["name"] == "apptainer"
    assert call["argv"] == ["build", partial, str(project / "images" / built.replace(".sif", ".def"))]
    assert Path(partial).parent == project / "images" and ".partial-" in partial
    sif = (project / "images" / built).read_text()
    assert "STAND-IN SIF" in sif and "--no-cache-dir numpy\n" in sif

    rc, out = run()
    assert (rc, len(calls(standin))) == (0, 1)
    assert "up to date" in out

    write_config(project, {"hpcrl_source": str(project.parent / "checkout"), "pip": ["numpy", "scipy"]})
    rc, _ = run()
    assert (rc, len(calls(standin))) == (0, 2)
    assert len(images(project)) == 2
    assert "--no-cache-dir numpy scipy\n" in (project / "images" / (set(images(project)) - {built}).pop()).read_text()


def test_standin_override_on_the_command_line_changes_the_hash_too(project: Path, standin: Path) -> None:
    assert run()[0] == 0
    assert run("exp.yaml", "image.pip=[numpy, torchvision]")[0] == 0
    assert len(calls(standin)) == 2 and len(images(project)) == 2


def test_standin_copies_the_checkout_without_junk_and_junk_does_not_rebuild(project: Path, standin: Path) -> None:
    assert run()[0] == 0
    [call] = calls(standin)
    assert call["copied"] == {"hpcrl-src": ["README.md", "hpcrl/__init__.py", "job_templates/local.sh.j2", "pyproject.toml"]}
    assert Path(call["cwd"]).parent == project / "images"
    assert not list((project / "images").glob(".context-*")), "the staging directory is removed"

    checkout = project.parent / "checkout"
    (checkout / "tests" / "test_new.py").write_text("")
    (checkout / "hpcrl" / "__pycache__" / "y.pyc").write_text("")
    (checkout / "logs" / "exp" / "more.csv").write_text("")
    assert run()[0] == 0 and len(calls(standin)) == 1

    (checkout / "hpcrl" / "__init__.py").write_text("__version__ = '1'\n")
    assert run()[0] == 0 and len(calls(standin)) == 2


def test_standin_gets_fakeroot_only_when_unprivileged(project: Path, standin: Path, monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert run()[0] == 0
    assert calls(standin)[0]["argv"][:2] == ["build", "--fakeroot"]
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert run(force=True)[0] == 0
    assert "--fakeroot" not in calls(standin)[1]["argv"]


def test_standin_sees_cache_and_tmp_dirs_from_the_config(project: Path, standin: Path, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SCRATCH_FOR_TEST", str(tmp_path / "scratch"))
    write_config(project, {"hpcrl_source": str(project.parent / "checkout"), "cachedir": "$SCRATCH_FOR_TEST/cache", "tmpdir": "tmp"})
    assert run()[0] == 0
    env = calls(standin)[0]["env"]
    cache, tmp = str(tmp_path / "scratch" / "cache"), str(project / "tmp")
    assert env == {"APPTAINER_CACHEDIR": cache, "SINGULARITY_CACHEDIR": cache, "APPTAINER_TMPDIR": tmp, "SINGULARITY_TMPDIR": tmp}
    assert Path(cache).is_dir() and Path(tmp).is_dir()


def test_standin_not_run_when_tmpdir_names_an_unset_variable(project: Path, standin: Path, capsys) -> None:
    write_config(project, {"hpcrl_source": str(project.parent / "checkout"), "tmpdir": "$NO_SUCH_VARIABLE_X/tmp"})
    assert run()[0] == 2
    assert "image.tmpdir: '$NO_SUCH_VARIABLE_X/tmp' names an environment variable that is not set" in capsys.readouterr().err
    assert calls(standin) == [] and not (project / "images").exists()


def test_standin_force_rebuilds_and_sandbox_builds_a_directory(project: Path, standin: Path) -> None:
    assert run()[0] == 0
    assert run(force=True)[0] == 0
    assert len(calls(standin)) == 2 and len(images(project)) == 1
    assert run(sandbox=True)[0] == 0
    assert "--sandbox" in calls(standin)[2]["argv"]
    sandbox = [p for p in (project / "images").glob("exp-*") if p.is_dir()]
    assert len(sandbox) == 1 and (sandbox[0] / "definition").is_file()


def test_standin_failed_build_leaves_no_image_and_the_next_run_builds(project: Path, standin: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HPCRL_STANDIN_FAIL", "1")
    assert run()[0] == 255
    assert "apptainer build exited 255; no image was written" in capsys.readouterr().err
    assert images(project) == [] and not list((project / "images").glob(".*partial*"))
    monkeypatch.delenv("HPCRL_STANDIN_FAIL")
    assert run()[0] == 0 and len(calls(standin)) == 2


def test_standin_as_singularity_is_the_fallback(project: Path, standin: Path, tmp_path: Path) -> None:
    (tmp_path / "bin" / "apptainer").rename(tmp_path / "bin" / "singularity")
    assert run()[0] == 0
    assert calls(standin)[0]["name"] == "singularity"


def test_no_runtime_is_a_clear_error_saying_where_to_build(project: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert run()[0] == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "neither apptainer nor singularity is on PATH" in err and "--submit" in err
    assert not (project / "images").exists()


def test_standin_not_run_for_a_user_template_with_an_unknown_section(project: Path, standin: Path, capsys) -> None:
    (project / "singularity").mkdir()
    bundled = (ROOT / "singularity" / "hpcrl.def.j2").read_text()
    (project / "singularity" / "hpcrl.def.j2").write_text(bundled.replace("%runscript", "%runscirpt"))
    assert run()[0] == 2
    err = capsys.readouterr().err
    rc, text = run(dry_run=True)
    line = text.splitlines().index("%runscirpt") + 1
    assert f"line {line}: unknown section '%runscirpt' (did you mean '%runscript'?)" in err
    assert str(project / "singularity" / "hpcrl.def.j2") in err
    assert rc == 2 and calls(standin) == [] and not (project / "images").exists()


def test_standin_not_run_for_a_user_template_with_a_misplaced_header(project: Path, standin: Path, capsys) -> None:
    (project / "singularity").mkdir()
    (project / "singularity" / "hpcrl.def.j2").write_text("Bootstrap: docker\n%post\n    echo hi\nFrom: ubuntu\n")
    assert run()[0] == 2
    err = capsys.readouterr().err
    assert "line 4: header 'From: ubuntu' inside '%post'" in err and "line 1: 'Bootstrap: docker' needs a 'From:'" in err
    assert calls(standin) == [] and not (project / "images").exists()


def test_standin_build_lands_where_image_path_for_says(project: Path, standin: Path) -> None:
    exp = load_experiment(project / "exp.yaml")
    assert not image.image_path_for(exp).exists()
    assert run()[0] == 0
    assert image.image_path_for(exp).is_file()
    assert image.image_path_for(exp).parent == project / "images"


def test_standin_rebuilds_when_the_localimage_base_changes(project: Path, standin: Path) -> None:
    base = project / "base.sif"
    base.write_text("base v1")
    write_config(project, {"hpcrl_source": str(project.parent / "checkout"), "base": "base.sif"})
    rc, text = run(dry_run=True)
    assert rc == 0 and f"Bootstrap: localimage\nFrom: {base}\n" in text
    assert run()[0] == 0
    base.write_text("base v2")
    assert run()[0] == 0 and len(calls(standin)) == 2
    base.unlink()
    assert run()[0] == 2


def test_standin_copies_a_wheel_source_by_its_file_name(project: Path, standin: Path) -> None:
    wheel = project / "hpcrl-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    write_config(project, {"hpcrl_source": str(wheel), "extras": ["video"]})
    rc, text = run(dry_run=True)
    assert "    hpcrl-0.1.0-py3-none-any.whl /opt/hpcrl/src/hpcrl-0.1.0-py3-none-any.whl\n" in text
    assert "'/opt/hpcrl/src/hpcrl-0.1.0-py3-none-any.whl[video]'" in text
    assert run()[0] == 0
    assert calls(standin)[0]["copied"] == {"hpcrl-0.1.0-py3-none-any.whl": ["hpcrl-0.1.0-py3-none-any.whl"]}


# --------------------------------------------------------------------------------------------
# --from-dockerfile (spython's parser, repaired, then the checker).

DOCKERFILE = """\
FROM python:3.11-slim AS builder
COPY requirements.txt /app/
RUN pip wheel -r /app/requirements.txt -w /wheels
FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04 AS final
COPY --from=builder /wheels /wheels
ENV MODE=train
LABEL maintainer="rl team" version=2
USER nobody
HEALTHCHECK CMD true
CMD ["python", "-m", "hpcrl"]
"""


@pytest.fixture
def dockerfile(project: Path) -> Path:
    ctx = project / "docker"
    ctx.mkdir()
    (ctx / "requirements.txt").write_text("numpy\n")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    return ctx / "Dockerfile"


def test_standin_builds_a_checked_repaired_dockerfile_import_in_its_context(project: Path, standin: Path, dockerfile: Path, capsys) -> None:
    rc, text = run(dry_run=True, from_dockerfile=str(dockerfile))
    assert rc == 0 and check_def(text) == []
    assert "Bootstrap: docker\nFrom: python:3.11-slim\nStage: builder\n" in text
    assert "%files from builder\n/wheels /wheels\n" in text
    assert "maintainer rl team\nversion 2\n" in text
    assert 'exec python -m hpcrl "$@"' in text and "/bin/bash" not in text
    assert "su -" not in text and "%test" not in text
    err = capsys.readouterr().err
    assert "USER nobody dropped" in err and "HEALTHCHECK dropped" in err

    assert run(from_dockerfile=str(dockerfile))[0] == 0
    [call] = calls(standin)
    assert call["cwd"] == str(dockerfile.parent) and call["copied"] == {"requirements.txt": ["requirements.txt"]}
    assert run(from_dockerfile=str(dockerfile))[0] == 0 and len(calls(standin)) == 1
    (dockerfile.parent / "requirements.txt").write_text("numpy\nscipy\n")
    assert run(from_dockerfile=str(dockerfile))[0] == 0 and len(calls(standin)) == 2


def test_standin_not_run_for_a_dockerfile_with_an_unnamed_later_stage(project: Path, standin: Path, dockerfile: Path, capsys) -> None:
    dockerfile.write_text(DOCKERFILE.replace(" AS final", ""))
    assert run(from_dockerfile=str(dockerfile))[0] == 2
    assert f"{dockerfile}: line 4: a later stage needs a name" in capsys.readouterr().err
    assert calls(standin) == []


def test_standin_not_run_for_a_dockerfile_with_a_missing_copy_source(project: Path, standin: Path, dockerfile: Path, capsys) -> None:
    (dockerfile.parent / "requirements.txt").unlink()
    assert run(from_dockerfile=str(dockerfile))[0] == 2
    assert "%files source 'requirements.txt' does not exist under" in capsys.readouterr().err
    assert calls(standin) == [] and not (project / "images").exists()


def test_dockerfile_without_from_is_refused(project: Path, dockerfile: Path, capsys) -> None:
    dockerfile.write_text("RUN echo hi\n")
    assert run(from_dockerfile=str(dockerfile))[0] == 2
    assert "spython cannot convert it" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["/dev/zero", "fifo", "missing", "folder", "huge"])
def test_a_dockerfile_path_that_is_no_dockerfile_is_one_line_and_reads_nothing(project: Path, standin: Path, given: str, capsys) -> None:
    """/dev/zero was taken for a missing file, and a FIFO would block the read until a writer came: each is named
    for what it is, at once, and nothing is built."""
    if given == "fifo":
        os.mkfifo(project / "fifo")
    (project / "folder").mkdir()
    with open(project / "huge", "wb") as f:  # sparse: a file given by mistake (a log, an image), larger than any Dockerfile
        f.truncate(image.MAX_DOCKERFILE_BYTES + 1)
    rc = run(dry_run=True, from_dockerfile=given if given.startswith("/") else str(project / given))[0]
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    said = {"/dev/zero": "a device, not a Dockerfile", "fifo": "a FIFO, not a Dockerfile", "missing": "no such Dockerfile", "folder": "a directory;", "huge": "larger than a Dockerfile can be (1 MB)"}
    assert said[given] in err and "Traceback" not in err
    assert calls(standin) == [] and not (project / "images").exists()


# --------------------------------------------------------------------------------------------
# --submit.


class RecordingScheduler(Scheduler):
    """Renders with the real Slurm job template; records submissions instead of making them."""

    name = "slurm"
    template = "slurm.sh.j2"
    submitted: list[tuple[Path, int, list]] = []

    def submit(self, script: Path, size: int, after: list) -> str:
        self.submitted.append((script, size, after))
        return "4242"

    def query(self, job_ids):
        return {}

    def cancel(self, job_ids):
        pass


def recording_factory(*args, **kwargs) -> RecordingScheduler:
    """Stands in for get_scheduler, and fails if the call would not fit the real one."""
    inspect.signature(get_scheduler).bind(*args, **kwargs)
    return RecordingScheduler()


def with_gpus(work: Path) -> None:
    """Training that asks for GPUs: the build job must not."""
    config = yaml.safe_load((work / "exp.yaml").read_text())
    (work / "exp.yaml").write_text(yaml.safe_dump({**config, "resources": {"gpus": 2, "time": "00:30:00"}}))


def test_submit_renders_a_build_job_on_the_host_python(project: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no runtime needed on the login node
    with_gpus(project)
    monkeypatch.setattr(image_job, "get_scheduler", recording_factory)
    RecordingScheduler.submitted = []
    rc, out = run("exp.yaml", "image.pip=[scipy]", submit=True, force=True, scheduler="slurm")
    assert rc == 0 and "build submitted to slurm as job 4242" in out
    [(script, size, after)] = RecordingScheduler.submitted
    assert (size, after) == (0, [])
    text = script.read_text()
    assert "#SBATCH --time=02:00:00\n" in text and "#SBATCH --mem=8192M\n" in text and "--gres" not in text
    config = project / "exp.yaml"
    assert " -m hpcrl)\n" in text
    assert f'"${{HPCRL[@]}}" build-image {config} -p \'image.pip=[scipy]\' --force &' in text
    assert "--submit" not in text and " exec " not in text
    assert script.parent == project / "images" / "jobs" and images(project) == []


def test_submit_dry_run_prints_the_job_and_writes_nothing(project: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(image_job, "get_scheduler", recording_factory)
    RecordingScheduler.submitted = []
    rc, out = run(submit=True, dry_run=True, scheduler="slurm")
    assert rc == 0 and RecordingScheduler.submitted == []
    assert f"# ---- {project / 'images' / 'jobs'}/build-exp-" in out and f"build-image {project / 'exp.yaml'} &" in out
    assert not (project / "images").exists()


@pytest.mark.parametrize(
    "backend,directive,gpu_request",
    [("slurm", "#SBATCH --job-name=exp-build-image", "--gres"), ("sge", "#$ -N exp-build-image", "#$ -l gpu")],
)
def test_submit_dry_run_with_the_real_cluster_template(backend: str, directive: str, gpu_request: str, project: Path) -> None:
    if importlib.util.find_spec(f"hpcrl.schedulers.{backend}") is None:
        pytest.skip(f"the {backend} backend is not written yet")
    with_gpus(project)
    rc, out = run(submit=True, dry_run=True, scheduler=backend)
    assert rc == 0 and directive in out
    assert gpu_request not in out, "building needs no GPU even when the training jobs do"
    assert "02:00:00" in out and "8192M" in out  # build_time and build_mem, not the training limits
    assert f"build-image {project / 'exp.yaml'} &" in out


def test_standin_built_image_is_not_resubmitted_and_local_submit_is_refused(project: Path, standin: Path, monkeypatch, capsys) -> None:
    assert run()[0] == 0
    monkeypatch.setattr(image_job, "get_scheduler", recording_factory)
    RecordingScheduler.submitted = []
    rc, out = run(submit=True, scheduler="slurm")
    assert rc == 0 and "up to date" in out and RecordingScheduler.submitted == []
    assert run(submit=True, force=True, scheduler="local")[0] == 2
    assert "--submit: no cluster scheduler here" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Config and command-line errors.


def test_missing_config_and_default_hpcrl_yaml(project: Path, capsys) -> None:
    assert run(None, dry_run=True)[0] == 2
    assert "no CONFIG given and no hpcrl.yaml in" in capsys.readouterr().err
    (project / "exp.yaml").rename(project / "hpcrl.yaml")
    rc, text = run(None, dry_run=True)
    assert rc == 0 and text.startswith("Bootstrap: docker\n")


def test_config_without_image_section_is_refused(project: Path, capsys) -> None:
    (project / "exp.yaml").write_text("name: exp\n")
    assert run(dry_run=True)[0] == 2
    assert "image: the config has no image section to build" in capsys.readouterr().err


@pytest.mark.parametrize(
    "section,message",
    [
        ({"base": "ubuntu:22.04"}, "image.base: expected docker://IMAGE:TAG"),
        ({"python": "three"}, "image.python: expected a Python version"),
        ({"miniforge": "latest"}, "image.miniforge: expected a Miniforge release such as 24.11.3-0"),
        ({"miniforge": '24.11.3-0"; rm -rf / #'}, "image.miniforge: expected a Miniforge release"),
        ({"habitat_version": "0.3; rm -rf /"}, "image.habitat_version: expected a conda version such as 0.3.3"),
        ({"habitat_version": "nan"}, "image.habitat_version: expected a conda version"),
        ({"habitat_version": "-1"}, "image.habitat_version: expected a conda version"),
        ({"os_packages": ["curl; rm -rf /"]}, "image.os_packages[0]: expected a Debian package name"),
        ({"pip": ["--index-url http://x"]}, "image.pip[0]: expected one requirement"),
        ({"env": {"BAD-NAME": "x"}}, "image.env.BAD-NAME: expected an environment variable name"),
        ({"env": {"A": "line\n%post"}}, "image.env.A: expected a single line"),
        ({"labels": {"a=b": "x"}}, "image.labels.a=b: expected a label name"),
        ({"extras": ["mujoco"]}, "image.extras[0]: expected one of"),
        ({"hpcrl_source": "/no/such/dir"}, "image.hpcrl_source: expected an hpcrl checkout"),
        ({"build_time": "2h"}, "image.build_time: expected a time limit"),
    ],
)
def test_bad_image_sections_name_the_key(section: dict, message: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, section)
    assert run(dry_run=True)[0] == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "images").exists()


def test_image_config_bootstrap() -> None:
    exp = experiment_from_dict({"name": "x", "image": {"base": "library://user/base:1"}})
    assert exp.image.bootstrap() == ("library", "user/base:1")
    with pytest.raises(ConfigError):
        experiment_from_dict({"name": "x", "image": {"base": "docker://"}})


def test_cli_dry_run(project: Path, capsys) -> None:
    from hpcrl.cli import main

    assert main(["build-image", "exp.yaml", "--dry-run", "-p", "image.python=3.12"]) == 0
    text = capsys.readouterr().out
    assert check_def(text) == [] and "python=3.12" in text


# --------------------------------------------------------------------------------------------
# %test stops at the first failure (issue 12 item 18).


def section_body(text: str, name: str = "test") -> str:
    """The body of one section of a definition, as Apptainer hands it to sh."""
    body, inside = [], False
    for line in text.splitlines():
        if line.startswith("%"):
            inside = line.split()[0] == f"%{name}"
            continue
        if inside:
            body.append(line)
    return "\n".join(body)


def test_rendered_test_section_fails_on_a_failed_import_under_sh(tmp_path: Path, monkeypatch) -> None:
    """Run the rendered %test as Apptainer does (sh, no -e), with the image's python failing its import
    (what a broken habitat_sim does) and an `hpcrl` that passes: the test section must fail."""
    monkeypatch.chdir(ROOT)
    text = image.render_definition(load_experiment(habitat_config())).text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named habitat_sim' >&2\nexit 1\n")
    (bin_dir / "hpcrl").write_text(f"#!/bin/sh\ntouch {tmp_path}/hpcrl-ran\n")
    (bin_dir / "redis-server").write_text("#!/bin/sh\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    body = section_body(text).replace(f"{image.PREFIX}/bin/python", str(bin_dir / "python"))
    proc = subprocess.run(["sh", "-c", body], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and not (tmp_path / "hpcrl-ran").exists(), proc.stderr


def test_checker_refuses_a_test_section_without_set_e() -> None:
    text = "Bootstrap: docker\nFrom: debian\n%test\n    python -c 'import habitat_sim'\n    hpcrl --help\n"
    (problem,) = check_def(text)
    assert problem.line == 4 and "set -e" in problem.message
    assert check_def(text.replace("%test\n", "%test\n    set -eu\n")) == []
    assert check_def("Bootstrap: docker\nFrom: debian\n%test\n    hpcrl --help\n") == []  # one command: its status is the test's


def test_the_definition_names_the_miniforge_release_it_installs(tmp_path: Path, monkeypatch) -> None:
    """A pinned installer, not `releases/latest`: two builds of one definition (one content hash) hold one conda."""
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, {"miniforge": "25.3.0-3"})
    text = image.render_definition(load_experiment(tmp_path / "exp.yaml")).text
    assert "releases/download/25.3.0-3/Miniforge3-25.3.0-3-Linux-$(uname -m).sh" in text and "releases/latest" not in text
