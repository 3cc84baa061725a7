"""The report renderer: one document, two renderings (``results/report.md`` and ``results/report.html``).

`hpcrl.results.collect` decides what a report says and builds a `Document`; this module only decides how it
looks, so the two files can never disagree about content. The markdown stays plain enough to read
in a terminal on the cluster; the HTML is a single self-contained file (inline CSS, plots embedded
as base64) that still works after the results folder is copied to a laptop: links to logs and
videos are relative to the results directory, so the folder moves as a whole.

Everything in a document is text from somewhere else (setting labels from the user's config,
failure reasons from crashed jobs), so every piece of it is escaped on the way out, and the page
forbids scripts outright as a second line of defence. A plot that is missing or not a PNG becomes
a visible note rather than an exception: a report with one hole is still worth writing.
"""

from __future__ import annotations

import base64
import functools
import html
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from hpcrl.io import atomic_write_text


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    """Cells already formatted as text; a column whose cells are all numbers is right-aligned."""
    caption: str = ""


@dataclass
class Image:
    title: str
    path: Path
    """A PNG on disk: embedded into the HTML, linked relatively from the markdown."""
    caption: str = ""
    narrow: Path | None = None
    """The same figure with its panels in one column (hpcrl.results.plots.narrow_of): the HTML shows
    it instead on a narrow screen, where panels side by side shrink to unreadable text."""


@dataclass
class Links:
    items: list[tuple[str, str | Path]]
    """(text, target): files on disk (job logs, videos, run dirs), rendered relative to the results dir."""


@dataclass
class Section:
    title: str
    blocks: list[str | Table | Image | Links | Section]
    """A ``str`` is a paragraph of plain text, where `backticks` mark code spans."""


@dataclass
class Document:
    title: str
    facts: list[tuple[str, str]]
    """Provenance shown at the top: algorithm, env, git commit, host..."""
    sections: list[Section]

    def images(self) -> list[Image]:
        """Every figure of the document, in reading order (collect counts its plots here)."""
        found: list[Image] = []

        def walk(blocks: list) -> None:
            for block in blocks:
                if isinstance(block, Image):
                    found.append(block)
                elif isinstance(block, Section):
                    walk(block.blocks)

        walk(list(self.sections))
        return found


def write(doc: Document, results_dir: Path) -> tuple[Path, Path]:
    """Write results_dir/report.md and results_dir/report.html atomically and return both paths.

    Atomic (hpcrl.io), because `hpcrl collect` may run again while someone has the report open, and
    a killed aggregate job must not leave half a page behind.
    """
    results_dir = Path(results_dir)
    md, page = results_dir / "report.md", results_dir / "report.html"
    atomic_write_text(md, to_markdown(doc, results_dir))
    atomic_write_text(page, to_html(doc, results_dir))
    return md, page


# ------------------------------------------------------------------------------------------ shared

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_VIDEO_SUFFIXES = {".mp4", ".webm", ".ogv"}
_CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
# A cell is numeric when it has a digit and nothing but what numbers, intervals ("1.5 [0.9, 2.1]"),
# signs, percentages and missing markers are written with.
_NUMERIC = re.compile(r"(?=.*\d)[\d\s.,/+\-−e%±\[\]()]*|nan|inf|-inf|—|-|")


def _read_png(path: Path) -> tuple[bytes, int, int] | str:
    """The PNG's bytes and size, or why it cannot be shown (a missing plot is reported, not raised)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"unreadable: {e.strerror or e}"
    if data[:8] != _PNG_SIGNATURE or data[12:16] != b"IHDR" or len(data) < 24:
        return "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return data, width, height


def _relative(target: str | Path, results_dir: Path) -> str:
    """A target as a URL path relative to the results directory, so the folder can be moved whole."""
    return quote(_relpath(target, results_dir).replace(os.sep, "/"))  # relpath's answer is normalised: as_posix without a Path


def _relpath(target: str | Path, start: str | Path) -> str:
    """``os.path.relpath(target, start)``, with the part for the target's directory computed once:
    a report of 10,000 runs links 10,000 run directories of one parent."""
    target, start = os.path.abspath(target), os.path.abspath(start)
    parent, name = os.path.split(target)
    if not name or start == target or start.startswith(target + os.sep):  # start at or below the target: relpath's own answer
        return os.path.relpath(target, start)
    above = _relpath_of_dir(parent, start)
    return name if above == os.curdir else os.path.join(above, name)


@functools.lru_cache(maxsize=64)
def _relpath_of_dir(directory: str, start: str) -> str:
    return os.path.relpath(directory, start)  # both absolute: the answer does not depend on the working directory


def _numeric_columns(rows: list[list[str]], ncols: int) -> list[bool]:
    """Which columns to right-align: those whose filled cells are all numbers (an empty column is text)."""
    columns = [[row[i] for row in rows] for i in range(ncols)]
    return [any(c.strip() for c in col) and all(_NUMERIC.fullmatch(c.strip().lower()) for c in col) for col in columns]


def _padded(table: Table) -> tuple[list[str], list[list[str]]]:
    """Header and rows all as wide as the widest row: a short row must not shift its neighbours' cells."""
    ncols = max([len(table.header)] + [len(r) for r in table.rows])
    pad = lambda cells: [str(c) for c in cells] + [""] * (ncols - len(cells))
    return pad(table.header), [pad(r) for r in table.rows]


