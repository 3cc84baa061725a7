"""Plain YAML data -> the config dataclasses, with each field's rules declared beside the field.

A field says what it accepts where it is declared (`lr: float = setting(2.5e-4, gt=0)`), so one
converter enforces every bound and the classes' `check()` methods keep only the rules that join
several fields (`batch_size <= buffer_size`). Rules every value of a type obeys live here once:
a float is finite, an integer is at most `LARGEST_INT`, a string is one line. A value that reaches
a scheduler directive line is checked with `hpcrl.config.directives`, the same rule the job templates
apply when they render it.

No torch, no gymnasium: configs are validated on login nodes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from hpcrl.config import directives

LARGEST_INT = 2**53
"""Integers above this are refused everywhere: they are not exact as JSON numbers or floats, and no
count, budget or seed of a run is that large (a bigger `total_steps` would never end)."""

_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9_]*)")


MAX_PROBLEMS = 12
"""Problems one ConfigError lists at most; the rest are counted in a last line (a config with 300
broken values is usually one mistake: a wrong file, or a section indented one level too deep)."""


class ConfigError(ValueError):
    """A config that must not reach a scheduler. Each problem is the whole story on one line
    (`train.lr: expected a number, got 'fast'`); where the loader can go on past a problem (the
    other keys of a section, the other overrides, the other grid keys) it does, and every problem
    of the config comes in one error, one line each (`lines`), so a config is fixed in one edit."""

    def __init__(self, *lines: str) -> None:
        super().__init__("\n".join(lines))

    @property
    def lines(self) -> list[str]:
        """One line per problem."""
        return str(self).split("\n")

    @classmethod
    def joined(cls, errors: typing.Sequence[ConfigError]) -> ConfigError:
        """Every line of `errors`, each once, at most MAX_PROBLEMS of them."""
        lines = list(dict.fromkeys(line for error in errors for line in error.lines))
        if len(lines) > MAX_PROBLEMS:
            lines = [*lines[: MAX_PROBLEMS - 1], f"... and {len(lines) - MAX_PROBLEMS + 1} more problems"]
        return cls(*lines)

    def within(self, prefix: str) -> ConfigError:
        """The same problems, each line prefixed (`cartpole.yaml: `): a wrapped error keeps one line each."""
        return ConfigError(*(line if line.startswith("... and ") else prefix + line for line in self.lines))


class Problems:
    """The problems found so far in one pass over a config: `with problems.kept():` around a step
    that may raise lets the pass go on to the next step; `raise_any()` raises them all at once."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        try:
            yield
        except ConfigError as exc:
            self.errors.append(exc)

    def raise_any(self) -> None:
        if self.errors:
            raise ConfigError.joined(self.errors)


class YamlInt(int):
    """An integer read from YAML that keeps the text it was written as (see YamlFloat)."""

    text: str


class YamlFloat(float):
    """A float read from YAML that keeps its text, so a string field gets what the user typed:
    `name: 1.10` is the name '1.10', not '1.1'; `account: 0x1f` stays '0x1f'."""

    text: str


class Verbatim:
    """The type of a free-form value kept as YAML read it: numbers keep their text (YamlInt,
    YamlFloat). A user's program gets `--lr 2.5e-4` as written, where `Any` would give 0.00025."""


