"""The README and the docs site cannot rot: the site builds with --strict, its reference lists every config key
and every command-line option, every YAML block loads through hpcrl's own loader, and every shell block runs.

The shell blocks of a page run in order, in one bash, in a temporary directory that holds a copy of configs/
and `.venv` (this interpreter's environment), as a reader types them there after the quickstart. The README
and the tutorials start in a shell WITHOUT hpcrl on the PATH, as a new terminal after `scripts/demo` is
(issue 38: every command under "Using it" failed with `hpcrl: command not found`): they must say
`source .venv/bin/activate` themselves. The how-to, explanation and reference pages start activated, as
their readers are. The scheduler's query tools (sinfo, qstat, ...) fail at once there, as on a laptop, so a
`--dry-run --scheduler slurm` block prints the same scripts everywhere; blocks that need a real cluster say
`cluster=slurm|sge` and run in a test of that marker against the test clusters. What a block is, when it
is not a whole config or a command to run, is declared before it (tests/docblocks.py).

The blocks use quick-run settings where the point is the command (a small `train.total_steps`, one seed),
and say so. The whole file takes about a minute of CPU (most of it the local sweeps' job processes).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from docblocks import REPO, YAMLS, Block, blocks, hpcrl_lines, pages

from hpcrl.config import strict_yaml
from hpcrl.config.hparams import ALGORITHMS
from hpcrl.config.key_paths import known_paths
from hpcrl.config.load import experiment_from_dict, load_experiment, read_yaml

ALL = [b for page in pages() for b in blocks(page)]
DEFAULT_BASE = "configs/cartpole_ppo.yaml"
BLOCK_SECONDS = 60
ACTIVATE = "source .venv/bin/activate"


def _ids(items: list[Any]) -> list[str]:
    return [item.where if isinstance(item, Block) else str(item.relative_to(REPO)) for item in items]


def fresh_shell(page: Path) -> bool:
    """Pages a newcomer follows from a new terminal: they must put hpcrl on the PATH themselves."""
    return page == REPO / "README.md" or "tutorials" in page.relative_to(REPO).parts


def _reference():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", REPO / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


# --------------------------------------------------------------------------------------------
# What each block is.


def test_every_block_says_its_language_and_every_comment_fits_its_block() -> None:
    problems = []
    for b in ALL:
        o = b.options
        if not b.lang:
            problems.append(f"{b.where}: a fence without a language (```text for output)")
        if ("fragment" in o or "base" in o) and b.lang not in YAMLS:
            problems.append(f"{b.where}: fragment and base are for yaml blocks")
        if any(k in o for k in ("skip", "cluster", "exit", "timeout")) and not b.shell:
            problems.append(f"{b.where}: skip/cluster/exit/timeout are for shell blocks")
        if "skip" in o and not o.get("reason"):
            problems.append(f"{b.where}: a block that is not run says why (reason=...)")
        if "base" in o and not (REPO / o["base"]).is_file():
            problems.append(f"{b.where}: base={o['base']} is not a file of the repository")
        if o.get("cluster") not in (None, "slurm", "sge"):
            problems.append(f"{b.where}: cluster= takes slurm or sge")
    assert not problems, "\n".join(problems)


def _merge(base: Any, fragment: Any) -> Any:
    """A fragment as a reader adds it to a config: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(fragment, dict):
        out = dict(base)
        for key, value in fragment.items():
            out[key] = _merge(base.get(key), value) if key in base else value
        return out
    return fragment


@pytest.mark.parametrize("block", [b for b in ALL if b.lang in YAMLS], ids=_ids([b for b in ALL if b.lang in YAMLS]))
def test_yaml_block_loads_through_hpcrls_loader(block: Block, tmp_path: Path) -> None:
    """A whole config loads as `hpcrl sweep` loads it; a fragment is merged into its base config first."""
    o = block.options
    if "fragment" in o:
        base = read_yaml(REPO / (o.get("base") or DEFAULT_BASE))
        fragment = strict_yaml.load(block.text) or {}
        assert isinstance(fragment, dict), f"{block.where}: a fragment is a mapping of config keys"
        experiment_from_dict(_merge(base, fragment))
        return
    path = tmp_path / "block.yaml"
    path.write_text(block.text)
    load_experiment(path)