# ---------------------------------------------------------------------------------------- markdown


def to_markdown(doc: Document, results_dir: Path) -> str:
    """report.md: the provenance list, then each section; tables as fenced, aligned plain text."""
    out = [f"# {_md_line(doc.title)}", ""]
    out += [f"- {_md_line(key)}: {_md_code(value)}" for key, value in doc.facts]
    out.append("")
    for section in doc.sections:
        _md_section(section, 2, Path(results_dir), out)
    return "\n".join(out).rstrip("\n") + "\n"


def _md_section(section: Section, level: int, results_dir: Path, out: list[str]) -> None:
    out += [f"{'#' * min(level, 6)} {_md_line(section.title)}", ""]
    for block in section.blocks:
        if isinstance(block, Section):
            _md_section(block, level + 1, results_dir, out)
        elif isinstance(block, Table):
            if block.caption:
                out += [_md_paragraph(block.caption), ""]
            out += [_md_table(block), ""]
        elif isinstance(block, Image):
            png = _read_png(block.path)
            if isinstance(png, str):
                out += [f"**image missing:** {_md_code(os.path.relpath(block.path, results_dir))} ({png})", ""]
            else:
                out += [f"![{_md_line(block.title)}]({_relative(block.path, results_dir)})", ""]
            if block.caption:
                out += [_md_paragraph(block.caption), ""]
        elif isinstance(block, Links):
            out += [f"- [{_md_line(text)}]({_relative(target, results_dir)})" for text, target in block.items] + [""]
        else:
            out += [_md_paragraph(block), ""]


def _md_table(table: Table) -> str:
    """An aligned plain-text table in a code fence: readable raw, and no cell can break out of it.

    Inside a fence nothing is markup, so pipes are just characters; the fence is one backtick longer
    than any run of backticks in a cell, so no cell can close it; line breaks in a cell become spaces,
    so a cell cannot start a row of its own.
    """
    header, rows = _padded(table)
    grid = [[" ".join(c.split()) for c in row] for row in [header] + rows]
    numeric = _numeric_columns(rows, len(header))
    widths = [max(len(row[i]) for row in grid) for i in range(len(header))]
    line = lambda row: "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)).rstrip()
    body = [line(grid[0]), "  ".join("-" * w for w in widths)] + [line(row) for row in grid[1:]]
    longest = max([len(run) for row in grid for cell in row for run in re.findall(r"`+", cell)] + [2])
    fence = "`" * (longest + 1)
    return "\n".join([fence, *body, fence])


