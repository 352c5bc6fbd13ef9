"""Frozen dataclass instances built on a hot path (tens of thousands per command) without the frozen ``__init__``.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; :func:`frozen_record` writes the
instance's ``__dict__`` in one update instead (about 3× faster), which gives the same instance (fields, their
order, ``repr``, ``==``, ``hash``, ``asdict``, still frozen) for exactly the classes it accepts: frozen dataclasses
with no ``__post_init__`` and no slots, every field given."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

T = TypeVar("T")

_new = object.__new__
_NOTHING: Mapping[str, object] = MappingProxyType({})
_FIELDS: dict[type, int] = {}
"""Each class :func:`frozen_record` has accepted, and its number of fields."""


def frozen_record(cls: type[T], common: Mapping[str, object] = _NOTHING, /, **values: object) -> T:
    """``cls(**common, **values)`` (``values`` win), built by writing the instance's ``__dict__``. Fields go in
    field order (``common`` first, in its order; a key of ``values`` already in ``common`` keeps its place), so
    every field must be given in that order. Raises :class:`TypeError` for a class the shortcut would build
    wrongly or a field missing or extra."""
    want = _FIELDS.get(cls)
    if want is None:
        want = _FIELDS[cls] = _accepted(cls)
    obj = _new(cls)
    d = obj.__dict__
    d.update(common, **values)
    if len(d) != want:
        raise TypeError(f"{cls.__name__}: {len(d)} fields given, it has {want}")
    return obj


def _accepted(cls: type) -> int:
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"{cls.__name__} is not a frozen dataclass")
    if hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__} has a __post_init__ or slots: build it with its __init__")
    return len(dataclasses.fields(cls))
