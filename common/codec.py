"""How the wire's message dataclasses become msgpack values and back, and what a frame may hold.

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
from typing import Any, Union

import numpy as np

from rlmq.common.schema import MAX_OBS_DIMS

MAX_FRAME_BYTES = 64 * 1024 * 1024
MAX_STR_CHARS = 4096
MAX_SEQUENCE = 4096
MAX_ARRAY_DIMS = MAX_OBS_DIMS + 2  # a rollout's observations: time and slot, then the observation's
ALLOWED_DTYPES = frozenset({"float32", "float64", "int64", "int32", "uint8", "bool"})
INT64_RANGE = (-(2**63), 2**63 - 1)  # what an int field may hold


class WireError(ValueError):
    """A frame that is not a valid rlmq message. Services count it, drop it and carry on."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason  # a short label, used as the `reason` of the rejected-messages metric


@functools.cache
def dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, remembered: NumPy builds the string on every call (~1.7 µs here; a rollout's
    seven arrays are named when it is built and when it is encoded). Few dtypes ever reach it:
    decoded arrays come only in ALLOWED_DTYPES."""
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
    values = dict(given or {})
    for name, hint, required in fields:
        if name in values:
            continue
        if name in raw:
            values[name] = _unpack(hint, raw[name], f"{where}.{name}")
        elif required:
            raise WireError("missing_field", f"{where}.{name}")
    try:
        return cls(**values)
    except WireError:
        raise
    except (TypeError, ValueError) as exc:
        raise WireError("bad_value", f"{where}: {exc}") from exc


@functools.cache
def _decoding_plan(cls: type) -> tuple[tuple[tuple[str, Any, bool], ...], frozenset[str]]:
    """A dataclass's fields as decode walks them: (name, type hint, required), and all names."""
    hints = typing.get_type_hints(cls)
    fields = tuple(
        (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    )
    return fields, frozenset(hints)


def _unpack(hint: Any, raw: Any, where: str) -> Any:
    if hint in _SCALARS:
        return _unpack_scalar(hint, raw, where)
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if raw is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return _unpack(inner, raw, where)
    if hint is np.ndarray:
        return unpack_array(raw, where)
    if dataclasses.is_dataclass(hint):
        return unpack_dataclass(hint, raw, where)  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(raw, list) or len(raw) > MAX_SEQUENCE:
            raise WireError("bad_type", f"{where} must be a list")
        (item,) = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return tuple(_unpack(item, v, f"{where}[]") for v in raw)
    if origin is dict:
        if not isinstance(raw, dict):
            raise WireError("bad_type", f"{where} must be a map")
        _, value_hint = typing.get_args(hint)
        return {_unpack(str, k, where): _unpack(value_hint, v, f"{where}.{k}") for k, v in raw.items()}
    return _unpack_scalar(hint, raw, where)


_SCALARS = frozenset({bool, int, float, str})


def _unpack_scalar(hint: Any, raw: Any, where: str) -> Any:
    if hint is bool:
        if not isinstance(raw, bool):
            raise WireError("bad_type", f"{where} must be a bool")
        return raw
    if hint is int:
        if not isinstance(raw, int) or isinstance(raw, bool) or not INT64_RANGE[0] <= raw <= INT64_RANGE[1]:
            raise WireError("bad_type", f"{where} must be an int64")
        return raw
    if hint is float:
        if not isinstance(raw, (int, float)) or isinstance(raw, bool):
            raise WireError("bad_type", f"{where} must be a number")
        if not math.isfinite(raw):
            raise WireError("non_finite", where)
        return float(raw)
    if hint is str:
        if not isinstance(raw, str) or len(raw) > MAX_STR_CHARS:
            raise WireError("bad_type", f"{where} must be a string of at most {MAX_STR_CHARS}")
        return raw
    raise TypeError(f"wire cannot carry {hint!r} ({where})")  # a bug in a declaration, not input


def unpack_array(raw: Any, where: str) -> np.ndarray:
    """An array from [dtype, shape, bytes], checked; a read-only view of the bytes."""
    if not (isinstance(raw, list) and len(raw) == 3):
        raise WireError("bad_type", f"{where} must be [dtype, shape, bytes]")
    dtype_name, shape, data = raw
    if not isinstance(dtype_name, str) or dtype_name not in ALLOWED_DTYPES:  # a list is unhashable
        raise WireError("bad_dtype", f"{where}: {dtype_name!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_ARRAY_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape)
    ):
        raise WireError("bad_shape", f"{where}: {shape!r}")
    if not isinstance(data, bytes):
        raise WireError("bad_type", f"{where}: data must be bytes")
    dtype = np.dtype(dtype_name)
    if math.prod(shape) * dtype.itemsize != len(data):
        raise WireError("bad_shape", f"{where}: shape {shape} × {dtype.itemsize} B ≠ {len(data)} B")
    try:  # a size-0 array can still name dims numpy refuses, e.g. [0, 2**63]
        array = np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as exc:
        raise WireError("bad_shape", f"{where}: {shape!r} ({exc})") from exc
    if dtype.kind == "f" and not np.isfinite(array).all():
        raise WireError("non_finite", where)
    if dtype == np.bool_ and array.view(np.uint8).max(initial=0) > 1:
        raise WireError("bad_value", f"{where}: bool bytes must be 0 or 1")
    return array