def _md_code(text: str) -> str:
    """A code span that holds any text literally: its delimiter is longer than the text's backtick runs."""
    text = " ".join(str(text).split())
    if not text:
        return ""
    ticks = "`" * (max([len(run) for run in re.findall(r"`+", text)] + [0]) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


_MD_SPECIAL = re.compile(r"([\\<>\[\]*`])|&(?=#?\w+;)")


def _md_escape(text: str) -> str:
    """Backslash-escape what would turn plain text into markup: raw HTML, links, emphasis, entities."""
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def _md_inline(text: str) -> str:
    """One line of plain text with its `code` spans kept as code and everything else escaped."""
    out, end = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [_md_escape(text[end : m.start()]), _md_code(m.group(2))]
        end = m.end()
    return "".join(out + [_md_escape(text[end:])])


def _md_line(text: str) -> str:
    """Text for a heading, list item or link text: one line, whatever line breaks it came with."""
    return _md_inline(" ".join(str(text).split()))


# A line starting like this would become a heading, list, quote, rule or table row.
_MD_BLOCK_START = re.compile(r"^([#+\-=|>~_]|\d+[.)])")


def _md_paragraph(text: str) -> str:
    """A paragraph whose line breaks stay line breaks (a hard break each) and never start a block."""
    lines = [_md_inline(line.strip()) for line in str(text).splitlines() if line.strip()]
    lines = [_MD_BLOCK_START.sub(lambda m: m.group(0)[:-1] + "\\" + m.group(0)[-1], line) for line in lines]
    return "\\\n".join(lines)


# -------------------------------------------------------------------------------------------- html

_CSS = """
:root { color-scheme: light; --line: #d8dde3; --muted: #5b6470; --accent: #1f5fa8; }
* { box-sizing: border-box; }
body { margin: 0; background: #f6f7f9; color: #1d232a;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; min-height: 100vh;
  box-shadow: 0 0 0 1px var(--line); }
h1 { font-size: 1.7em; margin: 0 0 12px; overflow-wrap: anywhere; }
h2 { font-size: 1.3em; margin: 36px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3, h4, h5, h6 { font-size: 1.08em; margin: 24px 0 8px; }
h2, h3, h4, h5, h6 { overflow-wrap: anywhere; }
p { margin: 8px 0; overflow-wrap: anywhere; }
a { color: var(--accent); }
code { font: 0.92em/1.4 ui-monospace, "DejaVu Sans Mono", monospace; background: #eef1f4; padding: 1px 4px;
  border-radius: 3px; overflow-wrap: anywhere; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0 0 16px;
  font-size: 0.93em; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
nav.toc { border: 1px solid var(--line); border-radius: 6px; padding: 8px 16px; margin: 16px 0;
  background: #fafbfc; font-size: 0.93em; }
nav.toc ul { margin: 4px 0; padding-left: 20px; }
figure { margin: 16px 0; }
figcaption { color: var(--muted); font-size: 0.92em; margin: 4px 0; }
figure img { display: block; max-width: 100%; height: auto; margin: 0 auto; }
.scroll { overflow: auto; max-width: 100%; max-height: 80vh; border: 1px solid var(--line); border-radius: 4px; }
table { border-collapse: collapse; font-size: 0.9em; min-width: 100%; }
th, td { padding: 4px 10px; text-align: left; vertical-align: top; border-bottom: 1px solid var(--line); }
th { position: sticky; top: 0; background: #eef1f4; white-space: nowrap; }
tbody tr:nth-child(even) { background: #f8f9fb; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.missing { border: 1px dashed #c0392b; color: #c0392b; padding: 12px; border-radius: 4px; }
ul.links { padding-left: 20px; }
ul.links video { display: block; max-width: 100%; max-height: 360px; margin: 4px 0 12px; }
@media (max-width: 700px) {
  main { padding: 12px 12px 32px; }
  h1 { font-size: 1.4em; }
  .scroll table, .scroll tbody, .scroll tr, .scroll td { display: block; min-width: 0; }
  .scroll thead { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }
  .scroll tr { padding: 6px 0; border-bottom: 1px solid var(--line); }
  .scroll td, .scroll td.num { border: 0; padding: 1px 10px; text-align: right; white-space: normal; overflow-wrap: anywhere; }
  .scroll td::before { content: attr(data-label); float: left; padding-right: 12px; color: var(--muted); text-align: left; }
  .scroll td:first-child { font-weight: 600; }
}
"""
_NARROW = "(max-width: 700px)"
"""Screens that get a figure's one-column version (Image.narrow): a phone's, held upright."""

# The page needs no script, so none may run: escaping already keeps text from becoming markup, and
# this keeps a slip in it from becoming code. Images are data URIs, videos relative files: both allowed.
_CSP = "script-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'"


def to_html(doc: Document, results_dir: Path) -> str:
    """report.html: one file with its CSS and plots inside; links relative to the results directory."""
    results_dir = Path(results_dir)
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{e(_CSP)}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(doc.title)}</title><style>{_CSS}</style></head>",
        f"<body><main><h1>{e(doc.title)}</h1>",
    ]
    if doc.facts:
        parts.append('<dl class="facts">' + "".join(f"<dt>{e(k)}</dt><dd>{_html_inline(v)}</dd>" for k, v in doc.facts) + "</dl>")
    if doc.sections:
        parts.append(_html_toc(doc.sections))
    for i, section in enumerate(doc.sections, 1):
        _html_section(section, f"s{i}", 2, results_dir, parts)
    parts.append("</main></body></html>\n")
    return "\n".join(parts)


