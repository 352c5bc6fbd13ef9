"""The layer order of the package, written once: top (what a user starts) to bottom (what everything stands on).

A module may import modules of its own layer or of a layer below it, never above. ``tests/test_house.py`` reads
this list and checks every import in the package against it (top level, lazy and ``TYPE_CHECKING`` alike), and
``docs/architecture.md`` draws it (``python scripts/render_readme.py`` writes the picture; CI checks it is current).
A new top-level module or package is placed here, in the layer whose arrows it keeps, or the house test fails.
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "entry",
        "what a user starts: the console script, `python -m`, the pre-commit hook",
        ("__main__", "cli", "precommit"),
    ),
    ("commands", "parse options, call one library function, render the report", ("commands",)),
    (
        "orchestrators",
        "runs that call several operations: train + doctor, train-smoke, round trips, the matrix",
        ("matrix", "smoke", "fit", "roundtrip"),
    ),
    (
        "operations",
        "one per command: inspect, remap, verify, merge, convert",
        ("inspection", "remap", "verify", "merge", "formats", "algebra", "probe"),
    ),
    ("engines", "each serving engine's rules and needs (verify --profile, remap --for)", ("engines",)),
    ("training", "the training core: settings, models, objectives, the accelerate loop, records", ("train",)),
    (
        "analysis",
        "facts read off an opened adapter: the inspect picture, the weights audit",
        ("facts", "audit"),
    ),
    (
        "inputs",
        "open any input: files, adapter folders, shards, cache ids, hf://",
        ("checkpoint", "opened", "remote"),
    ),
    ("torch side", "the meta model, PEFT injection, real loads (imported lazily)", ("ml",)),
    ("reports", "findings, the code catalogue, reports and their emitters", ("report", "codes")),
    (
        "knowledge",
        "the layout registry, the adapter config and key grammar, expert layouts, base resolution",
        ("layouts", "adapter", "bases", "quant"),
    ),
    ("storage", "safetensors without tensors: headers, rewrites, tensor reads, atomic writes", ("st",)),
    ("base", "errors, the version, the layer order", ("errors", "__init__", "layers")),
)
"""(name, what it holds, the modules and packages under ``adapterdoc.``), top first."""


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``adapterdoc.X...`` (0 is the top), or None for a module no layer holds."""
    parts = module.split(".")
    if parts[0] != "adapterdoc":
        return None
    head = parts[1] if len(parts) > 1 else "__init__"
    for i, (_, _, members) in enumerate(LAYERS):
        if head in members:
            return i
    return None
