"""One scan of the package's source for writes to a report's fields (issue 28: a report is built once, at the end
of its run), shared by each package's built-once test."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path

MUTATORS = frozenset({"append", "extend", "update", "insert", "setdefault", "clear", "pop", "remove"})
"""The in-place calls that change a field's list or dict (``x.findings.append(...)``)."""


def attribute_writes(paths: Iterable[Path], hit: Callable[[ast.Attribute], bool]) -> list[str]:
    """``file:line: target`` for every write to an attribute ``hit`` accepts: plain, augmented, annotated and tuple
    assignments, ``x.field[key] = ...``, and the in-place calls of :data:`MUTATORS` on it."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
            ):
                targets = [node.func.value]
            for t in targets:
                for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                    el = el.value if isinstance(el, ast.Subscript) else el
                    if isinstance(el, ast.Attribute) and hit(el):
                        out.append(f"{path.name}:{el.lineno}: {ast.unparse(el)}")
    return out
