"""What `env.kwargs` a ViZDoom game takes, checked before any game starts.

ViZDoom's gymnasium wrapper takes a few settings itself (`AdapterSettings`) and hands the rest to the
game's config (`DoomGame.set_config`), which prints a warning for a key it does not know or a value it
cannot read, ignores that line and goes on: `screen_resolutoin: RES_160X120` or `episode_timeout: -5`
trained as if unset, and the warning was one line among the engine's. A value with a line break became
settings of its own there (`doom_map: "map01\\nepisode_timeout = 5"` set the timeout), and
`living_reward: .nan` was taken. `settings_fault` tries each setting on a game that is never started
(no engine process, microseconds) and keeps ViZDoom's own reason; `hpcrl sweep` (hpcrl.rl.envcheck)
refuses such a config before anything is written, and each env refuses to build with it, for a run
started where ViZDoom was not installed at sweep time.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hpcrl.config.schema import ConfigError, build, public_fields, setting


@dataclass
class AdapterSettings:
    """The settings ViZDoom's gymnasium wrapper takes itself (defaults as its own), and hpcrl's `downsample` (the factor
    hpcrl.rl.vizdoom_env.ScreenObservation averages pixel blocks by), each with its rules (hpcrl.config.schema)."""

    frame_skip: int = setting(1, ge=1)
    max_buttons_pressed: int = setting(0, ge=0)
    treat_episode_timeout_as_truncation: bool = True
    use_multi_binary_action_space: bool = True
    downsample: int = setting(1, ge=1)


def settings_fault(kwargs: dict[str, Any]) -> str | None:
    """What is wrong with `env.kwargs` for a ViZDoom game, in one line that starts with the key's path, or None."""
    adapter = public_fields(AdapterSettings)
    try:
        build(AdapterSettings, {k: v for k, v in kwargs.items() if k in adapter}, "env.kwargs")
    except ConfigError as exc:
        return str(exc).splitlines()[0]
    game = None
    for key, value in kwargs.items():
        if key in adapter:
            continue
        where = f"env.kwargs.{key}"
        if isinstance(value, str) and ("\n" in value or "\r" in value):
            return f"{where}: {value!r} has a line break, which ViZDoom's config would read as a setting of its own"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where}: expected a finite number, got {value!r}"
        if game is None:
            import vizdoom

            game = vizdoom.DoomGame()
        with _stderr_kept() as said:
            taken = game.set_config({key: value})
        if not taken:
            reason = _reason(said[0])
            if reason.startswith("Unsupported key"):
                return f"{where}: not a setting of ViZDoom's game config ({reason}), nor one its gymnasium wrapper or hpcrl's adapter takes ({', '.join(adapter)})"
            return f"{where}: ViZDoom cannot take {value!r} ({reason})"
        if said[0]:
            os.write(2, said[0].encode())  # not ViZDoom's refusal: whatever else went to stderr meanwhile goes on there
    return None


def _reason(warning: str) -> str:
    """ViZDoom's reason in its warning, without where: `WARNING! Loading config from: "config string". Unsupported
    key: x in line #1. Line ignored.` -> `Unsupported key: x`; `... Unsupported value in lines 1-3: nope. Lines
    ignored.` -> `Unsupported value: nope`."""
    text = re.sub(r"\s+in lines? [#\d-]+", "", warning.partition('"config string".')[2])
    text = re.sub(r"\s*Lines? ignored\.\s*$", "", text.strip())
    return " ".join(text.rstrip(".").split()) or "ViZDoom's warning went to no stderr"


@contextlib.contextmanager
def _stderr_kept() -> Iterator[list[str]]:
    """What this process writes to file descriptor 2 meanwhile (ViZDoom's C++ warnings), kept in the list's one
    item instead of written there."""
    said = [""]
    try:
        saved = os.dup(2)
    except OSError:  # no stderr (a job started with it closed): the check stands, ViZDoom's reason is lost
        yield said
        return
    with contextlib.suppress(AttributeError, ValueError, OSError):  # sys.stderr None (fd 2 closed at start) or closed
        sys.stderr.flush()
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield said
            finally:
                os.dup2(saved, 2)
                sink.seek(0)
                said[0] = sink.read().decode(errors="replace")
    finally:
        os.close(saved)
