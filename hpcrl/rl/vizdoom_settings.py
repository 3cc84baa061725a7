"""What `env.kwargs` a ViZDoom game takes, checked before any game starts.

ViZDoom's gymnasium wrapper takes a few settings itself (`WRAPPER_SETTINGS`) and hands the rest to the
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
from contextlib import contextmanager
from typing import Any

WRAPPER_SETTINGS = {
    "frame_skip": "a positive integer",
    "max_buttons_pressed": "a non-negative integer",
    "treat_episode_timeout_as_truncation": "true or false",
    "use_multi_binary_action_space": "true or false",
}
"""The settings ViZDoom's gymnasium wrapper takes itself, with what each must be."""

OWN_SETTINGS = {"downsample": "a positive integer"}
"""hpcrl's own: the factor the adapter averages pixel blocks by (hpcrl.rl.vizdoom_env.ScreenObservation)."""



def settings_fault(kwargs: dict[str, Any]) -> str | None:
    """What is wrong with `env.kwargs` for a ViZDoom game, in one line that starts with the key's path, or None."""
    game = None
    for key, value in kwargs.items():
        where = f"env.kwargs.{key}"
        if key in WRAPPER_SETTINGS or key in OWN_SETTINGS:
            what = WRAPPER_SETTINGS.get(key) or OWN_SETTINGS[key]
            if not _is(what, value):
                return f"{where}: expected {what}, got {value!r}"
            continue
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
                return f"{where}: not a setting of ViZDoom's game config ({reason}), nor one its gymnasium wrapper takes ({', '.join(WRAPPER_SETTINGS)}) or hpcrl's ({', '.join(OWN_SETTINGS)})"
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


def _is(what: str, value: Any) -> bool:
    if what == "true or false":
        return isinstance(value, bool)
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return value > 0 if what == "a positive integer" else value >= 0


@contextmanager
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