def _html_toc(sections: list[Section]) -> str:
    """The top-level sections and one level below: enough to jump to a plot in a long report."""
    items = []
    for i, section in enumerate(sections, 1):
        subs = [(f"s{i}-{j}", s) for j, s in enumerate((b for b in section.blocks if isinstance(b, Section)), 1)]
        sub = "<ul>" + "".join(f'<li><a href="#{sid}">{html.escape(s.title)}</a></li>' for sid, s in subs) + "</ul>" if subs else ""
        items.append(f'<li><a href="#s{i}">{html.escape(section.title)}</a>{sub}</li>')
    return '<nav class="toc"><strong>Contents</strong><ul>' + "".join(items) + "</ul></nav>"


def _html_section(section: Section, sid: str, level: int, results_dir: Path, out: list[str]) -> None:
    h = min(level, 6)
    out.append(f'<section id="{sid}"><h{h}>{html.escape(section.title)}</h{h}>')
    subsections = 0
    for block in section.blocks:
        if isinstance(block, Section):
            subsections += 1
            _html_section(block, f"{sid}-{subsections}", level + 1, results_dir, out)
        elif isinstance(block, Table):
            out.append(_html_table(block))
        elif isinstance(block, Image):
            out.append(_html_image(block, section.title, results_dir))
        elif isinstance(block, Links):
            out.append(_html_links(block, results_dir))
        else:
            out.append(f"<p>{_html_inline(block)}</p>")
    out.append("</section>")


def _html_text(text: str) -> str:
    """Escaped text whose line breaks stay visible as <br> (a multi-line failure reason, say)."""
    return re.sub(r"\r\n|\r|\n", "<br>", html.escape(str(text)))


def _html_inline(text: str) -> str:
    """Like `_html_text`, with `code` spans as <code>."""
    text, out, end = str(text), [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [_html_text(text[end : m.start()]), f"<code>{_html_text(m.group(2))}</code>"]
        end = m.end()
    return "".join(out + [_html_text(text[end:])])


def _html_table(table: Table) -> str:
    header, rows = _padded(table)
    numeric = _numeric_columns(rows, len(header))
    cls = [' class="num"' if num else "" for num in numeric]
    cell = lambda tag, text, c: f"<{tag}{c}>{_html_text(text)}</{tag}>"
    head = "<tr>" + "".join(cell("th", t, c) for t, c in zip(header, cls)) + "</tr>"
    # Each cell names its column (data-label): on a phone the rows become cards of "column value" lines (_CSS).
    cls = [f'{c} data-label="{html.escape(" ".join(h.split()))}"' for h, c in zip(header, cls)]
    body = "\n".join("<tr>" + "".join(cell("td", t, c) for t, c in zip(row, cls)) + "</tr>" for row in rows)
    caption = f"<figcaption>{_html_inline(table.caption)}</figcaption>" if table.caption else ""
    return f'<figure class="table">{caption}<div class="scroll"><table><thead>{head}</thead><tbody>\n{body}\n</tbody></table></div></figure>'


def _html_image(image: Image, section_title: str, results_dir: Path) -> str:
    """The PNG inline as a data URI; its title shown unless the section heading already says it."""
    png = _read_png(image.path)
    if isinstance(png, str):
        name = os.path.relpath(image.path, results_dir)
        return f'<p class="missing">image missing: {html.escape(name)} ({html.escape(png)})</p>'
    data, width, height = png
    src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    label = [f"<strong>{html.escape(image.title)}</strong>"] if image.title and image.title != section_title else []
    label += [_html_inline(image.caption)] if image.caption else []
    caption = f"<figcaption>{' — '.join(label)}</figcaption>" if label else ""
    img = f'<img src="{src}" alt="{html.escape(image.title)}" width="{width}" height="{height}">'
    narrow = _read_png(image.narrow) if image.narrow is not None else "none"
    if not isinstance(narrow, str):  # a narrow version that is missing is no hole: the wide one shows
        data, width, height = narrow
        source = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        img = f'<picture><source media="{_NARROW}" srcset="{source}" width="{width}" height="{height}">{img}</picture>'
    return f"<figure>{img}{caption}</figure>"


def _html_links(links: Links, results_dir: Path) -> str:
    """Relative links; a video that exists also gets a player (the file stays beside the report, not in it)."""
    items = []
    for text, target in links.items:
        href = html.escape(_relative(target, results_dir))
        item = f'<a href="{href}">{_html_inline(text)}</a>'
        if Path(target).suffix.lower() in _VIDEO_SUFFIXES and Path(target).is_file():
            item += f'<video controls preload="metadata" src="{href}"></video>'
        items.append(f"<li>{item}</li>")
    return '<ul class="links">' + "".join(items) + "</ul>"