def test_python_blocks_compile() -> None:
    for b in ALL:
        if b.lang in ("python", "py"):
            compile(b.text, b.where, "exec")


def test_every_hpcrl_command_of_the_docs_parses() -> None:
    """Every `hpcrl ...` line of every shell block, run or not, is one that hpcrl's parser accepts (a block
    that cannot run here, `--submit` without a cluster, is checked this far)."""
    from hpcrl.cli import parser

    problems = []
    for b in ALL:
        if not b.shell:
            continue
        for words in hpcrl_lines(b.commands):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    args, extra = parser().parse_known_args(words)
                    if any(word.startswith("-") for word in extra):
                        problems.append(f"{b.where}: hpcrl {shlex.join(words)}: unrecognized {extra}")
                except SystemExit as exc:
                    if exc.code:
                        problems.append(f"{b.where}: hpcrl {shlex.join(words)}: {err.getvalue().strip().splitlines()[-1]}")
    assert not problems, "\n".join(problems)


def test_the_readme_puts_hpcrl_on_the_path_before_using_it() -> None:
    """Issue 38, point 1: after the quickstart `hpcrl` was not on the PATH, and `pip install -e .` was refused
    by Debian's system Python (PEP 668). The README activates .venv before its first `hpcrl` command and
    installs only into a virtual environment."""
    readme = REPO / "README.md"
    activated = False
    for b in blocks(readme):
        if not b.shell or "skip" in b.options:
            continue
        for line in b.commands.splitlines():
            if line.strip().startswith(ACTIVATE):
                activated = True
            if hpcrl_lines(line) and not line.lstrip().startswith(".venv/bin/hpcrl"):
                assert activated, f"{b.where}: `{line.strip()}` before `{ACTIVATE}`: hpcrl is not on the PATH of a new shell"
            words = line.split()
            if "pip" in words and "install" in words and not (words[0].startswith(".venv/") or activated):
                raise AssertionError(f"{b.where}: `{line.strip()}` outside a virtual environment (PEP 668 refuses it on Debian)")


# --------------------------------------------------------------------------------------------
# The reference: generated from the schema and the parser, so every key and option is there.


def test_the_config_reference_describes_every_key() -> None:
    ref = _reference()
    text = ref.config_markdown()
    missing = [f"{algo}: {key}" for algo in ALGORITHMS for key in known_paths(algo) if f"`{key}`" not in text]
    assert not missing, f"keys missing from the config reference: {missing}"
    undescribed = [e["key"] for _, _, entries in ref.config_sections() for e in entries if not e["description"].strip()]
    assert not undescribed, f"keys without a description (add a docstring under the field in hpcrl/config/): {sorted(set(undescribed))}"


def test_the_cli_reference_lists_every_command_and_option() -> None:
    ref = _reference()
    text = ref.cli_markdown()
    from hpcrl.cli import parser

    listed = {id(p) for _, _, p in ref.cli_commands()}
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [name for name, p in sub.choices.items() if id(p) not in listed]
    for name, _, p in ref.cli_commands():
        if f"`hpcrl {name}`" not in text:
            missing.append(name)
        for action in p._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help") and option not in text:
                    missing.append(f"{name} {option}")
    assert not missing, f"missing from the command-line reference: {missing}"


