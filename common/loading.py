"""Config dataclasses from plain data (TOML, JSON, Redis, checkpoints), checked field by field
against the type hints, so that a config file fails at load with the field's dotted path, not
mid-run; and back to JSON."""

from __future__ import annotations

import dataclasses
import json
import reprlib
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from rlmq.common.codec import INT64_RANGE
from rlmq.common.config import RunConfig

C = TypeVar("C")


def from_mapping(cls: type[C], data: dict[str, Any], path: str = "") -> C:
    """Build a (nested) config dataclass from plain data. A key it does not know, a field it lacks
    or a value of another type than the field's hint is a ValueError naming the field's dotted
    path (`ppo.epochs: expected int, got 2.5`), so a config file fails at load, not mid-run."""
    hints = typing.get_type_hints(cls)
    where = f"{path}: " if path else ""
    unknown = set(data) - set(hints)
    if unknown:
        # `learning_rate = 1e-3` at the top of a run config belongs in a section, e.g. [ppo]
        nested = [
            f"{section}.{name}"
            for name in sorted(unknown)
            for section, hint in hints.items()
            if isinstance(hint, type)
            and dataclasses.is_dataclass(hint)
            and name in {f.name for f in dataclasses.fields(hint)}
        ]
        sections = f" (fields of that name: {', '.join(nested)})" if nested else ""
        raise ValueError(f"{where}{cls.__name__} has no field {', '.join(sorted(unknown))}{sections}")
    required = [
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in data]
    if missing:
        raise ValueError(f"{where}{cls.__name__} needs {', '.join(missing)}")
    return cls(
        **{name: _from_plain(hints[name], value, f"{path}.{name}" if path else name) for name, value in data.items()}
    )


# What a scalar field accepts: an int is a float too (TOML's `gamma = 1`), but a bool is no int.
_SCALARS: dict[type, tuple[type, ...]] = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}


def _from_plain(hint: Any, value: Any, path: str) -> Any:
    """JSON/TOML data → what a field of type `hint` holds (nested configs, tuples, maps of them),
    or ValueError when `value` cannot be one."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):  # configs use only `X | None`
        if value is None:
            return None
        (inner,) = [arg for arg in args if arg is not type(None)]
        return _scalar(inner, value, path, f"{inner.__name__} or null")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise _mismatch(path, f"a table of {hint.__name__} fields", value)
        return from_mapping(hint, value, path)
    if origin is dict:
        _, item = args
        if not isinstance(value, dict):
            raise _mismatch(path, f"a table of {getattr(item, '__name__', item)}", value)
        return {key: _from_plain(item, v, f"{path}.{key}") for key, v in value.items()}
    if origin is tuple:  # tuple[X, ...]
        if not isinstance(value, (list, tuple)):
            raise _mismatch(path, f"a list of {args[0].__name__}", value)
        return tuple(_from_plain(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    return _scalar(hint, value, path, hint.__name__)


def _scalar(hint: type, value: Any, path: str, expected: str) -> Any:
    if hint not in _SCALARS:
        raise TypeError(f"{path}: config fields cannot have type {hint}")  # a new field's hint, not data
    accepted = isinstance(value, _SCALARS[hint]) and (hint is bool or not isinstance(value, bool))
    if not accepted:
        raise _mismatch(path, expected, value)
    if hint is int and not INT64_RANGE[0] <= value <= INT64_RANGE[1]:
        raise ValueError(f"{path}: {reprlib.repr(value)} does not fit in 64 bits")
    if hint is float:
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{path}: {reprlib.repr(value)} is too large for a float") from None
    return value


def _mismatch(path: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"{path}: expected {expected}, got {reprlib.repr(value)}")


def load_run_config(path: Path, overrides: dict[str, Any]) -> RunConfig:
    """A run config from a TOML or JSON file, with CLI overrides applied on top."""
    text = path.read_text()
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        data = tomllib.loads(text) if kind == "TOML" else json.loads(text)
    except ValueError as exc:  # TOMLDecodeError, JSONDecodeError: their text gives line and column
        raise ValueError(f"not valid {kind}: {exc}") from None
    if not isinstance(data, dict):  # JSON: a list or a number at the top
        raise ValueError(f"expected a table of RunConfig fields at the top, got a {type(data).__name__}")
    return from_mapping(RunConfig, {**data, **overrides})


def to_json(config: Any) -> str:
    return json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True)
