"""A strict checker of the Apptainer definition-file grammar, with line numbers.

Apptainer reports a bad definition only once a build has started (often in a batch job, after the
queue wait), and some mistakes it never reports: a header written after a section becomes a shell
line of that section, an indented `%word` silently starts a section, a third field on a `%files`
line is dropped. spython's parser cannot serve as a checker either (it matches `bootstrap` and
`from:` anywhere on a line). So this module re-implements the grammar of Apptainer's
`pkg/build/types/parser/deffile.go`, and is stricter where Apptainer is lenient in ways that hide
mistakes: headers and section names at the start of a line, no repeated header, no stray text.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

HEADERS = frozenset(
    "bootstrap from stage includecmd mirrorurl updateurl osversion include library registry namespace "
    "product user regcode productpgp registerurl modules fingerprints confurl setopt".split()
)
"""Apptainer's `validHeaders`, plus `otherurl<N>` (matched separately)."""

SECTIONS = frozenset("help setup files labels environment pre post runscript test startscript arguments".split())
APP_SECTIONS = frozenset("appinstall applabels appfiles appenv apptest apphelp apprun appstart".split())
BOOTSTRAP_AGENTS = frozenset(
    "docker library shub oras localimage yum dnf zypper debootstrap arch busybox scratch "
    "docker-daemon docker-archive oci oci-archive".split()
)
NEEDS_FROM = frozenset("docker library shub oras localimage docker-daemon docker-archive oci oci-archive".split())
"""Agents that start from an existing image, named by `From:`."""

_STAGE_START = re.compile(r"^bootstrap:", re.IGNORECASE)  # Apptainer splits stages at exactly this
_HEADER_LIKE = re.compile(r"^([A-Za-z]+[0-9]*)\s*:")
_FILES_FIELD = re.compile(r'"[^"]*"|[^\s"]+')
_FREE_TEXT = frozenset({"help", "apphelp"})


@dataclass(frozen=True)
class Problem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True)
class FilesEntry:
    """One `src [dst]` line of a `%files` (or `%appfiles`) section."""

    line: int
    src: str
    dst: str | None
    stage: str | None
    """The stage named by `%files from <stage>`; None when the source is on the host."""


@dataclass
class _Section:
    line: int
    name: str
    args: str
    body: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class _Stage:
    line: int
    headers: list[tuple[int, str]] = field(default_factory=list)
    sections: list[_Section] = field(default_factory=list)


def _split(text: str) -> tuple[list[_Stage], list[Problem]]:
    """Lines -> stages -> header lines and sections, the way Apptainer's scanner cuts them."""
    stages: list[_Stage] = []
    problems: list[Problem] = []
    section: _Section | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        if _STAGE_START.match(raw):
            stages.append(_Stage(n))
            section = None
        stripped = raw.strip()
        first = stripped.split(None, 1)[0] if stripped else ""
        if first.startswith("%"):
            if raw[:1].isspace():
                problems.append(Problem(n, f"{first!r} is indented, yet Apptainer starts a section there; put section names at the start of the line"))
            if not stages:
                stages.append(_Stage(n))  # reported as a stage without 'Bootstrap:'
            section = _Section(n, first[1:].lower(), stripped[len(first) :].strip())
            stages[-1].sections.append(section)
        elif section is not None:
            section.body.append((n, raw))
        elif stripped and not stripped.startswith("#"):
            if not stages:
                problems.append(Problem(n, f"expected 'Bootstrap:' before anything else, got {stripped!r}"))
            else:
                stages[-1].headers.append((n, raw))
    return stages, problems


def _header_items(stage: _Stage) -> tuple[dict[str, tuple[int, str]], list[Problem]]:
    """Header lines -> {key: (line, value)}, with Apptainer's `\\` continuations and `#` comments."""
    items: dict[str, tuple[int, str]] = {}
    problems: list[Problem] = []
    continued: tuple[int, str, str] | None = None
    for n, raw in stage.headers:
        value_text = raw.split("#", 1)[0].strip()
        if continued is not None:
            start, key, value = continued
            value += value_text
            continued = None
        else:
            if raw[:1].isspace():
                problems.append(Problem(n, f"header {raw.strip()!r} is indented; headers start at the beginning of the line"))
            key, sep, value = value_text.partition(":")
            key, value, start = key.strip().lower(), value.strip(), n
            if not sep:
                problems.append(Problem(n, f"expected a 'Key: value' header before the first section, got {raw.strip()!r}"))
                continue
            if key not in HEADERS and not re.fullmatch(r"otherurl\d+", key):
                problems.append(Problem(n, f"unknown header {key!r}{_suggest(key, HEADERS)}"))
                continue
        if value.endswith("\\"):
            continued = (start, key, value[:-1])
            continue
        if key in items:
            problems.append(Problem(start, f"header {key!r} repeats (first on line {items[key][0]})"))
        else:
            items[key] = (start, value)
    return items, problems


def _check_headers(stage: _Stage, items: dict[str, tuple[int, str]]) -> list[Problem]:
    if "bootstrap" not in items:
        return [Problem(stage.line, "missing 'Bootstrap:' header")]
    line, agent = items["bootstrap"]
    if agent.lower() not in BOOTSTRAP_AGENTS:
        return [Problem(line, f"unknown bootstrap agent {agent!r}{_suggest(agent.lower(), BOOTSTRAP_AGENTS)}")]
    if agent.lower() in NEEDS_FROM:
        if "from" not in items:
            return [Problem(line, f"'Bootstrap: {agent}' needs a 'From:' header naming the base image")]
        if not items["from"][1]:
            return [Problem(items["from"][0], f"'From:' is empty; 'Bootstrap: {agent}' needs a base image")]
    return []


