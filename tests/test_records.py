"""adapterdoc.records.frozen_record: the instance a frozen dataclass's __init__ builds, or a TypeError."""

from __future__ import annotations

import dataclasses

import pytest

from adapterdoc.records import frozen_record


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int = 0
    label: str | None = None


def test_the_same_instance_as_init() -> None:
    made = frozen_record(Point, {"x": 1, "y": 2, "label": None}, label="p")
    plain = Point(1, 2, "p")
    assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
    assert list(made.__dict__) == ["x", "y", "label"] and dataclasses.asdict(made) == dataclasses.asdict(
        plain
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.x = 3  # type: ignore[misc]


def test_a_missing_or_extra_field_is_refused() -> None:
    with pytest.raises(TypeError, match="2 fields given, it has 3"):
        frozen_record(Point, x=1, y=2)
    with pytest.raises(TypeError, match="4 fields given"):
        frozen_record(Point, x=1, y=2, label=None, z=0)


def test_classes_the_shortcut_would_build_wrongly_are_refused() -> None:
    @dataclasses.dataclass
    class Mutable:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Derived:
        x: int

        def __post_init__(self) -> None:
            object.__setattr__(self, "x", self.x * 2)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        x: int

    for cls in (Mutable, Derived, Slotted, int):
        with pytest.raises(TypeError):
            frozen_record(cls, x=1)


def test_a_maker_builds_the_instance_init_builds() -> None:
    from adapterdoc.records import frozen_maker

    make = frozen_maker(Point)
    for args, kwargs in (((1,), {}), ((1, 2), {}), ((1, 2, "p"), {}), ((1,), {"label": "q"}), ((), {"x": 5})):
        made, plain = make(*args, **kwargs), Point(*args, **kwargs)
        assert type(made) is Point and vars(made) == vars(plain) and list(vars(made)) == ["x", "y", "label"]
        assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        make(1).x = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        make()  # x has no default, as Point(): the maker's parameters are the fields'
    with pytest.raises(TypeError):
        make(1, 2, "p", 4)


def test_a_maker_refuses_what_it_would_build_wrongly() -> None:
    from adapterdoc.records import frozen_maker

    @dataclasses.dataclass(frozen=True)
    class Factory:
        x: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class Hidden:
        x: int
        y: int = dataclasses.field(default=0, init=False)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class KeywordOnly:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Clash:
        __records_new__: int

    @dataclasses.dataclass
    class Mutable:
        x: int

    for cls in (Factory, Hidden, KeywordOnly, Clash, Mutable, int):
        with pytest.raises(TypeError):
            frozen_maker(cls)
