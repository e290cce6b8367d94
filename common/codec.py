"""How the wire's message dataclasses become msgpack values and back, and what a message may hold.

Arrays travel as ``[dtype, shape, raw bytes]``; dataclasses as maps of their fields. Decoding is
driven by the dataclass annotations (`unpack_dataclass`), so what a field may hold is declared once,
in `common/wire.py`; every failure (wrong type, unknown or missing field, dtype outside the
allow-list, shape × itemsize ≠ length, NaN/inf, a value a message's own checks refuse) raises
`WireError`. Nothing here ever unpickles.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Union

import numpy as np

from rlmq.common.schema import MAX_OBS_DIMS

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_STR_CHARS = 4096
MAX_SEQUENCE = 4096
MAX_ARRAY_DIMS = MAX_OBS_DIMS + 2  # a rollout's observations: time and slot, then the observation's
ALLOWED_DTYPES = frozenset({"float32", "float64", "int64", "int32", "uint8", "bool"})
INT64_RANGE = (-(2**63), 2**63 - 1)  # what an int field may hold


class WireError(ValueError):
    """Bytes that are not a valid rlmq message. Services count it, drop it and carry on."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason  # a short label, used as the `reason` of the rejected-messages metric


@functools.cache
def dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, remembered: NumPy builds the string on every call, and a rollout's seven arrays
    are named when it is built and when it is encoded (benchmarks/LOG.md §1). Few dtypes ever reach
    it: decoded arrays come only in ALLOWED_DTYPES."""
    return dtype.name


def pack(value: Any) -> Any:
    """A message (or any field of one) as msgpack values; arrays as [dtype, shape, bytes]."""
    kind: type = type(value)
    if kind in _PLAIN:  # most fields: checked first, as encoding a rollout is on an actor's hot path
        return value
    if isinstance(value, np.ndarray):
        # Native byte order, as decode reads it (a copy only where the array is not so already).
        # The shape is the value's own: ascontiguousarray turns a 0-d array into shape (1,).
        # Flattened: memoryview.cast refuses a 0 in the shape.
        array = value
        if not (value.flags.c_contiguous and value.dtype.isnative):
            array = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("="))
        data = memoryview(array.reshape(-1)).cast("B")  # type: ignore[arg-type]
        return [dtype_name(array.dtype), list(value.shape), data]
    if dataclasses.is_dataclass(value):
        return {name: pack(getattr(value, name)) for name in _field_names(kind)}
    if isinstance(value, dict):
        return {k: pack(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [pack(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


_PLAIN = frozenset({int, float, str, bool, bytes, type(None)})


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def unpack_dataclass(cls: type, raw: Any, where: str, given: dict[str, Any] | None = None) -> Any:
    """`cls` from the map `raw`, each field unpacked by its type hint; fields in `given` come
    already decoded."""
    if not isinstance(raw, dict):
        raise WireError("bad_type", f"{where} must be a map")
    fields, names = _decoding_plan(cls)
    if not names.issuperset(raw):
        raise WireError("unknown_field", f"{where}: {sorted(set(raw) - names, key=repr)}")  # str and bytes
    values = dict(given) if given else {}
    for name, unpack_field, required in fields:
        if name in values:
            continue
        if name in raw:
            values[name] = unpack_field(raw[name], f"{where}.{name}")
        elif required:
            raise WireError("missing_field", f"{where}.{name}")
    try:
        return cls(**values)
    except WireError:
        raise
    except (TypeError, ValueError) as exc:
        raise WireError("bad_value", f"{where}: {exc}") from exc


Unpacker = Callable[[Any, str], Any]  # (the raw msgpack value, where it sits) → the checked value


@functools.cache
def _decoding_plan(cls: type) -> tuple[tuple[tuple[str, Unpacker, bool], ...], frozenset[str]]:
    """A dataclass's fields as decode walks them: (name, its unpacker, required), and all names.
    The type hints are read once per class here: walking them on every message cost a learner
    more than the checks themselves."""
    hints = typing.get_type_hints(cls)
    fields = tuple(
        (
            f.name,
            _unpacker(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )
    return fields, frozenset(hints)


@functools.cache
def _unpacker(hint: Any) -> Unpacker:
    """The function that checks and unpacks a raw value declared as `hint`."""
    if hint in _SCALAR_UNPACKERS:
        return _SCALAR_UNPACKERS[hint]
    if hint is np.ndarray:
        return unpack_array
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return functools.partial(unpack_dataclass, hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        unpack_inner = _unpacker(inner)
        return lambda raw, where: None if raw is None else unpack_inner(raw, where)
    if origin is tuple:
        (item,) = [a for a in args if a is not Ellipsis]
        return functools.partial(_unpack_tuple, _unpacker(item))
    if origin is dict and args[0] is str:
        return functools.partial(_unpack_dict, _unpacker(args[1]))
    raise TypeError(f"wire cannot carry {hint!r}")  # a bug in a declaration, not input


def _unpack_tuple(unpack_item: Unpacker, raw: Any, where: str) -> tuple[Any, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_SEQUENCE:
        raise WireError("bad_type", f"{where} must be a list")
    return tuple(unpack_item(v, f"{where}[]") for v in raw)


def _unpack_dict(unpack_value: Unpacker, raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise WireError("bad_type", f"{where} must be a map")
    return {_unpack_str(k, where): unpack_value(v, f"{where}.{k}") for k, v in raw.items()}


def _unpack_bool(raw: Any, where: str) -> bool:
    if not isinstance(raw, bool):
        raise WireError("bad_type", f"{where} must be a bool")
    return raw


def _unpack_int(raw: Any, where: str) -> int:
    if type(raw) is not int or not INT64_RANGE[0] <= raw <= INT64_RANGE[1]:  # a bool is not an int here
        raise WireError("bad_type", f"{where} must be an int64")
    return raw


def _unpack_float(raw: Any, where: str) -> float:
    if type(raw) not in (int, float):
        raise WireError("bad_type", f"{where} must be a number")
    if not math.isfinite(raw):
        raise WireError("non_finite", where)
    return float(raw)


def _unpack_str(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or len(raw) > MAX_STR_CHARS:
        raise WireError("bad_type", f"{where} must be a string of at most {MAX_STR_CHARS}")
    return raw


_SCALAR_UNPACKERS: dict[Any, Unpacker] = {bool: _unpack_bool, int: _unpack_int, float: _unpack_float, str: _unpack_str}
_DTYPES = {name: np.dtype(name) for name in ALLOWED_DTYPES}


def unpack_array(raw: Any, where: str) -> np.ndarray:
    """An array from [dtype, shape, bytes], checked; a read-only view of the bytes."""
    if not (isinstance(raw, list) and len(raw) == 3):
        raise WireError("bad_type", f"{where} must be [dtype, shape, bytes]")
    name, shape, data = raw
    dtype = _DTYPES.get(name) if isinstance(name, str) else None  # a list is unhashable
    if dtype is None:
        raise WireError("bad_dtype", f"{where}: {name!r}")
    if not isinstance(shape, list) or len(shape) > MAX_ARRAY_DIMS:
        raise WireError("bad_shape", f"{where}: {shape!r}")
    count = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:  # a bool is not a dim
            raise WireError("bad_shape", f"{where}: {shape!r}")
        count *= dim
    if not isinstance(data, bytes):
        raise WireError("bad_type", f"{where}: data must be bytes")
    if count * dtype.itemsize != len(data):
        raise WireError("bad_shape", f"{where}: shape {shape} × {dtype.itemsize} B ≠ {len(data)} B")
    try:  # a size-0 array can still name dims numpy refuses, e.g. [0, 2**63]
        array = np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as exc:
        raise WireError("bad_shape", f"{where}: {shape!r} ({exc})") from exc
    if dtype.kind == "f" and not np.isfinite(array).all():
        raise WireError("non_finite", where)
    if dtype.kind == "b" and data.translate(None, b"\x00\x01"):  # deletes the valid bytes: any left is no bool
        raise WireError("bad_value", f"{where}: bool bytes must be 0 or 1")
    return array
