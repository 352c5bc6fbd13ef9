"""Print ``adapterdoc/layouts/mlx_models.py``: which ``config.model_type``s mlx-lm has a model for, read from the
installed mlx-lm's own package: the modules ``mlx_lm/models/*.py`` that define ``Model`` and ``ModelArgs`` (what
``mlx_lm.utils._get_classes`` imports), ``MODEL_REMAPPING`` and ``MODEL_ARCHITECTURE_REMAPPING`` of
``mlx_lm/utils.py``, and the top-level attributes of each ``Model`` (the first segment of its parameter
paths). Read as source (``ast``), nothing imported, so any Python with mlx-lm's
files installed runs it::

    /opt/adapterdoc-oracles/mlx/bin/python scripts/mlx_models.py > adapterdoc/layouts/mlx_models.py

``tests/formats/test_mlx_names_oracle.py`` keeps the file equal to the installed mlx-lm's."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path


def package() -> Path:
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or spec.origin is None:
        raise SystemExit("mlx-lm is not installed in this Python (use the mlx oracle environment)")
    return Path(spec.origin).parent


def models(root: Path) -> dict[str, tuple[str, ...] | None]:
    """The mlx-lm model modules (``mlx_lm/models/*.py`` defining ``Model`` and ``ModelArgs`` at top level), each
    with the attributes its ``Model.__init__`` sets to a module (``self.model = LlamaModel(args)``): the first
    segment of every parameter path mlx-lm's model has. ``None`` where ``Model`` has no ``__init__`` of its own
    (it inherits one) or sets none (it builds them another way)."""
    out: dict[str, tuple[str, ...] | None] = {}
    for f in sorted((root / "models").glob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        if "Model" in classes and "ModelArgs" in classes:
            out[f.stem] = _top(classes["Model"])
    return out


def _top(model: ast.ClassDef) -> tuple[str, ...] | None:
    init = next((n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return None
    names: set[str] = set()
    for node in ast.walk(init):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            value = node.value  # type: ignore[union-attr]
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and isinstance(value, (ast.Call, ast.ListComp, ast.List))
            ):
                names.add(t.attr)
    return tuple(sorted(names)) or None


def remapping(root: Path) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """``MODEL_REMAPPING`` and ``MODEL_ARCHITECTURE_REMAPPING`` of ``mlx_lm/utils.py``."""
    found: dict[str, object] = {}
    for node in ast.parse((root / "utils.py").read_text(encoding="utf-8")).body:
        names = (
            [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
        )
        if names and names[0] in ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING"):
            found[names[0]] = ast.literal_eval(node.value)  # type: ignore[union-attr]
    return found.get("MODEL_REMAPPING", {}), found.get("MODEL_ARCHITECTURE_REMAPPING", {})  # type: ignore[return-value]


def q(text: str) -> str:
    return json.dumps(text)


def _tuple(names: tuple[str, ...] | None) -> str:
    if names is None:
        return "None"
    inner = ", ".join(q(n) for n in names)
    return f"({inner},)" if len(names) == 1 else f"({inner})"


def render() -> str:
    root = package()
    version = importlib.metadata.version("mlx-lm")
    tops = models(root)
    remap, arch = remapping(root)
    lines = [
        f'"""The model types mlx-lm {version} has a model for, generated from its package by scripts/mlx_models.py',
        "(``/opt/adapterdoc-oracles/mlx/bin/python scripts/mlx_models.py > adapterdoc/layouts/mlx_models.py``; do",
        "not edit by hand): ``MLX_MODELS``, the modules ``mlx_lm/models/*.py`` that define ``Model`` and",
        "``ModelArgs`` (what ``mlx_lm.utils._get_classes`` imports for a model type), each with the attributes",
        "its ``Model.__init__`` sets to a module or list (the first segment of its parameter paths; ``None``: an",
        "inherited ``__init__``); ``MLX_REMAPPING`` and",
        "``MLX_ARCHITECTURE_REMAPPING``, ``mlx_lm/utils.py``'s",
        "``MODEL_REMAPPING`` and ``MODEL_ARCHITECTURE_REMAPPING``. Read through",
        ':func:`adapterdoc.layouts.mlx_prefixes.mlx_model`; pinned by tests/formats/test_mlx_names_oracle.py."""',
        "",
        "from __future__ import annotations",
        "",
        f"MLX_LM_VERSION = {q(version)}",
        "",
        "# fmt: off",
        "MLX_MODELS: dict[str, tuple[str, ...] | None] = {",
        *(f"    {q(k)}: {_tuple(v)}," for k, v in sorted(tops.items())),
        "}",
        "",
        "MLX_REMAPPING: dict[str, str] = {",
        *(f"    {q(k)}: {q(v)}," for k, v in sorted(remap.items())),
        "}",
        "",
        "MLX_ARCHITECTURE_REMAPPING: dict[tuple[str, str], str] = {",
        *(f"    ({q(k[0])}, {q(k[1])}): {q(v)}," for k, v in sorted(arch.items())),
        "}",
        "# fmt: on",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
