"""THE registry of model layouts: every model-family fact adapterdoc knows, as data.

:mod:`~adapterdoc.layouts.registry` holds the machinery (:class:`Layout`, :class:`Rule`, detection, routes between
layouts, forward routing, tiny-model listings); :mod:`~adapterdoc.layouts.moves` the one key rename
(:func:`apply_move`) and the move search; :mod:`~adapterdoc.layouts.trees` the torch-free module-tree machinery.
Each model family is one module that registers its layouts: detection evidence and hints, towers, counterparts,
forward routing, LoRA leaves and expert parameters, move words, its module-tree builders and its tiny reference
config. Module paths are PEFT module paths *without* the ``base_model.model.`` wrapper. Nothing here imports torch.

Adding a family: one new module with its ``ENTRIES`` and ``SMOKE``, its name in :data:`FAMILY_MODULES`, and its
tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.layouts import embeddinggemma, mistral3, modernbert, qwen3_5, qwen3_omni, qwen_vl
from adapterdoc.layouts.common import MIXTRAL_EXPERTS, MOE_NAME_HINT
from adapterdoc.layouts.registry import (
    ADD_LANGUAGE_MODEL,
    EXPERT_SPELLINGS,
    LAYOUTS,
    MODALITY_SEGMENTS,
    STRIP_LANGUAGE_MODEL,
    TOWER_SEGMENTS,
    VL_INFIX,
    Detection,
    Experts,
    Layout,
    Rule,
    Tiny,
    all_tower_segments,
    detect_layout,
    exclusion_regex,
    forward_layout,
    forward_module,
    get_layout,
    loadable_as,
    register,
    register_experts,
    remap_path,
    smoke_layouts,
    strip_language_model,
    tiny_layouts,
    tower_probes,
    tower_segment,
)

if TYPE_CHECKING:
    from adapterdoc.layouts.moves import (
        VL_RULES,
        apply_move,
        move_rules,
        move_words,
        rename,
        strip_infix_in_regex,
    )

_FROM_MOVES = frozenset(
    ("VL_RULES", "apply_move", "move_rules", "move_words", "rename", "strip_infix_in_regex")
)
"""Names :mod:`adapterdoc.layouts.moves` gives this package, imported at their first use (:func:`__getattr__`):
what renames between layouts (remap, verify, the engines) is not what detection (inspect) needs."""


def __getattr__(name: str) -> object:
    if name in _FROM_MOVES:
        from adapterdoc.layouts import moves

        value = getattr(moves, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FAMILY_MODULES = (qwen3_5, qwen3_omni, mistral3, qwen_vl, modernbert, embeddinggemma)
"""The family modules, in registry order (detection ties and every listing follow it). Each has ``ENTRIES`` (its
layouts, in order) and ``SMOKE`` (its ``train-smoke --layout all`` layouts, in run order)."""

for _family in FAMILY_MODULES:
    register(*_family.ENTRIES, smoke=_family.SMOKE)
register_experts(MIXTRAL_EXPERTS)

__all__ = [
    "ADD_LANGUAGE_MODEL",
    "EXPERT_SPELLINGS",
    "FAMILY_MODULES",
    "LAYOUTS",
    "MIXTRAL_EXPERTS",
    "MODALITY_SEGMENTS",
    "MOE_NAME_HINT",
    "STRIP_LANGUAGE_MODEL",
    "TOWER_SEGMENTS",
    "VL_INFIX",
    "VL_RULES",
    "Detection",
    "Experts",
    "Layout",
    "Rule",
    "Tiny",
    "all_tower_segments",
    "apply_move",
    "detect_layout",
    "exclusion_regex",
    "forward_layout",
    "forward_module",
    "get_layout",
    "loadable_as",
    "move_rules",
    "move_words",
    "register",
    "register_experts",
    "remap_path",
    "rename",
    "smoke_layouts",
    "strip_infix_in_regex",
    "strip_language_model",
    "tiny_layouts",
    "tower_probes",
    "tower_segment",
]
