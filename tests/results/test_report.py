"""hpcrl.results.report: both renderings say the same thing, no text becomes markup, and a browser shows it all."""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from hpcrl.results import plots, report, stats
from hpcrl.results.report import Document, Image, Links, Section, Table

HOSTILE = "env.id=<script>alert(1)</script> & \"quoted\" 'single' <img src=x onerror=alert(2)>"
REASON = "FAILED: CUDA error: out of memory\nTraceback (most recent call last) & more | `x`"


class _Page(HTMLParser):
    """What a browser would build from the page: its tags with their attributes, and its visible text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self._skip = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._skip += tag in ("style", "title")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("style", "title")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)

    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())

    def attrs(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag]


def _png(path: Path, width: int = 64, height: int = 48) -> Path:
    """A small real PNG (for the renderer a plot is just a file)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width / 16, height / 16), dpi=16)
    fig.add_subplot().plot([0, 1], [1, 0])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _experiment(tmp_path: Path) -> tuple[Path, Path]:
    exp = tmp_path / "exp"
    (exp / "results").mkdir(parents=True)
    return exp, exp / "results"


def _hostile_doc(exp: Path) -> Document:
    results = exp / "results"
    return Document(
        title=f"sweep {HOSTILE}",
        facts=[("algorithm", "ppo"), (f"key {HOSTILE}", f"value {HOSTILE}"), ("git commit", "abc`def")],
        sections=[
            Section(f"Scores {HOSTILE}", [
                f"A paragraph with `code {HOSTILE}` and {HOSTILE}\nand a second line",
                Table(["setting", "seeds", "mean"], [[HOSTILE, "3/3", "1.5"], ["lr=0.1", "2/3", "-"]], caption=HOSTILE),
                Image(HOSTILE, _png(results / "plots" / "curves.png"), caption=HOSTILE),
            ]),
            Section("Runs without a result", [
                Table(["run", "problem"], [["a1", REASON]]),
                Links([(HOSTILE, exp / "runs" / 'a"1' / "train.log")]),
                Section(f"nested {HOSTILE}", ["deeper"]),
            ]),
        ],
    )


# ---------------------------------------------------------------------------------------------- html


def test_html_renders_hostile_text_as_text(tmp_path: Path) -> None:
    exp, results = _experiment(tmp_path)
    md_path, html_path = report.write(_hostile_doc(exp), results)
    assert (md_path, html_path) == (results / "report.md", results / "report.html")
    page = _Page(html_path.read_text())

    assert not page.attrs("script")
    assert not [(t, a) for t, a in page.tags if any(k.startswith("on") for k in a)], "an event handler attribute was created"
    assert {t for t, _ in page.tags} <= {
        "html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "h3", "dl", "dt", "dd", "nav", "strong", "ul", "li", "a",
        "section", "p", "code", "br", "figure", "figcaption", "div", "table", "thead", "tbody", "tr", "th", "td", "img",
    }
    assert len(page.attrs("img")) == 1 and page.attrs("img")[0]["alt"] == HOSTILE
    text = page.all_text()
    for expected in (f"sweep {HOSTILE}", f"key {HOSTILE}", f"Scores {HOSTILE}", f"nested {HOSTILE}", f"code {HOSTILE}"):
        assert expected in text
    # The failure reason keeps its line break as a <br>, and its `x` stays literal in a table cell.
    assert "out of memory<br>Traceback (most recent call last) &amp; more | `x`" in html_path.read_text()


