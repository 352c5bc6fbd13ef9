"""`adapterdoc roundtrip`: run every move a user makes with an adapter, on copies, and prove nothing changed.

Byte level (always): every remap the registry allows from the adapter's layout, there and back, must give the
input's exact bytes; ``.safetensors`` → ``.bin`` → ``.safetensors`` must keep names, dtypes and values.
With a base that has weights (a model folder or ``tiny:LAYOUT``): load → save → load gives identical tensors and
outputs; the merged model's outputs equal the unmerged adapter model's; the adapter remapped to the text
counterpart, loaded on the counterpart class holding the same base weights, gives identical outputs.
A mixture-of-experts adapter also goes to the other expert layout and back (``remap --experts``): names equal,
shapes and bytes equal where the move is exact (gate_up's rank doubles, see :func:`expert_trip`), and with a base
the outputs of both moved adapters equal the original's.
The input is never modified: everything runs in a temp folder.

The package: :mod:`.run` (the entry, :func:`roundtrip`), :mod:`.bytes` (remap and format trips),
:mod:`.models` (PEFT load/save, merge, counterpart), :mod:`.experts` (the expert trip), :mod:`.common`.
"""

from __future__ import annotations

from adapterdoc.report.roundtrip_report import Check, RoundtripReport
from adapterdoc.roundtrip.bytes import byte_roundtrips, reachable_layouts
from adapterdoc.roundtrip.common import TripFailed, TripSkipped, copy_adapter
from adapterdoc.roundtrip.expert_trip import (
    EXPERT_RTOL,
    expert_outputs_match,
    expert_trip,
    peft_drops_note,
    peft_has_expert_lora,
)
from adapterdoc.roundtrip.models import MERGE_RTOL
from adapterdoc.roundtrip.run import roundtrip

__all__ = [
    "EXPERT_RTOL",
    "MERGE_RTOL",
    "Check",
    "RoundtripReport",
    "TripFailed",
    "TripSkipped",
    "byte_roundtrips",
    "copy_adapter",
    "expert_outputs_match",
    "expert_trip",
    "peft_drops_note",
    "peft_has_expert_lora",
    "reachable_layouts",
    "roundtrip",
]
