"""The shape of the package (docs/architecture.md): no import cycle, arrows pointing down, and
model-family facts only in ``layouts/``. Read from the source with ``ast`` (every import: top level, lazy and
``TYPE_CHECKING``), so a violation fails here instead of in review."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "adapterdoc"

LOW = ("adapterdoc.st", "adapterdoc.layouts", "adapterdoc.errors", "adapterdoc.report")
"""Packages below every command: they import no command-level module."""
COMMAND_LEVEL = (
    "adapterdoc.commands",
    "adapterdoc.cli",
    "adapterdoc.verify",
    "adapterdoc.remap",
    "adapterdoc.merge",
    "adapterdoc.inspection",
    "adapterdoc.roundtrip",
    "adapterdoc.matrix",
    "adapterdoc.smoke",
    "adapterdoc.fit",
    "adapterdoc.train",
)


def _registry_family_words() -> set[str]:
    """The family words the registry itself names: each layout's and family module's stem, each model class's, and
    each expert spelling's name hints (so a new family, or a family without a layout such as Mixtral, is guarded
    without editing this file)."""
    from adapterdoc.layouts import EXPERT_SPELLINGS, FAMILY_MODULES, LAYOUTS

    def stem(name: str) -> str:
        return re.match(r"[a-z]+?(?=\d|_|for|model|$)", name.lower()).group()

    words = {stem(n) for n in LAYOUTS} | {stem(lay.model_class) for lay in LAYOUTS.values()}
    words |= {stem(m.__name__.rpartition(".")[2]) for m in FAMILY_MODULES}
    words |= {w for sp in EXPERT_SPELLINGS for w in sp.name_hints}
    return {w for w in words if len(w) >= 4}


SEGMENT_WORDS = ("thinker", "talker", "pixtral", "gemma", "Wqkv")
"""Family words that are not a layout's or class's stem: module segments and sub-models the registry knows."""
FAMILY = re.compile(
    r"""["'][^"'\n]*\b("""
    + "|".join(sorted({f"{w}\\w*" for w in _registry_family_words()} | set(SEGMENT_WORDS)))
    + r""")\b""",
    re.IGNORECASE,
)
"""A model-family name inside a string literal (docstrings and comments aside)."""
FAMILY_HOMES = ("adapterdoc/layouts/", "adapterdoc/codes/")
"""Where family names belong: the registry, and the catalogue's explanations of each code."""


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            r = _resolve(t)
            # a package's own __init__ is not an edge from inside the package
            if r and r != name and not (name.startswith(r + ".") and MODULES[r].name == "__init__.py"):
                out.add(r)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _cycles() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for m in GRAPH:
        if m not in index:
            visit(m)
    return found


def test_the_graph_is_read():
    # the checks below mean something only if the reader sees the package's real arrows
    assert len(MODULES) > 40
    assert "adapterdoc.report.findings" in GRAPH["adapterdoc.report.base"]


def test_no_import_cycle():
    assert _cycles() == []


@pytest.mark.parametrize("low", LOW)
def test_low_layers_import_no_command(low):
    bad = {
        m: sorted(t for t in targets if t.startswith(COMMAND_LEVEL))
        for m, targets in GRAPH.items()
        if m == low or m.startswith(low + ".")
    }
    assert {m: t for m, t in bad.items() if t} == {}


def test_every_module_has_a_layer():
    from adapterdoc.layers import layer_of

    assert sorted(m for m in MODULES if layer_of(m) is None) == []


def test_arrows_point_down_the_written_layer_order():
    # adapterdoc/layers.py is the order; docs/architecture.md draws it; here every import is held to it
    from adapterdoc.layers import LAYERS, layer_of

    climbs = sorted(
        f"{m} ({LAYERS[layer_of(m)][0]}) -> {t} ({LAYERS[layer_of(t)][0]})"
        for m, ts in GRAPH.items()
        for t in ts
        if layer_of(m) is not None and layer_of(t) is not None and layer_of(t) < layer_of(m)
    )
    assert climbs == []


def test_nothing_is_named_like_a_standard_library_module():
    # `adapterdoc/inspect.py` beside a script shadows the standard library's inspect for that script
    import sys

    clash = sorted(
        m for m in MODULES if m.rpartition(".")[2] in sys.stdlib_module_names and m != "adapterdoc"
    )
    assert clash == []


def test_engines_import_neither_verify_nor_remap():
    # engines/ is the seam both commands read (verify's rules, remap --for's needs): it sits below them
    bad = {
        m: sorted(
            t for t in ts if t.startswith(("adapterdoc.verify", "adapterdoc.remap", "adapterdoc.commands"))
        )
        for m, ts in GRAPH.items()
        if m == "adapterdoc.engines" or m.startswith("adapterdoc.engines.")
    }
    assert "adapterdoc.engines.vllm" in bad
    assert {m: t for m, t in bad.items() if t} == {}


def test_engine_names_are_listed_once():
    # adding an engine is one module plus its name in engines.NAMES: no other module spells the list of engines
    from adapterdoc import engines

    names = set(engines.NAMES)
    where = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel in ("adapterdoc/engines/__init__.py",):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                items = {
                    e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
                if len(items & names) >= 3:
                    where.append(f"{rel}:{node.lineno}")
    assert where == []
    for name in engines.NAMES:
        assert engines.get_profile(name).name == name


def test_the_training_core_runs_no_doctor():
    # train/ is settings, models, objectives, the loop and its records: the doctor's orchestrators (train-smoke,
    # train + verify) sit above it, in smoke/ and fit/
    core = "adapterdoc.train"
    above = tuple(c for c in COMMAND_LEVEL if c != core)
    bad = {m: sorted(t for t in ts if t.startswith(above)) for m, ts in GRAPH.items() if m.startswith(core)}
    assert {m: t for m, t in bad.items() if t} == {}


def _string_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        # a bare string statement is a docstring (of the module, class or function, or of the attribute above it)
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                docstrings.add(id(stmt.value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append((node.lineno, node.value))
    return out


def test_the_family_words_come_from_the_registry():
    words = _registry_family_words()
    assert {"qwen", "mistral", "ministral", "modernbert", "embeddinggemma", "mixtral"} <= words


def test_key_fragments_of_families_live_in_layouts():
    # a bare key fragment or regex naming a VL class's text model (`.language_model.`, `language_model\\?\\.`) is
    # registry knowledge (layouts.VL_INFIX, layouts.strip_infix_in_regex); prose that mentions it is not
    where = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel.startswith(FAMILY_HOMES):
            continue
        for line, text in _string_literals(path):
            if "language_model" in text and not re.search(r"\s", text):
                where.append(f"{rel}:{line}: {text[:60]!r}")
    assert where == []


def test_family_names_live_in_layouts():
    where = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel.startswith(FAMILY_HOMES):
            continue
        for line, text in _string_literals(path):
            if FAMILY.search(repr(text)):
                where.append(f"{rel}:{line}: {text[:60]!r}")
    assert where == []
