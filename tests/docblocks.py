"""The fenced blocks of the README and the docs site, and what tests/test_docs.py does with each.

A block is run or validated by default: a ```yaml block is a whole config, loaded through hpcrl's own loader;
a ```bash / ```sh / ```console block runs, in order with the other blocks of its page, in one shell. What a
block is otherwise is said in an HTML comment on the line before its fence (invisible on the site and on
GitHub), so that nothing is left out silently:

    <!-- docs-test: fragment base=configs/cartpole_optuna.yaml -->   yaml: merged into that config (default
                                                                   configs/cartpole_ppo.yaml), then validated
    <!-- docs-test: file=mytrain.py -->         any block: also written to that file of the page's directory
    <!-- docs-test: skip reason="..." -->       shell: not run (the reason says why); each `hpcrl` line in it
                                                is still parsed by hpcrl's argument parser
    <!-- docs-test: cluster=slurm -->           shell: runs only against the test cluster (tests marked slurm/sge)
    <!-- docs-test: exit=2 -->                  shell: the block must end with this exit code (a refusal shown on purpose)
    <!-- docs-test: timeout=120 -->             shell: seconds the block may take (default 60)
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHELLS = ("bash", "sh", "shell", "console")
YAMLS = ("yaml", "yml")
KNOWN = {"fragment", "base", "file", "skip", "reason", "cluster", "exit", "timeout"}
"""Every word a docs-test comment may hold: a typo in one is an error, not a block quietly run as the default."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)(?P<rest>.*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:(?P<body>.*?)-->\s*$")


@dataclass
class Block:
    page: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    text: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def shell(self) -> bool:
        return self.lang in SHELLS

    @property
    def commands(self) -> str:
        """The shell text a user types: a console block's `$ ` lines (and their continuation lines)."""
        if self.lang != "console":
            return self.text
        out, going_on = [], False
        for line in self.text.splitlines():
            if line.startswith("$ ") or going_on:
                command = line[2:] if line.startswith("$ ") else line
                out.append(command)
                going_on = command.rstrip().endswith("\\")
        return "\n".join(out) + "\n"


def pages() -> list[Path]:
    """The README and every page of the site (the hooks folder holds code, not pages)."""
    return [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if "hooks" not in p.parts)]


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the docs-test comment before it (if any)."""
    lines = page.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m["indent"], m["fence"]
        body = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^{re.escape(indent)}{fence[0]}{{{len(fence)},}}\s*$", lines[j].rstrip()):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{i + 1}: a fence that is never closed")
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        directive = _DIRECTIVE.match(lines[k]) if k >= 0 else None
        options = parse_options(directive["body"], f"{page}:{k + 1}") if directive else {}
        out.append(Block(page, i + 1, m["lang"].lower(), "\n".join(body) + "\n", options))
        i = j + 1
    return out


def parse_options(body: str, where: str) -> dict[str, str]:
    options = {}
    for word in shlex.split(body):
        key, sep, value = word.partition("=")
        if key not in KNOWN:
            raise ValueError(f"{where}: unknown docs-test option {key!r} (known: {', '.join(sorted(KNOWN))})")
        options[key] = value if sep else ""
    return options


def hpcrl_lines(text: str) -> list[list[str]]:
    """The words of each `hpcrl ...` command in shell text (after `$ `, `sudo`, VAR=value, `&&`, `;`, `|`)."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line[2:] if line.startswith("$ ") else line)
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            while words and (words[0] == "sudo" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0])):
                words = words[1:]
            if words and words[0] in ("hpcrl", ".venv/bin/hpcrl"):
                out.append(words[1:])
    return out
