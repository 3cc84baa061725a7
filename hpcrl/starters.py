"""`hpcrl configs` and `hpcrl init`: the bundled configs, as starting points for a user's own.

The configs ship in the wheel (hpcrl/_bundled/configs/, or configs/ in a checkout). Each starts
with a comment whose first line says what it is: that line is what `hpcrl configs` lists. `init`
copies one as text, comments included (they explain the settings), with only its `name:` changed.
"""

from __future__ import annotations

import re
from pathlib import Path

from hpcrl.config.experiment import _name_problem
from hpcrl.config.schema import ConfigError, did_you_mean
from hpcrl.io import atomic_write_text
from hpcrl.templates import bundled_dir

DEFAULT = "cartpole_ppo"
_NAME_LINE = re.compile(r"^name:.*$", re.MULTILINE)


def bundled() -> dict[str, Path]:
    """Name (the file's stem) -> path of each bundled config, sorted."""
    return {p.stem: p for p in sorted(bundled_dir("configs").glob("*.yaml"))}


def summary(path: Path) -> str:
    """The first line of the config's header comment ('' when it has none)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def list_configs() -> list[tuple[str, str]]:
    return [(name, summary(path)) for name, path in bundled().items()]


def init(name: str, source: str = DEFAULT, directory: Path | None = None, force: bool = False) -> Path:
    """Write `<directory>/<name>.yaml`, a copy of bundled config `source` named `name`. An existing
    file is left as it is unless `force`; a bad name or an unknown source is a ConfigError. A name
    given as a file name (`x.yaml`, `x.yml`) writes that file, and its stem is the `name:`."""
    stem, dot, ext = name.rpartition(".")
    file_name = name if dot and ext.lower() in ("yaml", "yml") else f"{name}.yaml"
    name = stem if file_name == name else name
    if problem := _name_problem(name):
        raise ConfigError(f"init {name!r}: {problem}")
    configs = bundled()
    if source not in configs:
        hint = did_you_mean(source, list(configs))
        raise ConfigError(f"--from {source!r}: no bundled config of that name ({hint + ' ' if hint else ''}`hpcrl configs` lists them)")
    target = (directory or Path.cwd()) / file_name
    if target.exists() and not force:
        raise ConfigError(f"{target}: exists; choose another name or pass --force to overwrite it")
    text = configs[source].read_text(encoding="utf-8")
    text, count = _NAME_LINE.subn(f"name: {name}", text, count=1)
    if count != 1:
        raise ConfigError(f"{configs[source]}: a bundled config without a top-level name: line")  # a packaging defect
    atomic_write_text(target, text)
    return target