@dataclass(frozen=True)
class Rules:
    """What one field accepts beyond its type. Bounds apply to each element of a list field."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    min_items: int = 0
    max_items: int | None = None
    directive: Literal["word", "line"] | None = None
    """The value is written into `#SBATCH` / `#$` lines: one token ("word") or one raw line."""
    valid: Callable[[Any], str | None] | None = None
    """A parser-style check: returns why the value is wrong, or None."""
    keys: Callable[[str], str | None] | None = None
    """For a mapping field: why one of its keys is wrong, or None."""
    learned: bool = True
    """False for settings that change how or where a run executes, not what it learns: a run id need
    not hash them, and they cannot be swept (two grid points would be one run) unless `sweepable`."""
    sweepable: bool | None = None
    """Whether a grid may vary the setting; None: when it is `learned`. `eval.*` is swept to compare
    evaluations, though it changes nothing in training."""
    shorthand: Callable[[Any], Any] | None = None
    """Turns a short form into the value it stands for before typing (`seeds: 5` -> [0, ..., 4]);
    raises ValueError with what is wrong."""

    @property
    def in_grid(self) -> bool:
        return self.learned if self.sweepable is None else self.sweepable

    def problem(self, value: Any) -> str | None:
        """Why a converted scalar breaks these rules, or None."""
        if value is None:
            return None
        if self.directive == "word":
            return directives.word_problem(value)
        if self.directive == "line":
            return directives.line_problem(value)
        if self.valid is not None:
            return self.valid(value)
        if isinstance(value, (int, float)):
            return self._bound_problem(value)
        return None

    def _bound_problem(self, value: float) -> str | None:
        if (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        ):
            return None
        noun = "an integer" if isinstance(value, int) else "a number"
        low = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else ""
        high = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else ""
        if low and high:
            expected = f"{noun} in {low}, {high}"
        elif low in ("(0", "[1") and noun == "an integer" or low == "(0":
            expected = f"a positive {noun.split()[-1]}"
        elif low == "[0":
            expected = f"a non-negative {noun.split()[-1]}"
        elif low:
            expected = f"{noun} {'>=' if low[0] == '[' else '>'} {low[1:]}"
        else:
            expected = f"{noun} {'<=' if high[-1] == ']' else '<'} {high[:-1]}"
        return f"expected {expected}, got {value!r}"


def setting(
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    min_items: int = 0,
    max_items: int | None = None,
    directive: Literal["word", "line"] | None = None,
    valid: Callable[[Any], str | None] | None = None,
    keys: Callable[[str], str | None] | None = None,
    learned: bool = True,
    sweepable: bool | None = None,
    shorthand: Callable[[Any], Any] | None = None,
) -> Any:
    """A dataclass field with its rules (`field()` plus bounds), e.g. `gamma: float = setting(0.99, ge=0, le=1)`.

    A setting that names no rule declares none: a subclass that only changes a default, even one that
    needs `setting` for it (a list's `factory`), keeps the rules its base class declared (`field_rules`).
    Otherwise `hidden_sizes: list[int] = setting(factory=...)` in AlphaZeroConfig dropped the bounds
    TrainConfig declares, and `[0]` or `[-5]` passed the sweep."""
    rules = Rules(ge, gt, le, lt, min_items, max_items, directive, valid, keys, learned, sweepable, shorthand)
    metadata = {"rules": rules} if rules != Rules() else {}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@functools.cache
def field_rules(cls: type) -> dict[str, Rules]:
    """The rules of each field of `cls`. A subclass that only changes a default (`lr: float = 7e-4`
    in A2CConfig) keeps the rules its base class declared for that field."""
    out: dict[str, Rules] = {}
    for klass in reversed(cls.__mro__):
        for f in getattr(klass, "__dataclass_fields__", {}).values():
            if "rules" in f.metadata or f.name not in out:
                out[f.name] = f.metadata.get("rules") or Rules()
    return out


@functools.cache
def public_fields(cls: type) -> dict[str, dataclasses.Field]:
    """The fields a config file may set (cached: run configs are validated by the thousand)."""
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """Field types of a config class (resolving them is the costly part of validating 1000 run configs)."""
    return typing.get_type_hints(cls)


def did_you_mean(key: str, known: list[str], prefix: str = "", *, quote: bool = False) -> str:
    """'did you mean train.lr?' for `train.lrr`: the two closest known keys (difflib's ratio >= 0.7), or ''.
    With `quote`, each is shown as a value is (`'ppo'`)."""
    close = [prefix + c for c in difflib.get_close_matches(key, known, n=2, cutoff=0.7)]
    return f"did you mean {' or '.join(map(repr, close) if quote else close)}?" if close else ""


def choice_problem(value: Any, choices: typing.Sequence[str]) -> str:
    """The one wording of a value outside a fixed set (`algo`, `env.backend`, `--scheduler`, every
    Literal field): `expected one of 'ppo', 'a2c', got 'ppoo' (did you mean 'ppo'?)`."""
    hint = did_you_mean(value, list(choices), quote=True) if isinstance(value, str) else ""
    return f"expected one of {', '.join(map(repr, choices))}, got {value!r}" + (f" ({hint})" if hint else "")


def key_path(path: str, key: Any) -> str:
    """`path.key`, with a key that is not one printable line shown as its repr (an error stays one line)."""
    text = key if isinstance(key, str) and key.isprintable() and key.strip() == key and key else repr(key)
    return f"{path}.{text}" if path else text


def describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is Any or tp is Verbatim:
        return "any value"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in typing.get_args(tp) if a is not type(None))
    return str(tp)


def plain(value: Any) -> Any:
    """YAML data with YamlInt/YamlFloat turned back into int/float (free-form values such as
    env.kwargs are stored as they are, and YAML's safe dumper only represents the exact types)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value


def _convert_str(value: Any, path: str) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, (YamlInt, YamlFloat)):
        text = value.text
    elif isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    elif isinstance(value, float) and math.isfinite(value):
        text = repr(value)
    else:
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    return text


def integer_spelling_problem(value: Any) -> str | None:
    """YAML 1.1 reads `010` as 8, `0x10` as 16, `0b10` as 2 and `1:30` as 90: a count or a seed
    written so is refused rather than read as a number the user did not see (`seeds: 010` was 8
    runs). Integers of the schema are written in decimal; free-form values keep their text."""
    if isinstance(value, YamlInt) and not _DECIMAL.fullmatch(value.text):
        return f"expected a decimal number, got {value.text} (YAML 1.1 reads it as {int(value)}): write it in decimal"
    return None


def _convert_int(value: Any, path: str) -> int:
    if problem := integer_spelling_problem(value):
        raise ConfigError(f"{path}: {problem}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        value = int(value)  # 1e5 in YAML is a float; users mean an integer
    if abs(value) > LARGEST_INT:
        raise ConfigError(f"{path}: expected an integer of at most 2**53, got {value!r}")
    return int(value)


def _convert_float(value: Any, path: str) -> float:
    if problem := integer_spelling_problem(value):
        raise ConfigError(f"{path}: {problem}")
    if isinstance(value, str) and _NUMBER.fullmatch(value):
        value = float(value)  # YAML 1.1 reads 3e-4 (no dot) as a string
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{path}: expected a finite number, got {value!r}")
    return number


def convert(value: Any, tp: Any, path: str) -> Any:
    """`value` as type `tp`, or ConfigError naming `path`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return plain(value)
    if tp is Verbatim:
        return _verbatim(value)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        candidates = [a for a in args if a is not type(None)]
        errors = []
        for cand in candidates:
            try:
                return convert(value, cand, path)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(f"{path}: expected {describe(tp)}, got {value!r}")
    if origin is Literal:
        for arg in args:
            if isinstance(value, str) and value == arg:
                return arg
        raise ConfigError(f"{path}: {choice_problem(value, args)}")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        return _convert_int(value, path)
    if tp is float:
        return _convert_float(value, path)
    if tp is str:
        return _convert_str(value, path)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [convert(v, args[0], f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        out = {}
        for k, v in value.items():
            if isinstance(k, bool) and args[0] is str:
                raise ConfigError(f"{key_path(path, k)}: a key YAML read as {str(k).lower()} (YAML 1.1 reads on, off, yes and no as booleans): quote it")
            key = convert(k, args[0], key_path(path, k))
            out[key] = convert(v, args[1], key_path(path, key))
        return out
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    raise TypeError(f"unsupported type {tp!r} at {path}")  # a bug in the schema, not in the config


def _verbatim(value: Any) -> Any:
    """A free-form value as read, except that YAML 1.1's number-strings (`3e-4`, without a dot)
    become the numbers they spell, keeping that spelling: `3e-4` and `0.0003` are one value."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        number = YamlFloat(float(value))
        number.text = value.strip()
        return number
    if isinstance(value, list):
        return [_verbatim(v) for v in value]
    if isinstance(value, dict):
        return {k: _verbatim(v) for k, v in value.items()}
    return copy.deepcopy(value)


def one_line_problem(value: Any) -> str | None:
    """The rule of every string in a config: names, ids, paths and words are one line."""
    if isinstance(value, str) and _CONTROL.search(value):
        return f"expected a single line without control characters, got {value!r}"
    return None


def env_name_problem(key: str) -> str | None:
    """A name a shell and a container runtime take as a variable name."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return None
    return "expected an environment variable name (letters, digits, underscore)"


def no_spaces_problem(text: str) -> str | None:
    """One word without spaces (a W&B project or entity, a storage URL); not `directives.word_problem`, which a
    scheduler directive's token obeys (no quotes, backslashes or `#` either)."""
    return None if text.strip() and not any(c.isspace() for c in text) else f"expected one word without spaces, got {text!r}"


def non_empty_problem(text: str) -> str | None:
    """Something, not blanks: a path, a command, a channel."""
    return None if text.strip() else "expected a non-empty single line"


def _check_rules(rules: Rules, value: Any, path: str) -> None:
    """The field's declared rules, then the one-line rule, on a scalar, each list item, or each
    key and string value of a mapping (env.kwargs included: no config string holds a line break)."""
    if isinstance(value, dict):
        for key, item in value.items():
            problem = one_line_problem(key) or (rules.keys(key) if rules.keys else None)
            if problem:
                raise ConfigError(f"{key_path(path, key)}: {problem}")
            if isinstance(item, str) and one_line_problem(item):
                raise ConfigError(f"{key_path(path, key)}: {one_line_problem(item)}")
        return
    items = [(f"{path}[{i}]", item) for i, item in enumerate(value)] if isinstance(value, list) else [(path, value)]
    if isinstance(value, list) and len(value) < rules.min_items:
        raise ConfigError(f"{path}: expected at least {rules.min_items} item{'s' if rules.min_items > 1 else ''}")
    if isinstance(value, list) and rules.max_items is not None and len(value) > rules.max_items:
        raise ConfigError(f"{path}: expected at most {rules.max_items} item{'s' if rules.max_items > 1 else ''}, got {len(value)}")
    for where, item in items:
        problem = rules.problem(item) or one_line_problem(item)
        if problem:
            raise ConfigError(f"{where}: {problem}")


def build(cls: type, data: Any, path: str, elsewhere: Callable[[str], str] | None = None) -> Any:
    """An instance of config class `cls` from a mapping: types, declared rules, then `check()`.
    Every key is looked at before anything is raised: the ConfigError names each problem (unknown
    keys, values of the wrong type or out of bounds, in nested sections too), one line each;
    `check()`, which needs every field, runs when they are all valid. An unknown key with no close
    sibling gets `elsewhere(key)`'s did-you-mean, where the caller knows the whole schema (a
    top-level `seeds` is sweep.seeds)."""
    prefix = f"{path}." if path else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'top level'}: expected a mapping, got {data!r}")
    fields_ = public_fields(cls)
    types_ = hints(cls)
    rules = field_rules(cls)
    problems = Problems()
    for key in data:
        if key not in fields_:
            hint = did_you_mean(str(key), list(fields_), prefix) or (elsewhere(str(key)) if elsewhere else "")
            problems.errors.append(ConfigError(f"{key_path(path, key)}: unknown key ({hint + ' ' if hint else ''}expected one of: {', '.join(sorted(fields_))})"))
    kwargs = {}
    for name, f in fields_.items():
        if name in data:
            with problems.kept():
                value = data[name]
                if rules[name].shorthand is not None:
                    try:
                        value = rules[name].shorthand(value)
                    except ValueError as exc:
                        raise ConfigError(f"{prefix}{name}: {exc}") from None
                typed = convert(value, types_[name], f"{prefix}{name}")
                _check_rules(rules[name], typed, f"{prefix}{name}")
                kwargs[name] = typed
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.errors.append(ConfigError(f"{prefix}{name}: required key is missing"))
    problems.raise_any()
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None and (found := check()):  # the first problem of each key: later ones often restate it
        raise ConfigError(*(f"{prefix}{key}: {message}" for key, message in dict(reversed(found)).items()))
    return obj


def _num(bound: float) -> str:
    """A bound as a user types it: integers in full (seeds up to 4294967295), other numbers short."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 2**53 else f"{bound:g}"
