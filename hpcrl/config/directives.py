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
  line break or other control character.

The config schema validates its fields with these functions (so a bad value is refused at sweep
time with its key path), and the job templates' `directive` / `directive_line` filters apply them
again at render time, so a template a user edits cannot put an unchecked value on a directive line.
"""

from __future__ import annotations

import re
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
    return None


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
