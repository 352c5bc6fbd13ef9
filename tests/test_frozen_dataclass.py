"""adapterdoc.records.frozen_dataclass: the class ``@dataclass(frozen=True)`` makes, with ``__repr__``, ``__eq__``
and ``__hash__`` written when first looked up. Each class below is defined twice, once with each decorator, and
every observable of the two is compared: fields, parameters, signature, instances' repr/eq/hash, frozenness,
replace, inheritance, and the bytecode of the generated methods."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from adapterdoc.records import _Placeholder, frozen_dataclass

Decorate = Callable[..., Any]
PLAIN: Decorate = dataclasses.dataclass


def _lazy(**params: Any) -> Decorate:
    assert params.pop("frozen") is True
    return frozen_dataclass(**params) if params else frozen_dataclass


def _classes(make: Decorate) -> dict[str, type]:
    """The same class bodies under ``make`` (``dataclass`` or the lazy decorator), by name."""

    @make(frozen=True)
    class Point:
        """A point."""

        x: int
        y: int = 0
        label: str | None = None

    @make(frozen=True)
    class Flags:
        """Field flags: hidden from repr, left out of ==, hashed though not compared."""

        shown: int
        hidden: str = dataclasses.field(default="h", repr=False)
        ignored: tuple[int, ...] = dataclasses.field(default=(), compare=False)
        hashed: int = dataclasses.field(default=0, compare=False, hash=True)
        unhashed: int = dataclasses.field(default=0, hash=False)
        made: list[int] = dataclasses.field(default_factory=list, compare=False, hash=False)
        later: int = dataclasses.field(default=7, init=False)
        counter: ClassVar[int] = 3

    @make(frozen=True, kw_only=True)
    class Keywords:
        """Keyword-only fields."""

        a: int
        b: str = "b"

    @make(frozen=True)
    class Empty:
        """No fields at all."""

    @make(frozen=True)
    class Base:
        """A base with a field."""

        name: str
        size: int = 1

    @make(frozen=True)
    class Child(Base):
        """A child adding fields and overriding a default."""

        size: int = 2
        extra: float = 0.5

    @make(frozen=True)
    class Posted:
        """A __post_init__ that sets a derived field through object.__setattr__."""

        n: int
        twice: int = dataclasses.field(init=False, default=0)

        def __post_init__(self) -> None:
            object.__setattr__(self, "twice", 2 * self.n)

    @make(frozen=True)
    class OwnRepr:
        """A class writing its own __repr__ (kept by both)."""

        v: int

        def __repr__(self) -> str:
            return f"<{self.v}>"

    class Plain:  # not a dataclass: subclassing one of ours without the decorator
        pass

    @make(frozen=True)
    class Nested:
        """Fields holding other records (repr and hash recurse)."""

        inner: Point
        items: tuple[Point, ...] = ()

    return {c.__name__: c for c in (Point, Flags, Keywords, Empty, Base, Child, Posted, OwnRepr, Nested)} | {
        "Plain": Plain
    }


def _samples(classes: dict[str, type]) -> dict[str, list[object]]:
    c = classes
    p = c["Point"]
    return {
        "Point": [p(1), p(1, 2), p(1, 2, "q"), p(x=1, y=2, label="q"), p(0, 0, None)],
        "Flags": [c["Flags"](1), c["Flags"](1, "x", (1,), 5, 9, [3]), c["Flags"](2, "h", (), 5)],
        "Keywords": [c["Keywords"](a=1), c["Keywords"](a=1, b="c"), c["Keywords"](b="b", a=1)],
        "Empty": [c["Empty"](), c["Empty"]()],
        "Base": [c["Base"]("n"), c["Base"]("n", 2)],
        "Child": [c["Child"]("n"), c["Child"]("n", 1), c["Child"]("n", 2, 0.25)],
        "Posted": [c["Posted"](3), c["Posted"](4)],
        "OwnRepr": [c["OwnRepr"](1), c["OwnRepr"](2)],
        "Nested": [c["Nested"](p(1)), c["Nested"](p(1), (p(2), p(3, 4)))],
    }


def _observe(classes: dict[str, type]) -> dict[str, object]:
    """Everything a user can see of the classes and their instances (class objects left out by name)."""
    seen: dict[str, object] = {}
    for name, cls in classes.items():
        if name == "Plain":
            continue
        seen[name] = {
            "fields": [
                (f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.hash, f.compare, f.kw_only)
                for f in dataclasses.fields(cls)
            ],
            "params": repr(cls.__dataclass_params__),  # type: ignore[attr-defined]
            "match_args": cls.__match_args__,  # type: ignore[attr-defined]
            "signature": str(inspect.signature(cls)),
            "doc": cls.__doc__,
            "hash is None": cls.__hash__ is None,
        }
    for name, objs in _samples(classes).items():
        seen[f"{name} instances"] = [
            (repr(a), hash(a), dataclasses.asdict(a), [a == b for b in objs], [a != b for b in objs])
            for a in objs
        ]
        first = objs[0]
        fields = dataclasses.fields(first)  # type: ignore[arg-type]
        if fields:
            with pytest.raises(dataclasses.FrozenInstanceError) as raised:
                setattr(first, fields[0].name, 1)
            seen[f"{name} set"] = str(raised.value)
            with pytest.raises(dataclasses.FrozenInstanceError) as raised:
                delattr(first, fields[0].name)
            seen[f"{name} del"] = str(raised.value)
        with pytest.raises(dataclasses.FrozenInstanceError):
            first.not_a_field = 1  # type: ignore[attr-defined]
        seen[f"{name} replace"] = repr(dataclasses.replace(first))
        assert dataclasses.replace(first) == first
        assert first.__eq__(object()) is NotImplemented
    return seen


def test_every_observable_matches_the_plain_decorator() -> None:
    plain, lazy = _classes(PLAIN), _classes(_lazy)
    assert _observe(lazy) == _observe(plain)


def test_a_subclass_that_is_no_dataclass_inherits_the_same_methods() -> None:
    for make in (PLAIN, _lazy):
        classes = _classes(make)

        class Sub(classes["Point"]):  # type: ignore[misc,valid-type]
            pass

        a, b = Sub(1, 2), Sub(1, 2)
        assert (repr(a), a == b, hash(a) == hash(b)) == (
            f"{Sub.__qualname__}(x=1, y=2, label=None)",
            True,
            True,
        )
        assert a != classes["Point"](1, 2)  # another class: never equal


def test_plain_and_lazy_dataclasses_mix_in_inheritance() -> None:
    lazy_base = _classes(_lazy)["Base"]

    @dataclasses.dataclass(frozen=True)
    class PlainChild(lazy_base):  # type: ignore[misc,valid-type]
        more: int = 0

    plain_base = _classes(PLAIN)["Base"]

    @frozen_dataclass
    class LazyChild(plain_base):  # type: ignore[misc,valid-type]
        """Lazy on a plain base."""

        more: int = 0

    for cls in (PlainChild, LazyChild):
        x = cls("n", 3, 4)
        assert repr(x) == f"{cls.__qualname__}(name='n', size=3, more=4)"
        assert x == cls("n", 3, 4) and x != cls("n", 3, 5) and hash(x) == hash(cls("n", 3, 4))
    with pytest.raises(TypeError, match="non-frozen"):

        @dataclasses.dataclass
        class Thawed(lazy_base):  # type: ignore[misc,valid-type]
            pass


def test_the_generated_methods_are_the_plain_decorator_s_bytecode() -> None:
    plain, lazy = _classes(PLAIN), _classes(_lazy)
    for name in ("Point", "Flags", "Keywords", "Empty", "Child", "Nested"):
        for method in ("__repr__", "__eq__", "__hash__", "__init__"):
            p, q = getattr(plain[name], method), getattr(lazy[name], method)
            p, q = getattr(p, "__wrapped__", p), getattr(q, "__wrapped__", q)  # __repr__: the recursion guard
            assert (q.__qualname__, q.__code__.co_code, q.__code__.co_consts, q.__code__.co_names) == (
                p.__qualname__,
                p.__code__.co_code,
                p.__code__.co_consts,
                p.__code__.co_names,
            ), (name, method)
            assert q.__globals__ is p.__globals__  # the defining module's namespace, as for the plain class


def _attr_outcomes(obj: object, names: list[str]) -> list[tuple[str, str, str]]:
    """What setting and deleting each name does to ``obj``: the exception (type and message) or ``ok``."""
    out = []
    for name in names:
        for what, act in (
            ("set", lambda n=name: setattr(obj, n, 5)),
            ("del", lambda n=name: delattr(obj, n)),
        ):
            try:
                act()
                outcome = "ok"
            except Exception as e:  # compared as text
                outcome = f"{type(e).__name__}: {e}"
            out.append((name, what, outcome))
    return out


def test_the_frozen_setattr_and_delattr_behave_as_the_plain_decorator_s() -> None:
    """On Python 3.10-3.12 the lazy decorator gives each class the frozen ``__setattr__``/``__delattr__`` as
    closures rather than compiled from source: the same outcome for a field and for another name, on the class
    and on a subclass that is no dataclass (which may set its own attributes), with the same names."""
    plain, lazy = _classes(PLAIN), _classes(_lazy)
    seen: dict[str, list[object]] = {"plain": [], "lazy": []}
    for label, classes in (("plain", plain), ("lazy", lazy)):
        for name, objs in _samples(classes).items():
            cls = classes[name]
            names = [f.name for f in dataclasses.fields(cls)] + ["other"]

            class Sub(cls):  # type: ignore[misc,valid-type]
                pass

            fields = {f.name: getattr(objs[0], f.name) for f in dataclasses.fields(cls) if f.init}
            sub = Sub(**fields)
            for method in ("__setattr__", "__delattr__"):
                f = cls.__dict__[method]
                seen[label].append(
                    (name, method, f.__name__, f.__qualname__, f.__module__, str(inspect.signature(f)))
                )
            seen[label].append((name, _attr_outcomes(objs[0], names), _attr_outcomes(sub, names)))
    assert seen["lazy"] == seen["plain"]
    compiled = lazy["Point"].__setattr__.__code__.co_filename == "<string>"
    assert compiled == (sys.version_info >= (3, 13))  # 3.13 compiles all of a class's methods in one batch


def test_the_three_methods_wait_until_first_looked_up() -> None:
    @frozen_dataclass
    class Late:
        """Late."""

        x: int

    assert all(isinstance(Late.__dict__[m], _Placeholder) for m in ("__repr__", "__eq__", "__hash__"))
    a = Late(1)
    assert isinstance(Late.__dict__["__eq__"], _Placeholder)  # building an instance needs none of them
    assert {a: 1}[Late(1)] == 1  # hash, then eq
    assert not any(isinstance(Late.__dict__[m], _Placeholder) for m in ("__repr__", "__eq__", "__hash__"))
    assert repr(a) == "test_the_three_methods_wait_until_first_looked_up.<locals>.Late(x=1)"


def test_a_class_writing_one_of_the_methods_gets_the_plain_decorator() -> None:
    @frozen_dataclass
    class Hashes:
        """Own hash."""

        x: int

        def __hash__(self) -> int:
            return 7

    assert hash(Hashes(1)) == 7 and not isinstance(Hashes.__dict__["__eq__"], _Placeholder)
    assert Hashes(1) == Hashes(1) and repr(Hashes(1)).endswith("Hashes(x=1)")


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_other_pythons_agree(version: str) -> None:
    """The comparison above under each other CPython this machine has (the package supports 3.10 and newer; the
    decorator leans on dataclass writing methods that read ``self.__class__``, which each version is checked for)."""
    exe = f"/root/.pyenv/versions/{_full(version)}/bin/python{version}"
    if not os.path.exists(exe):
        pytest.skip(f"no Python {version} here")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import sys, importlib.util as u\n"
        "spec = u.spec_from_file_location('records', sys.argv[1] + '/adapterdoc/records.py')\n"
        "m = u.module_from_spec(spec); sys.modules['records'] = m; spec.loader.exec_module(m)\n"
        "spec = u.spec_from_file_location('t', sys.argv[1] + '/tests/test_frozen_dataclass.py')\n"
        "src = open(spec.origin).read().replace('from adapterdoc.records import', 'from records import')\n"
        "src = src.replace('import pytest\\n', 'import _pytest_stub as pytest\\n')\n"
        "import types, contextlib\n"
        "stub = types.ModuleType('_pytest_stub')\n"
        "class _Raised:\n"
        "    value = None\n"
        "@contextlib.contextmanager\n"
        "def raises(kind, match=None):\n"
        "    r = _Raised()\n"
        "    try:\n"
        "        yield r\n"
        "    except kind as e:\n"
        "        r.value = e\n"
        "    else:\n"
        "        raise AssertionError('did not raise')\n"
        "stub.raises = raises\n"
        "stub.mark = types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))\n"
        "sys.modules['_pytest_stub'] = stub\n"
        "mod = types.ModuleType('t'); sys.modules['t'] = mod; ns = mod.__dict__\n"
        "exec(compile(src, spec.origin, 'exec'), ns)\n"
        "skip = ('test_other_pythons_agree', 'test_the_start_path_s_frozen_classes_are_lazy',\n"
        "        'test_every_dataclass_in_the_package_has_a_docstring_and_frozen_ones_the_lazy_decorator')\n"
        "for name in [n for n in ns if n.startswith('test_') and n not in skip]:\n"
        "    ns[name]()\n"
        "print('ok', sys.version_info[:2])\n"
    )
    out = subprocess.run([exe, "-c", code, root], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok")


def _full(version: str) -> str:
    base = "/root/.pyenv/versions"
    found = sorted(v for v in os.listdir(base) if v.startswith(version + ".")) if os.path.isdir(base) else []
    return found[-1] if found else version


def test_the_start_path_s_frozen_classes_are_lazy() -> None:
    """The point of the decorator: ``inspect``'s imports write no ``__repr__``/``__eq__``/``__hash__`` of a frozen
    class (each costs a compile; methods a class body writes itself are kept). Fails when a start-path module goes
    back to ``@dataclass(frozen=True)``."""
    code = (
        "import dataclasses, sys\n"
        "import adapterdoc.cli, adapterdoc.inspection, adapterdoc.codes, adapterdoc.formats.hooks\n"
        "plain = []\n"
        "for name, mod in list(sys.modules.items()):\n"
        "    if not name.startswith('adapterdoc'):\n"
        "        continue\n"
        "    for obj in vars(mod).values():\n"
        "        if isinstance(obj, type) and obj.__module__ == name and dataclasses.is_dataclass(obj)\\\n"
        "                and obj.__dataclass_params__.frozen:\n"
        "            for m in ('__repr__', '__eq__', '__hash__'):\n"
        "                f = getattr(obj.__dict__.get(m), '__wrapped__', obj.__dict__.get(m))\n"
        "                if getattr(getattr(f, '__code__', None), 'co_filename', '') == '<string>':\n"
        "                    plain.append(f'{obj.__qualname__}.{m}')  # written at import by dataclass\n"
        "print(sorted(plain))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    # registry.register_experts compares each spelling it registers (`e not in EXPERT_SPELLINGS`): written at import
    assert out.stdout.strip() == "['Experts.__eq__', 'Experts.__hash__', 'Experts.__repr__']"


def test_every_dataclass_in_the_package_has_a_docstring_and_frozen_ones_the_lazy_decorator() -> None:
    """``dataclass`` gives a class without a docstring one built from ``inspect.signature`` (its first call in a
    process compiles tokenize's regular expressions: 4 ms); a frozen class made by ``@dataclass(frozen=True)``
    compiles its three comparison and repr methods at import. Read from the package's source."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "adapterdoc"
    undocumented, plain_frozen = [], []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            for d in node.decorator_list:
                func = d.func if isinstance(d, ast.Call) else d
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name not in ("dataclass", "frozen_dataclass"):
                    continue
                where = f"{path.relative_to(root)}:{node.name}"
                if ast.get_docstring(node) is None:
                    undocumented.append(where)
                frozen = isinstance(d, ast.Call) and any(
                    k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in d.keywords
                )
                if name == "dataclass" and frozen and path != root / "records.py":
                    plain_frozen.append(where)
    assert (undocumented, plain_frozen) == ([], [])


def test_dataclasses_is_left_as_it_was_even_when_the_decorator_fails() -> None:
    """The frozen methods' writer is swapped only while ``dataclass`` runs: afterwards, and after a class it
    refuses (a field without a default after one with), ``dataclass(frozen=True)`` writes its own again."""
    before = getattr(dataclasses, "_frozen_get_del_attr", None)

    @frozen_dataclass
    class Fine:
        """Fine."""

        x: int

    with pytest.raises(TypeError):

        @frozen_dataclass
        class Refused:
            """Refused."""

            x: int = 0
            y: int  # type: ignore[misc]

    assert getattr(dataclasses, "_frozen_get_del_attr", None) is before

    @dataclasses.dataclass(frozen=True)
    class Plain:
        x: int

    assert Plain.__setattr__.__code__.co_filename == "<string>"  # compiled by dataclass, as ever
    assert Fine(1).x == 1