def test_html_links_are_relative_and_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exp, results = Path("logs/my exp"), Path("logs/my exp/results")  # relative, as `hpcrl collect logs/x` gives them
    video = exp / "runs" / "r1" / "videos" / "episode 0.mp4"
    video.parent.mkdir(parents=True)
    video.write_bytes(b"\0")
    doc = Document("t", [], [Section("Videos", [Links([("run r1", video), ("absent", tmp_path / exp / "runs/r2/videos/x.mp4"),
                                                      ("log", (tmp_path / exp / "jobs/train_1.out"))])])])
    _, html_path = report.write(doc, results)
    page = _Page(html_path.read_text())
    hrefs = [a["href"] for a in page.attrs("a") if not a["href"].startswith("#")]
    assert hrefs == ["../runs/r1/videos/episode%200.mp4", "../runs/r2/videos/x.mp4", "../jobs/train_1.out"]
    # A player for the video that exists; none for the one that does not (a broken player helps nobody).
    assert [v["src"] for v in page.attrs("video")] == ["../runs/r1/videos/episode%200.mp4"]
    assert "controls" in page.attrs("video")[0]
    md = (results / "report.md").read_text()
    assert "- [run r1](../runs/r1/videos/episode%200.mp4)" in md and "- [log](../jobs/train_1.out)" in md


def test_html_is_self_contained(tmp_path: Path) -> None:
    exp, results = _experiment(tmp_path)
    png = _png(results / "plots" / "final.png", 80, 40)
    _, html_path = report.write(Document("t", [], [Section("Plots", [Image("final", png)])]), results)
    text = html_path.read_text()
    page = _Page(text)
    (img,) = page.attrs("img")
    assert img["src"] == "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    assert (img["width"], img["height"]) == ("80", "40")
    assert not page.attrs("link") and not page.attrs("script")
    assert not re.search(r"(src|href)=\"https?:", text) and "@import" not in text and "url(" not in text


def test_table_numeric_columns_right_aligned(tmp_path: Path) -> None:
    table = Table(["setting", "seeds", "mean", "95% CI", "note"],
                  [["lr=0.1", "3/3", "1.5", "[0.9, 2.1]", "ok"], ["lr=1", "0/3", "-", "-", ""], ["short row"]])
    text = report.to_html(Document("t", [], [Section("s", [table])]), tmp_path)
    rows = re.findall(r"<tr>(.*?)</tr>", text)
    assert re.findall(r"<th( class=\"num\")?>", rows[0]) == ["", ' class="num"', ' class="num"', ' class="num"', ""]
    assert rows[3].count("<td") == 5, "a short row is padded, not shifted"
    block = _fenced_block(report.to_markdown(Document("t", [], [Section("s", [table])]), tmp_path))
    assert block == [
        "setting    seeds  mean      95% CI  note",
        "---------  -----  ----  ----------  ----",
        "lr=0.1       3/3   1.5  [0.9, 2.1]  ok",
        "lr=1         0/3     -           -",
        "short row",
    ]


def test_sections_nest_and_the_contents_link_to_them(tmp_path: Path) -> None:
    doc = Document("t", [], [Section("A", ["a", Section("A.1", [Section("A.1.x", ["deep"])])]), Section("B", [])])
    page = _Page(report.to_html(doc, tmp_path))
    ids = [a["id"] for a in page.attrs("section")]
    assert ids == ["s1", "s1-1", "s1-1-1", "s2"]
    toc = [a["href"] for a in page.attrs("a")]
    assert toc == ["#s1", "#s1-1", "#s2"]
    assert [t for t, _ in page.tags if t in ("h2", "h3", "h4")] == ["h2", "h3", "h4", "h2"]


# ------------------------------------------------------------------------------------------ markdown


