"""The one rule for values that reach a scheduler directive line (`#SBATCH ...`, `#$ ...`).

No shell quoting protects a directive: Slurm and Grid Engine read those lines themselves. A line
break in a value ends the directive and the rest of the value runs as a command of the job script
(and Slurm stops reading `#SBATCH` lines at the first non-comment line, silently dropping every
directive after it). Whitespace inside a single value starts another option on the same line
(`--partition=gpu --uid=0`). So:

- a *word* (partition, account, queue, parallel environment, resource name, job name, log path)
  is one token: printable, no whitespace, no quotes, backslashes or `#`, and not starting with `-`
  (after an option that takes a value, `#$ -q -f`, and in the sinfo/qstat calls that check a
  request, it would be read as an option of its own);
- a *line* (an entry of `resources.extra`, written as the user typed it) may hold spaces, but no
  line break or other control character, and holds options only: the template writes the prefix
  (`#SBATCH`, `#$`) before it. Nor may it set an option the template writes itself (`own_option_problem`,
  checked when the scripts are planned, where the scheduler is known): sbatch and qsub take the last
  of two, so `--array=1-1000000` would replace the array hpcrl sized and `--output` the log it reads.

The config schema validates its fields with these functions (so a bad value is refused at sweep
time with its key path), and the job templates' `directive` / `directive_line` filters apply them
again at render time, so a template a user edits cannot put an unchecked value on a directive line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
_WORD_FORBIDDEN = re.compile(r"[\s\"'\\#`]")


class DirectiveError(ValueError):
    """A value that a directive line cannot carry; the message says what was wrong, on one line."""


def word_problem(value: Any) -> str | None:
    """Why `value` cannot stand as one token of a directive line, or None when it can."""
    text = str(value)
    if not text:
        return "expected a non-empty value"
    if _CONTROL.search(text):
        return f"a directive value cannot hold a line break or control character, got {text!r}"
    if _WORD_FORBIDDEN.search(text):
        return f"a directive value must be one word (no spaces, quotes, backslashes or '#'), got {text!r}"
    if text.startswith("-"):
        return f"a directive value cannot start with '-' (it would be read as an option), got {text!r}"
    return None


def line_problem(value: Any) -> str | None:
    """Why `value` cannot stand as one raw directive line, or None when it can."""
    text = str(value)
    if not text.strip():
        return "expected a non-empty directive"
    if _CONTROL.search(text):
        return f"a directive must be a single line without control characters, got {text!r}"
    if text.lstrip().startswith("#"):
        return f"expected the directive's options only: hpcrl writes the prefix (#SBATCH, #$) before them, got {text!r}"
    return None


@dataclass(frozen=True)
class OwnOptions:
    """The options a bundled job template writes on its directive lines, each with where its value comes from."""

    command: str
    """The submit command, which reads the lines (and takes the last of an option given twice)."""
    options: dict[str, str]
    getopt: bool
    """Options parsed as getopt does: a short one takes its value attached (`-a1-9`), a long one
    may be abbreviated to a prefix (`--arr=1-9`)."""
    complexes: dict[str, str] = field(default_factory=dict)
    """Resources of `-l` (Grid Engine) that the template requests."""


_LOGS = "the job's log under <experiment>/jobs/logs"
_ARRAY = "the array of runs, capped by resources.max_concurrent"
OWN_OPTIONS = {
    "slurm.sh.j2": OwnOptions("sbatch", {
        **dict.fromkeys(("--job-name", "-J"), "the job's name"),
        **dict.fromkeys(("--array", "-a"), _ARRAY),
        **dict.fromkeys(("--output", "-o", "--error", "-e", "--open-mode"), _LOGS),
        **dict.fromkeys(("--requeue", "--no-requeue", "--signal"), "the warning signal and requeue, from resources.signal_seconds"),
        **dict.fromkeys(("--dependency", "-d"), "the order of the stages"),
        **dict.fromkeys(("--nodes", "-N", "--ntasks-per-node"), "from resources.ranks and resources.nodes"),
        **dict.fromkeys(("--cpus-per-task", "-c"), "from resources.cpus"),
        "--mem": "from resources.mem",
        **dict.fromkeys(("--time", "-t"), "from resources.time"),
        **dict.fromkeys(("--partition", "-p"), "from resources.partition"),
        **dict.fromkeys(("--account", "-A"), "from resources.account"),
    }, getopt=True),
    "sge.sh.j2": OwnOptions("qsub", {
        "-N": "the job's name",
        **dict.fromkeys(("-t", "-tc"), _ARRAY),
        **dict.fromkeys(("-o", "-e", "-j"), _LOGS),
        **dict.fromkeys(("-notify", "-r"), "the warning signal and rescheduling"),
        **dict.fromkeys(("-hold_jid", "-hold_jid_ad"), "the order of the stages"),
        "-S": "the job script's shell, bash",
        **dict.fromkeys(("-cwd", "-wd"), "the directory the sweep ran in"),
        "-pe": "from resources.cpus, resources.ranks and resources.sge_pe",
        "-q": "from resources.queue",
    }, getopt=False, complexes=dict.fromkeys(("h_rt", "s_rt"), "from resources.time and resources.signal_seconds")),
}
"""The options of the bundled templates' directives (job_templates/slurm.sh.j2, sge.sh.j2), by template."""

_SBATCH_PREFIXES = ("--ntasks",)
"""sbatch options that are also the prefix of one in OWN_OPTIONS (`--ntasks-per-node`): taken as themselves."""


def own_option_problem(line: str, template: str, memory: str | None = None) -> str | None:
    """Why an `extra` line cannot go on `template`'s directives, or None: it sets an option the
    template writes itself, which its command would take from this line instead. `memory`: the Grid
    Engine resource the template requests the memory under (resources.sge_mem_resource)."""
    own = OWN_OPTIONS.get(template)
    if own is None:  # a template without directives (local)
        return None
    complexes = {**own.complexes, **({memory: "from resources.mem"} if memory else {})}
    words = line.split()
    for i, word in enumerate(words):
        if (option := _own_option(word, own)) is not None:
            return f"{option} is written by hpcrl itself ({own.options[option]}), and {own.command} would take this one instead, got {line!r}"
        if word == "-l" and not own.getopt and i + 1 < len(words):
            for request in words[i + 1].split(","):
                if (resource := request.partition("=")[0]) in complexes:
                    return f"-l {resource} is written by hpcrl itself ({complexes[resource]}), and {own.command} would take this one instead, got {line!r}"
    return None


def _own_option(word: str, own: OwnOptions) -> str | None:
    """The option of `own` that one word of a line sets (with getopt, also `-a1-9` and an abbreviated `--arr=1-9`), or None."""
    name = word.partition("=")[0]
    if name in own.options or not own.getopt:
        return name if name in own.options else None
    if name.startswith("--"):
        return next((option for option in own.options if option.startswith(name)), None) if len(name) > 2 and name not in _SBATCH_PREFIXES else None
    return name[:2] if name.startswith("-") and name[:2] in own.options else None


def directive_word(value: Any) -> str:
    """Jinja filter `directive`: the value as one directive token, or DirectiveError."""
    problem = word_problem(value)
    if problem:
        raise DirectiveError(problem)
    return str(value)


def directive_line(value: Any) -> str:
    """Jinja filter `directive_line`: the value as one raw directive line, or DirectiveError."""
    problem = line_problem(value)
    if problem:
        raise DirectiveError(problem)
    return str(value)
