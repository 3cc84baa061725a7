"""The Jinja2 environment for job scripts and Singularity definitions.

Templates are files a user can read, copy and override: a `job_templates/` (or `singularity/`)
directory in the working directory wins over the bundled copy. StrictUndefined turns a typo in a
template into an error at render time instead of an empty string in a job script. `shquote` is
the one way a value reaches a shell; `directive` (one token) and `directive_line` (a raw line)
are the one way a value reaches a scheduler directive (`#SBATCH`, `#$`), and refuse what it
cannot carry (hpcrl.config.directives). A refusal at render time is a ConfigError naming the template,
so `hpcrl sweep` exits 2 with one line before it writes anything.
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.config.directives import DirectiveError, directive_line, directive_word
from hpcrl.config.schema import ConfigError

if TYPE_CHECKING:
    import jinja2

PACKAGE_DIR = Path(__file__).resolve().parent


def bundled_dir(name: str) -> Path:
    """A resource directory shipped with hpcrl: in the wheel under `_bundled/`, or in a source checkout."""
    for candidate in (PACKAGE_DIR / "_bundled" / name, PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"hpcrl's bundled {name}/ directory is missing from {PACKAGE_DIR}")


def search_path(kind: str, cwd: Path | None = None) -> list[Path]:
    """User directory first, bundled defaults second."""
    user = (cwd or Path.cwd()) / kind
    bundled = bundled_dir(kind)
    paths = [user] if user.is_dir() and user.resolve() != bundled.resolve() else []
    return paths + [bundled]


def shquote(value: Any) -> str:
    """Quote any value for a POSIX shell; booleans and None render as YAML would, so hpcrl reads them back."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = str(value)
    return shlex.quote(text)


def environment(kind: str, cwd: Path | None = None) -> jinja2.Environment:
    """The environment of the templates `kind` as seen from `cwd`: one per search path, kept, so
    that a template is compiled once per process (a 10,000-run Slurm sweep renders 43 scripts, and
    compiling each anew took 1.4 s of it). Jinja still reloads a template whose file changed."""
    return _environment(tuple(str(p) for p in search_path(kind, cwd)))


@functools.lru_cache(maxsize=16)
def _environment(paths: tuple[str, ...]) -> jinja2.Environment:
    # Imported here, not with the module: every job process imports this module (hpcrl.schedulers does) and
    # only those that render a script need Jinja (0.06-0.07 CPU-s of a job's start otherwise).
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(paths)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["shquote"] = shquote
    env.filters["directive"] = directive_word
    env.filters["directive_line"] = directive_line
    return env


def render(kind: str, name: str, context: dict[str, Any], cwd: Path | None = None) -> str:
    template = environment(kind, cwd).get_template(name)
    try:
        return template.render(**context)
    except DirectiveError as exc:
        raise ConfigError(f"{template.filename}{_template_line(exc, template.filename)}: {exc}") from None


def _template_line(exc: BaseException, filename: str | None) -> str:
    """`, line N` of the template line that raised (Jinja rewrites tracebacks to point at it), or ''."""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f", line {line}" if line else ""