def test_at_phone_width_tables_become_cards_and_figures_fit_the_screen(tmp_path: Path) -> None:
    """Issue 38 item 7: at 390 px the loss-rate and CI columns were off-screen and three-panel figures
    unreadable. Every table sits in a wrapper that scrolls; on a narrow screen its rows become cards of
    "column value" lines (each cell names its column); figures never exceed the page; a figure with a
    narrow version shows that one on a narrow screen, the wide one elsewhere."""
    exp, results = _experiment(tmp_path)
    wide, narrow = _png(results / "plots" / "f.png", 96, 32), _png(results / "plots" / "narrow" / "f.png", 32, 64)
    header = ["setting", "seeds", "win rate", "95% CI", "loss rate", "95% CI (loss)", "games"]
    rows = [["lr=0.1", "3", "0.5", "[0.4, 0.6]", "0", "[0, 0]", "60"], ["lr=0.2", "3", "0.7", "[0.6, 0.8]", "0.1", "[0, 0.2]", "60"]]
    page = report.to_html(Document("t", [], [Section("S", [Table(header, rows), Image("fig", wide, narrow=narrow), Image("plain", wide)])]), results)

    assert page.count('<div class="scroll"><table>') == page.count("<table>") == 1
    dom = _Page(page)
    labels = [a.get("data-label") for a in dom.attrs("td")]
    assert labels == header * len(rows)
    css = page[page.index("<style>") : page.index("</style>")]
    phone = css[css.index("@media (max-width: 700px)") :]
    assert re.search(r"\.scroll table, \.scroll tbody, \.scroll tr, \.scroll td \{ display: block;", phone)
    assert ".scroll td::before { content: attr(data-label);" in phone and ".scroll thead {" in phone
    assert re.search(r"figure img \{[^}]*max-width: 100%", css) and re.search(r"\.scroll \{[^}]*overflow: auto;[^}]*max-width: 100%", css)
    (source,) = dom.attrs("source")
    assert source["media"] == "(max-width: 700px)" and source["srcset"] == "data:image/png;base64," + base64.b64encode(narrow.read_bytes()).decode()
    assert [a["src"] for a in dom.attrs("img")] == ["data:image/png;base64," + base64.b64encode(wide.read_bytes()).decode()] * 2
    assert page.count("<picture>") == 1  # the figure without a narrow version is a plain <img>


