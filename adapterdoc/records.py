"""Frozen dataclass instances built on a hot path (tens of thousands per command) without the frozen ``__init__``.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; :func:`frozen_record` writes the
instance's ``__dict__`` in one update instead (about 3× faster), which gives the same instance (fields, their
order, ``repr``, ``==``, ``hash``, ``asdict``, still frozen) for exactly the classes it accepts: frozen dataclasses
with no ``__post_init__`` and no slots, every field given. :func:`frozen_maker` is the same build for one class
as a function of its fields, checked once when it is made (another 2.7× faster than :func:`frozen_record`: no
keyword packing, no per-call check).

:func:`frozen_dataclass` is ``@dataclass(frozen=True)`` with ``__repr__``, ``__eq__`` and ``__hash__`` made the
first time one is looked up (a command that starts by importing thirty result classes uses the methods of a few),
and, on Python 3.10-3.12, the frozen ``__setattr__`` and ``__delattr__`` as closures instead of compiled source."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar, overload

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


def frozen_maker(cls: type[T], /) -> Callable[..., T]:
    """A function ``make(field1, field2, ...)`` with ``cls``'s fields as its parameters, in field order and with
    the defaults ``cls`` declares, returning ``cls(field1, field2, ...)`` built by writing the instance's
    ``__dict__`` (as :func:`frozen_record` does). The checks run once, here: ``cls`` is a frozen dataclass with no
    ``__post_init__``, no slots, and no field that is keyword-only, outside ``__init__`` or made by a
    ``default_factory`` (each raises :class:`TypeError`)."""
    _accepted(cls)
    names: list[str] = []
    params: list[str] = []
    env: dict[str, object] = {"__records_new__": _new, "__records_cls__": cls}
    for f in dataclasses.fields(cls):
        if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a maker takes plain positional fields only")
        if f.name.startswith("__records_"):
            raise TypeError(f"{cls.__name__}.{f.name}: a name the maker uses itself")
        names.append(f.name)
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            env[f"__records_default_{f.name}__"] = f.default
            params.append(f"{f.name}=__records_default_{f.name}__")
    writes = ", ".join(f"{n}={n}" for n in names)
    src = (
        f"def make({', '.join(params)}):\n"
        f"    __records_obj__ = __records_new__(__records_cls__)\n"
        f"    __records_obj__.__dict__.update({writes})\n"
        f"    return __records_obj__\n"
    )
    exec(src, env)  # field names are identifiers (dataclasses checked them); the rest are the dunders above
    make = env["make"]
    make.__qualname__ = make.__name__ = f"make_{cls.__name__}"  # type: ignore[attr-defined]
    make.__doc__ = (
        f"``{cls.__name__}(...)`` built by writing its ``__dict__`` (adapterdoc.records.frozen_maker)."
    )
    return make  # type: ignore[return-value]


_LAZY = ("__repr__", "__eq__", "__hash__")
_OWN = ("__init__", "__setattr__", "__delattr__", "__slots__", *_LAZY)
"""A class body defining any of these gets the plain decorator (``dataclass`` keeps what a class writes itself)."""


@overload
def frozen_dataclass(cls: type[T], /) -> type[T]: ...
@overload
def frozen_dataclass(*, kw_only: bool = False) -> Callable[[type[T]], type[T]]: ...
def frozen_dataclass(cls: Any = None, /, *, kw_only: bool = False) -> Any:
    """``@dataclass(frozen=True)`` (or ``(frozen=True, kw_only=True)``), the same class, with the generated
    ``__repr__``, ``__eq__`` and ``__hash__`` made when one is first looked up instead of at import.

    ``dataclass`` writes each method as source and compiles it: six per frozen class, 0.15-0.25 ms each here,
    20-30 ms for the classes ``inspect`` imports, of which a run calls ``__repr__``, ``__eq__`` or ``__hash__``
    on few. The class is processed with ``repr=False, eq=False`` (``__init__``, the frozen ``__setattr__`` and
    ``__delattr__`` as ever), its ``__dataclass_params__`` then say ``repr=True, eq=True`` as for the plain
    decorator, and the three methods are placeholders until first looked up, when ``dataclass`` itself writes them
    for a twin with the same fields (names and ``repr``/``compare``/``hash`` flags, in order) and they replace
    the placeholders. None of the three refers to its class (each reads ``self.__class__``), so the twin's are
    the methods the plain decorator writes. On Python 3.10-3.12 the frozen ``__setattr__`` and ``__delattr__``
    (two more compiles per class, 4 ms at ``inspect``'s start) are :func:`_frozen_attr_methods`' closures, put in
    place of ``dataclasses._frozen_get_del_attr`` while ``dataclass`` runs (found by its parameters; another
    Python's dataclasses writes its own). A class that defines any of them (or ``__init__``, ``__setattr__``,
    ``__delattr__``, ``__slots__``) itself gets the plain decorator. ``tests/test_frozen_dataclass.py`` compares both."""

    def wrap(c: type[T]) -> type[T]:
        if any(name in c.__dict__ for name in _OWN):
            return dataclasses.dataclass(frozen=True, kw_only=kw_only)(c)  # type: ignore[call-overload,no-any-return]
        if _WRITES_FROZEN_ATTRS is None:  # another Python's dataclasses: its own frozen methods
            dataclasses.dataclass(frozen=True, kw_only=kw_only, repr=False, eq=False)(c)  # type: ignore[call-overload]
        else:
            before = dataclasses._frozen_get_del_attr  # type: ignore[attr-defined]
            dataclasses._frozen_get_del_attr = _frozen_attr_methods  # type: ignore[attr-defined]
            try:
                dataclasses.dataclass(frozen=True, kw_only=kw_only, repr=False, eq=False)(c)  # type: ignore[call-overload]
            finally:  # what was there (a thread's own patch under way: the original)
                restore = _WRITES_FROZEN_ATTRS if before is _frozen_attr_methods else before
                dataclasses._frozen_get_del_attr = restore  # type: ignore[attr-defined]
        params = c.__dataclass_params__  # type: ignore[attr-defined]
        params.repr = params.eq = True
        for name in _LAZY:
            setattr(c, name, _Placeholder(c, name))
        return c

    return wrap if cls is None else wrap(cls)


def _writes_frozen_attrs() -> Callable[..., Any] | None:
    """``dataclasses._frozen_get_del_attr``, where it is the function of Python 3.10-3.12 that returns the frozen
    ``__setattr__`` and ``__delattr__`` of ``(cls, fields, globals)``, compiling each from source; else ``None``
    (Python 3.13 adds both to one batch compiled with the class's other methods)."""
    f = getattr(dataclasses, "_frozen_get_del_attr", None)
    code = getattr(f, "__code__", None)
    if code is None or code.co_varnames[: code.co_argcount] != ("cls", "fields", "globals"):
        return None
    return f  # type: ignore[no-any-return]


_WRITES_FROZEN_ATTRS = _writes_frozen_attrs()


def _frozen_attr_methods(cls: type, fields: list[dataclasses.Field[Any]], globals: object) -> tuple[Any, Any]:
    """The frozen ``__setattr__`` and ``__delattr__`` ``dataclass`` writes for ``cls`` (Python 3.10-3.12's
    ``_frozen_get_del_attr``), as closures instead of two compiles: the same test (``type(self) is cls`` or a
    field's name), the same :class:`dataclasses.FrozenInstanceError` and message, else the next class's method.
    :func:`frozen_dataclass` puts this in place of the original while it runs ``dataclass``."""
    names = tuple(f.name for f in fields)
    error = dataclasses.FrozenInstanceError

    def __setattr__(self: object, name: str, value: object) -> None:
        if type(self) is cls or name in names:
            raise error(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)  # type: ignore[misc]

    def __delattr__(self: object, name: str) -> None:
        if type(self) is cls or name in names:
            raise error(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)  # type: ignore[misc]

    for method in (__setattr__, __delattr__):
        method.__module__ = cls.__module__
        method.__annotations__ = {}  # as the generated ones: inspect.signature shows (self, name, value)
    return __setattr__, __delattr__


class _Placeholder:
    """Stands for one of a class's ``__repr__``/``__eq__``/``__hash__`` until first looked up."""

    def __init__(self, cls: type, name: str) -> None:
        self.cls = cls
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        method = _write_methods(self.cls)[self.name]
        return method if obj is None else method.__get__(obj, owner)


def _write_methods(cls: type) -> dict[str, Any]:
    """``cls``'s ``__repr__``, ``__eq__`` and ``__hash__`` as ``dataclass(frozen=True)`` writes them, set on ``cls``
    (in place of the placeholders) and returned."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    body: dict[str, Any] = {
        "__module__": cls.__module__,  # the methods' globals, as for cls
        "__qualname__": cls.__qualname__,  # their __qualname__ (the repr reads self.__class__'s)
        "__annotations__": {f.name: object for f in fields},
        "__doc__": cls.__doc__ or "",  # a class without one gets one built by inspect.signature: 4 ms cold
    }
    for f in fields:
        body[f.name] = dataclasses.field(repr=f.repr, hash=f.hash, compare=f.compare)
    # eq with unsafe_hash on a plain class writes exactly frozen eq's __hash__ (from the same fields); no __init__
    twin = dataclasses.dataclass(init=False, repr=True, eq=True, unsafe_hash=True, match_args=False)(
        type(cls.__name__, (), body)
    )
    methods = {name: twin.__dict__[name] for name in _LAZY}
    for name, method in methods.items():
        if isinstance(cls.__dict__.get(name), _Placeholder):
            setattr(cls, name, method)
    return methods
