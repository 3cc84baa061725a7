"""OpenSpiel game parameters checked before OpenSpiel sees them, and a first load that cannot take
hpcrl down.

OpenSpiel's C++ trusts its parameters: `connect_four` with `rows: 0` is a segmentation fault of
whatever process loads it (`hpcrl sweep` ended with rc 139 and no output), `rows: -1` a vector
allocation error, `columns: 0` a game with no legal action; an unknown parameter is refused, but
only after OpenSpiel printed its own line on stderr. So each `env.kwargs` entry is checked against
the game's declared parameters (`parameter_specification`: names, types and defaults), sizes that
are board dimensions must be positive, and the game is first loaded, started and observed in a
child process whose stderr is its own, within a bound: whatever it does there is one line here.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
from typing import Any

from hpcrl.store.rundir import RunError

SIZE_PARAMETERS = frozenset({"rows", "columns", "num_rows", "num_cols", "board_size", "size", "x_in_row", "connect", "dims"})
"""Parameter names that are board dimensions (or a line's length on the board) in OpenSpiel's
games: below 1 there is no board, and OpenSpiel does not check."""
PROBE_TIMEOUT_S = 60.0
"""Bound on the child process's first load of a game (a board of a million cells takes seconds)."""

_probed: dict[tuple[str, tuple[tuple[str, Any], ...]], None] = {}
"""Games with parameters already loaded safely in a child by this process (sweep time loads the
same game several times)."""


class GameParameterError(RunError):
    """An OpenSpiel game parameter that the game does not declare, of the wrong type, out of range,
    or with which OpenSpiel fails: one line, starting with its key path."""


def checked_parameters(name: str, declared: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """`params` (a config's `env.kwargs`) as OpenSpiel takes them (an int where a float is
    declared becomes a float), or GameParameterError naming the first that the game `name`, with
    its `declared` parameters and defaults, cannot take."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        where = f"env.kwargs.{key}"
        if key not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise GameParameterError(f"{where}: {name} has no parameter {key!r} (its parameters: {known})")
        default = declared[key]
        kind = type(default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            raise GameParameterError(f"{where}: {name}'s {key} is {_a(kind)} (default {default!r}), got {value!r}")
        if key in SIZE_PARAMETERS and kind is int and value < 1:
            raise GameParameterError(f"{where}: {name}'s {key} is a board size: expected a positive int, got {value}")
        out[key] = value
    return out


def _a(kind: type) -> str:
    return {bool: "a bool", int: "an int", float: "a number", str: "a string"}.get(kind, kind.__name__)


def probe_load(name: str, params: dict[str, Any], timeout: float = PROBE_TIMEOUT_S) -> None:
    """Load `name` with `params`, make its first position and observe it, in a child process;
    GameParameterError when OpenSpiel refuses them, crashes, or does not finish within `timeout`.
    Once per game and parameters in this process."""
    key = (name, tuple(sorted(params.items())))
    if key in _probed:
        return
    ctx = multiprocessing.get_context("fork")  # pyspiel is loaded already; the child only calls it
    answers, child_end = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_load_here, args=(name, params, child_end), daemon=True)
    process.start()
    child_end.close()
    shown = f"{name} with {params}"
    try:
        if not answers.poll(timeout):
            raise GameParameterError(f"env.kwargs: OpenSpiel did not load {shown} within {timeout:g} s")
        error = answers.recv()
    except EOFError:
        process.join(5.0)
        code = process.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        raise GameParameterError(f"env.kwargs: OpenSpiel crashed loading {shown} ({how})") from None
    finally:
        answers.close()
        process.join(5.0)
        if process.exitcode is None:
            process.kill()
            process.join()
    if error is not None:
        raise GameParameterError(f"env.kwargs: OpenSpiel refuses {shown}: {error}".splitlines()[0])
    _probed[key] = None


def _load_here(name: str, params: dict[str, Any], answers: Any) -> None:
    """The child: its stderr silenced (OpenSpiel prints there before it raises), the game loaded,
    started and observed; None, or OpenSpiel's message, goes back."""
    faulthandler.disable()  # a crash here is reported by the parent, not dumped by an inherited handler
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    import pyspiel

    try:
        game = pyspiel.load_game(name, params)
        state = game.new_initial_state()
        state.legal_actions()
        if game.get_type().provides_observation_tensor:
            state.observation_tensor(0)
        answers.send(None)
    except Exception as exc:  # noqa: BLE001 - OpenSpiel's refusal, sent back as its message
        answers.send(str(exc) or type(exc).__name__)
    answers.close()
    os._exit(0)  # nothing of the parent's (atexit handlers, buffers) runs twice