def _fenced_block(md: str) -> list[str]:
    """The lines of the first fenced block, found the way CommonMark does: the same fence closes it."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"`{3,}", line))
    fence = lines[start]
    end = next(i for i in range(start + 1, len(lines)) if re.fullmatch(fence + "`*", lines[i]))
    return lines[start + 1 : end]


def test_markdown_table_survives_pipes_backticks_and_line_breaks(tmp_path: Path) -> None:
    rows = [["a|b", "```", "x"], [REASON, "`", "y"], ["last", "``` ````", "z"]]
    md = report.to_markdown(Document("t", [], [Section("s", [Table(["c|1", "c2", "c3"], rows)])]), tmp_path)
    block = _fenced_block(md)
    assert len(block) == 2 + len(rows), "header, rule and one line per row, all inside the fence"
    assert block[0].startswith("c|1") and block[2].startswith("a|b") and block[4].startswith("last")
    assert "out of memory Traceback (most recent call last) & more | `x`" in block[3]
    assert md.count("`````\n") == 2, "the fence is longer than the longest backtick run in a cell"


def test_markdown_escapes_hostile_text(tmp_path: Path) -> None:
    exp, results = _experiment(tmp_path)
    md = report.write(_hostile_doc(exp), results)[0].read_text()
    # Code spans and fenced blocks show their text literally; everything else must escape `<`.
    outside_code = re.sub(r"^(`{3,})$.*?^\1$", "", md, flags=re.M | re.S)
    outside_code = re.sub(r"(`+).*?\1", "", outside_code.replace("\\`", ""))
    assert not re.search(r"(?<!\\)<(script|img)", outside_code), "raw HTML reached the markdown"
    assert md.startswith("# sweep env.id=\\<script\\>alert(1)\\</script\\> & \"quoted\"")
    assert "- git commit: ``abc`def``" in md
    assert "![env.id=\\<script\\>" in md and "](plots/curves.png)" in md
    # A line break in a paragraph is a hard break, never a new block; headings stay on one line.
    assert "and a second line" in md and "\\\nand a second line" in md
    assert "### nested env.id=\\<script\\>" in md
    assert "- [env.id=\\<script\\>alert(1)\\</script\\>" in md and "](../runs/a%221/train.log)" in md


def test_markdown_paragraph_cannot_start_a_block(tmp_path: Path) -> None:
    md = report.to_markdown(Document("t", [], [Section("s", ["# not a heading\n- not a list\n1. not a list\n```\n    not code"])]), tmp_path)
    assert "\\# not a heading\\\n\\- not a list\\\n1\\. not a list\\\n\\`\\`\\`\\\nnot code" in md


# ------------------------------------------------------------------------------------ images, writes


@pytest.mark.parametrize("content", [None, b"not a png at all", b"\x89PNG\r\n\x1a\n"])
def test_missing_or_broken_image_is_a_visible_note(tmp_path: Path, content: bytes | None) -> None:
    exp, results = _experiment(tmp_path)
    path = results / "plots" / "curves.png"
    if content is not None:
        path.parent.mkdir()
        path.write_bytes(content)
    md_path, html_path = report.write(Document("t", [], [Section("Training curves", [Image("Training curves", path)])]), results)
    page = _Page(html_path.read_text())
    assert not page.attrs("img")
    assert "image missing: plots/curves.png" in page.all_text()
    assert "**image missing:** `plots/curves.png`" in md_path.read_text()


def test_unreadable_image_is_a_visible_note(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        path = tmp_path / "results" / "plots"  # root reads any file: a directory is what it cannot read as one
        path.mkdir(parents=True)
    else:
        path = _png(tmp_path / "results" / "plots" / "x.png")
        path.chmod(0)
    text = report.to_html(Document("t", [], [Section("s", [Image("x", path)])]), tmp_path / "results")
    assert "image missing: plots" in text and "unreadable" in text


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exp, results = _experiment(tmp_path)
    report.write(_hostile_doc(exp), results)
    before = (results / "report.html").read_text()
    report.write(_hostile_doc(exp), results)  # rewriting over an existing report is the ordinary case
    assert sorted(p.name for p in results.iterdir()) == ["plots", "report.html", "report.md"]

    def broken(doc: Document, results_dir: Path) -> str:
        raise RuntimeError("killed halfway")

    monkeypatch.setattr(report, "to_html", broken)
    with pytest.raises(RuntimeError):
        report.write(Document("new", [], []), results)
    assert (results / "report.html").read_text() == before, "the old page stays whole"
    assert sorted(p.name for p in results.iterdir()) == ["plots", "report.html", "report.md"], "no temporary file left"


def test_huge_table_renders_fast(tmp_path: Path) -> None:
    rows = [[f"lr={i * 1e-5:.5f},ent={i % 7}", f"{i % 5}/5", f"{i * 1.5:.1f}", f"[{i:.1f}, {i + 3:.1f}]", "x" * 40] for i in range(2000)]
    doc = Document("t", [("k", "v")], [Section("Scores", [Table(["setting", "seeds", "mean", "95% CI", "note"], rows)])])
    # This thread's CPU time, not the wall's nor the process's: 0.05 s quiet, linear (8,000 rows 0.18 s); under the
    # full suite the wall read 1.18 s once (descheduled, and the atomic writes' fsync), and the xdist worker's process
    # time 0.57 s once (its other threads: what earlier tests left spinning), while a quadratic renderer takes seconds.
    began = time.thread_time()
    md_path, html_path = report.write(doc, tmp_path)
    took = time.thread_time() - began
    assert took < 0.5, f"2,000 rows took {took:.2f} CPU-s"
    assert len(_fenced_block(md_path.read_text())) == 2002
    assert html_path.read_text().count("<tr>") == 2001


# ------------------------------------------------------------------------------------------ chromium


def _realistic(results: Path) -> tuple[Document, list[list[str]], list[Path]]:
    """A report like `hpcrl collect` makes: 12 settings, curves, intervals, a profile, a failed run."""
    rng = np.random.default_rng(0)
    settings = [f"train.lr={lr},train.ent_coef={ec}" for lr in ("0.0003", "0.001", "0.003") for ec in ("0.0", "0.01", "0.02", "0.05")]
    steps = {s: [np.sort(rng.uniform(0, 1e5, 40)) for _ in range(3)] for s in settings}
    curves = {s: stats.aggregate_curves(x, [(100 + 20 * k) * (1 - np.exp(-t / 3e4)) + rng.normal(0, 10, t.size) for t in x], agg="iqm", reps=100, n_points=30)
              for k, (s, x) in enumerate(steps.items())}
    scores = {s: rng.normal(100 + 20 * k, 15, (3, 1)) for k, s in enumerate(settings)}
    summary = stats.summarize(scores, reps=200)
    rows = [[r["setting"], "3/3", f"{r['mean']:.1f}", f"[{r['mean_ci_low']:.1f}, {r['mean_ci_high']:.1f}]", f"{r['iqm']:.1f}"] for r in summary]
    pngs = [  # in the order the page shows them
        plots.plot_final_intervals(summary, results / "plots" / "final.png"),
        plots.plot_curves(dict(list(curves.items())[:6]), results / "plots" / "curves.png", "iqm"),
        plots.plot_performance_profile(dict(list(scores.items())[:6]), results / "plots" / "profile.png", reps=100),
    ]
    doc = Document("cartpole_ppo", [("algorithm", "ppo"), ("env", "CartPole-v1"), ("git commit", "b109d86")], [
        Section("Final evaluation return", [Table(["setting", "seeds", "mean", "95% CI", "IQM"], rows), Image("Final evaluation return", pngs[0])]),
        Section("Training curves", [Image("Training curves", pngs[1])]),
        Section("Performance profile", [Image("Performance profile", pngs[2])]),
        Section("Runs without a result", [Table(["run", "setting", "problem"], [["a1b2", HOSTILE, REASON]])]),
    ])
    return doc, rows, pngs


def _chromium(binary: str, tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    """One headless run with its own profile (a shared one is locked by any other Chromium running)."""
    argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}", *args, page.as_uri()]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc


@pytest.mark.e2e
def test_chromium_shows_the_report(chromium: str, tmp_path: Path) -> None:
    exp, results = _experiment(tmp_path)
    doc, rows, pngs = _realistic(results)
    _, page_path = report.write(doc, results)

    dom = _Page(_chromium(chromium, tmp_path, page_path, "--dump-dom").stdout)
    text = dom.all_text()
    for row in rows + [["a1b2", HOSTILE]]:
        for cell in row:
            assert cell in text
    assert "out of memory Traceback" in text
    assert not dom.attrs("script"), "hostile text became a script element"
    images = dom.attrs("img")
    assert len(images) == len(pngs)
    for img, png in zip(images, pngs):
        decoded = imread(io.BytesIO(base64.b64decode(img["src"].removeprefix("data:image/png;base64,"))), format="png")
        height, width = imread(png).shape[:2]
        assert decoded.shape[:2] == (height, width) and (img["width"], img["height"]) == (str(width), str(height))

    shot = tmp_path / "out.png"
    _chromium(chromium, tmp_path, page_path, f"--screenshot={shot}", "--window-size=1280,2000", "--hide-scrollbars")
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (2000, 1280)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 500, f"only {len(colours)} distinct colours: a blank or broken page"
    # The plots' coloured lines and bands: pixels far from grey, which text and page chrome never are.
    saturated = (pixels.max(axis=2) - pixels.min(axis=2)) > 0.25
    assert saturated.sum() > 10000, f"only {saturated.sum()} coloured pixels: the plots did not render"
    assert (pixels.min(axis=2) < 0.5).mean() > 0.01, "hardly any dark pixels: no text on the page"
