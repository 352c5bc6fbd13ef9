"""What planning asks of each adapter module: its keys grouped by module, its shapes against what PEFT builds, the
edits it makes, what blocks a streaming merge of it, and the remap that would place modules that land nowhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from adapterdoc.adapter import LoraKey, parse_key
from adapterdoc.checkpoint import Checkpoint
from adapterdoc.merge.edits import Edit

if TYPE_CHECKING:
    import torch

    from adapterdoc.ml.inject import LoraTarget
    from adapterdoc.ml.names import NameMap, Piece


def group_keys(
    adapter: Checkpoint,
) -> tuple[dict[str, dict[str, str]], list[LoraKey], dict[str, str], list[str]]:
    groups: dict[str, dict[str, str]] = {}
    full: list[LoraKey] = []
    tokens: dict[str, str] = {}
    strays: list[str] = []
    for key in adapter.tensors:
        lk = parse_key(key)
        if lk.role == "full":
            full.append(lk)
        elif lk.role == "tokens":
            if key.rsplit(".", 1)[-1].startswith("trainable_tokens_delta") or "trainable_tokens_delta" in key:
                tokens[lk.module] = key
        elif lk.role in (
            "lora_A",
            "lora_B",
            "lora_B.bias",
            "lora_embedding_A",
            "lora_embedding_B",
            "magnitude",
        ):
            groups.setdefault(lk.module, {})[lk.role] = key
        else:
            strays.append(key)
    return groups, full, tokens, strays


def check_shapes(
    shape_of: Callable[[str], tuple[int, ...]], keys: dict[str, str], target: LoraTarget
) -> str | None:
    """What is wrong with ``keys``' shapes (``shape_of(key)``) for PEFT's layer ``target``, if anything."""
    if target.kind == "tokens":
        return "is a trainable-token module, not LoRA"
    emb = target.kind == "embedding"
    a_role, b_role = ("lora_embedding_A", "lora_embedding_B") if emb else ("lora_A", "lora_B")
    if a_role not in keys or b_role not in keys:
        have = ", ".join(sorted(keys))
        return f"needs both {a_role} and {b_role}; the adapter has {have}"
    checks = [(a_role, target.a_shape), (b_role, target.b_shape)]
    if target.magnitude_shape is not None:
        if "magnitude" not in keys:
            return "the config uses DoRA but the adapter has no lora_magnitude_vector"
        checks.append(("magnitude", target.magnitude_shape))
    if target.lora_bias and "lora_B.bias" not in keys:
        return "the config sets lora_bias but the adapter has no lora_B.bias"
    for role, want in checks:
        got = tuple(shape_of(keys[role]))
        if got != tuple(want):
            return f"{role} is {list(got)}, PEFT builds {list(want)} (rank {target.rank})"
    return None


def lora_edits(module: str, keys: dict[str, str], target: LoraTarget) -> list[Edit]:
    emb = target.kind == "embedding"
    ab = {
        "A": keys["lora_embedding_A" if emb else "lora_A"],
        "B": keys["lora_embedding_B" if emb else "lora_B"],
    }
    out: list[Edit] = []
    if target.magnitude_shape is not None:
        out.append(Edit("dora", module, {**ab, "magnitude": keys["magnitude"]}, target))
    else:
        out.append(Edit("lora", module, ab, target))
    if target.lora_bias:
        out.append(Edit("bias", module, {"bias": keys["lora_B.bias"]}, target))
    return out


def merge_blocker(
    target: LoraTarget, name_map: NameMap, canonical: str, pieces: list[Piece], e: list[Edit]
) -> str | None:
    if target.kind not in ("linear", "embedding", "experts"):
        return f"LoRA on a {target.kind} layer is not supported by the streaming merge"
    if target.variant and target.variant not in ("DoraLinearVariant", "DoraEmbeddingVariant"):
        return f"the LoRA variant {target.variant} has its own merge rule, which the streaming merge lacks"
    if canonical in name_map.unsupported:
        return f"its weight's on-disk layout cannot be sliced ({name_map.unsupported[canonical]})"
    whole = len(pieces) == 1 and pieces[0].whole
    if any(x.kind == "dora" for x in e):
        if not whole:
            return "DoRA over a weight stored in several on-disk pieces"
        if target.fan_in_fan_out:
            return "DoRA with fan_in_fan_out"
    if target.kind in ("linear", "embedding") and not whole:
        return "its weight is stored in several on-disk pieces"
    return None


def unused_hint(
    unused: list[str], targets: dict[str, LoraTarget], model: torch.nn.Module, spec: str, base: str
) -> str:
    """Name the registry move that makes the unused modules land on modules PEFT creates, if one does: the layouts'
    move search (:func:`adapterdoc.layouts.moves.candidate_moves`), onto the layouts of the base's class."""
    from adapterdoc.layouts import LAYOUTS, rename
    from adapterdoc.layouts.moves import candidate_moves

    cls = type(model).__name__
    order = {name: i for i, name in enumerate(LAYOUTS)}
    moves = [mv for mv in candidate_moves((), ()) if mv.target and LAYOUTS[mv.target].model_class == cls]
    for mv in sorted(moves, key=lambda mv: order[mv.target or ""]):  # stable: sources in registry order
        moved = [rename(mv.rules, m) for m in unused]
        if moved and all(m in targets for m in moved):
            return f"the adapter's names fit {mv.source}, the base is {cls}: adapterdoc remap {spec} --to {mv.target}"
    return f"compare names with `adapterdoc verify {spec} --base {base}`"