def _check_section(section: _Section, earlier_stages: set[str]) -> list[Problem]:
    name, n = section.name, section.line
    if name in APP_SECTIONS:
        if not section.args:
            return [Problem(n, f"'%{name}' needs an app name, as in '%{name} myapp'")]
    elif name not in SECTIONS:
        return [Problem(n, f"unknown section '%{name}'{_suggest(name, SECTIONS | APP_SECTIONS, '%')}")]
    problems = []
    if name == "files" and section.args:
        words = section.args.split()
        if len(words) != 2 or words[0].lower() != "from":
            problems.append(Problem(n, f"expected '%files' or '%files from <stage>', got '%files {section.args}'"))
        elif words[1] not in earlier_stages:
            problems.append(Problem(n, f"'%files from {words[1]}': no earlier stage has 'Stage: {words[1]}'"))
    if name not in _FREE_TEXT:
        problems += _misplaced_headers(section)
    if name in ("files", "appfiles"):
        problems += _check_files_lines(section)
    if name in ("labels", "applabels"):
        problems += _check_label_lines(section)
    if name in ("test", "apptest"):
        problems += _check_test_stops_on_error(section)
    return problems


_SET_E = re.compile(r"^\s*set\s+-[a-zA-Z]*e")


def _check_test_stops_on_error(section: _Section) -> list[Problem]:
    """Apptainer runs `%test` with /bin/sh and no `-e`: only the last command's status counts, so a
    failed `import habitat_sim` before a passing `hpcrl --help` would pass the build. A test of more
    than one command must start with `set -e`."""
    commands = [(n, raw) for n, raw in section.body if raw.strip() and not raw.strip().startswith("#")]
    if len(commands) > 1 and not _SET_E.match(commands[0][1]):
        return [Problem(commands[0][0], f"'%{section.name}' runs under sh without -e, so only its last command counts: start it with 'set -e'")]
    return []


def _misplaced_headers(section: _Section) -> list[Problem]:
    """A header after a section is not a header any more: Apptainer runs it as a line of that section."""
    problems = []
    for n, raw in section.body:
        m = _HEADER_LIKE.match(raw)
        if m and m.group(1).lower() in HEADERS:
            problems.append(Problem(n, f"header {raw.strip()!r} inside '%{section.name}'; headers go before the first section"))
    return problems


def _content_lines(section: _Section) -> list[tuple[int, str]]:
    return [(n, raw.strip()) for n, raw in section.body if raw.strip() and not raw.strip().startswith("#")]


def _files_fields(line: str) -> list[str] | None:
    """`src [dst]` fields, double quotes allowed around paths with spaces; None for an unbalanced quote."""
    if line.count('"') % 2:
        return None
    return [f.strip('"') for f in _FILES_FIELD.findall(line)]


def _check_files_lines(section: _Section) -> list[Problem]:
    problems = []
    for n, line in _content_lines(section):
        fields = _files_fields(line)
        if fields is None:
            problems.append(Problem(n, f"unbalanced double quote in {line!r}"))
        elif len(fields) > 2:
            problems.append(Problem(n, f"expected 'src [dst]' in %{section.name}, got {len(fields)} fields in {line!r} (quote paths with spaces)"))
    return problems


def _check_label_lines(section: _Section) -> list[Problem]:
    """Docker writes `LABEL k=v`; in %labels that is a name with an empty value."""
    return [
        Problem(n, f"label {line.split()[0]!r} has '=' in its name; %labels lines are 'name value'")
        for n, line in _content_lines(section)
        if "=" in line.split()[0]
    ]


def _suggest(word: str, choices: frozenset[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def check_def(text: str) -> list[Problem]:
    """Every problem of a definition file, in line order; an empty list means Apptainer will parse it."""
    if not text.strip():
        return [Problem(1, "empty definition file")]
    stages, problems = _split(text)
    if not stages:
        return problems + [Problem(1, "missing 'Bootstrap:' header")]
    named: dict[str, int] = {}
    for stage in stages:
        items, header_problems = _header_items(stage)
        problems += header_problems + _check_headers(stage, items)
        for section in stage.sections:
            problems += _check_section(section, set(named))
        if "stage" in items:
            line, name = items["stage"]
            if name in named:
                problems.append(Problem(line, f"stage {name!r} repeats (first on line {named[name]})"))
            named.setdefault(name, line)
    return sorted(problems, key=lambda p: p.line)


def files_entries(text: str) -> list[FilesEntry]:
    """The `%files`/`%appfiles` lines of a definition (checked or not): what a build copies, and from where."""
    stages, _ = _split(text)
    entries = []
    for stage in stages:
        for section in stage.sections:
            if section.name not in ("files", "appfiles"):
                continue
            words = section.args.split()
            source_stage = words[1] if section.name == "files" and len(words) == 2 and words[0].lower() == "from" else None
            for n, line in _content_lines(section):
                fields = _files_fields(line) or []
                if fields:
                    entries.append(FilesEntry(n, fields[0], fields[1] if len(fields) > 1 else None, source_stage))
    return entries