@pytest.mark.e2e
def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict`: a broken link, a missing anchor or page, a hook that raises, fails it."""
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", str(REPO / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "train.total_steps" in config and "resources.max_stalled_requeues" in config
    assert "hpcrl build-image" in (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    # A markdown table indented inside a list item rendered as a code block of pipes (docs/reference/benchmarks.md).
    as_code = [str(page.relative_to(tmp_path)) for page in (tmp_path / "site").rglob("*.html") if re.search(r"<code>\|[^<]*\| ---", page.read_text())]
    assert not as_code, f"tables shown as code: {as_code}"
    assert time.monotonic() - began < 60


# --------------------------------------------------------------------------------------------
# The shell blocks, run.


def _runnable(b: Block, cluster: str | None) -> bool:
    return b.shell and "skip" not in b.options and b.options.get("cluster") in (None, cluster)


def _sessions() -> list[Any]:
    out = []
    for page in pages():
        page_blocks = blocks(page)
        if any(_runnable(b, None) for b in page_blocks):
            out.append(pytest.param(page, None, id=str(page.relative_to(REPO)), marks=pytest.mark.e2e))
        for cluster in sorted({b.options["cluster"] for b in page_blocks if b.shell and b.options.get("cluster")}):
            out.append(pytest.param(page, cluster, id=f"{page.relative_to(REPO)}:{cluster}", marks=getattr(pytest.mark, cluster)))
    return out


def session_env(stubs: Path | None) -> dict[str, str]:
    """A new terminal's environment: no hpcrl on the PATH (no virtual environment active), this checkout's
    hpcrl for the venv's Python, and, away from the test clusters, scheduler queries that fail at once."""
    env = dict(os.environ)
    for key in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP"):
        env.pop(key, None)
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "hpcrl").exists()]
    env["PATH"] = os.pathsep.join(([str(stubs)] if stubs else []) + path)
    env["PYTHONPATH"] = str(REPO)
    env["MPLBACKEND"] = "Agg"
    return env


def page_script(page: Path, work: Path, cluster: str | None) -> tuple[str, float]:
    """The page's runnable blocks as one bash script, each announced (so a failure names its block), and
    the seconds they may take together."""
    lines = ["set -eo pipefail", f"cd {shlex.quote(str(work))}"]
    if not fresh_shell(page):
        lines.append(ACTIVATE)
    budget = 0.0
    for b in blocks(page):
        if "file" in b.options:
            (work / b.options["file"]).parent.mkdir(parents=True, exist_ok=True)
            (work / b.options["file"]).write_text(b.text)
        if not _runnable(b, cluster):
            continue
        budget += float(b.options.get("timeout") or BLOCK_SECONDS)
        text = b.commands
        lines.append(f"echo {shlex.quote(f'::docs-test:: {b.where}')} >&2")
        if "exit" in b.options:
            lines += ["set +e", "(", "set -e", text, ")", "rc=$?", "set -e",
                      f'[ "$rc" -eq {int(b.options["exit"])} ] || {{ echo "::docs-test:: expected exit {b.options["exit"]}, got $rc" >&2; exit 1; }}']
        else:
            lines.append(text)
    return "\n".join(lines) + "\n", budget


def _cancel_leftovers(work: Path, env: dict[str, str]) -> None:
    """Jobs a cluster page submitted and did not wait for are cancelled (nothing outlives its test)."""
    for exp in (work / "logs").glob("*/runs.csv"):
        subprocess.run([sys.executable, "-m", "hpcrl", "cancel", str(exp.parent)], cwd=work, env=env, capture_output=True, timeout=60)


@pytest.mark.parametrize(("page", "cluster"), _sessions())
def test_shell_blocks_run(page: Path, cluster: str | None, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if cluster:
        request.getfixturevalue(f"{cluster}_cluster")
    stubs = None if cluster else request.getfixturevalue("_scheduler_query_stubs")
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(REPO / "configs", work / "configs")
    (work / ".venv").symlink_to(sys.prefix)
    env = session_env(stubs)
    script, budget = page_script(page, work, cluster)
    proc = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{page.relative_to(REPO)}: the blocks took over {budget:.0f} s; the last one started:\n{_last_block(out)}\n{out[-3000:]}")
    finally:
        if cluster:
            _cancel_leftovers(work, env)
    assert proc.returncode == 0, f"{_last_block(out)} failed (exit {proc.returncode}):\n{out[-4000:]}"
    assert "Traceback (most recent call last)" not in out, out[-4000:]


def _last_block(out: str) -> str:
    marks = [line for line in out.splitlines() if line.startswith("::docs-test:: ")]
    return marks[-1].removeprefix("::docs-test:: ") if marks else "(before the first block)"
