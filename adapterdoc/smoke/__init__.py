"""`adapterdoc train-smoke`: a reference LoRA run per layout on its tiny base, then the doctor on its own output
(inspect, verify, reload, lora_B, remap, merge). The training itself is :mod:`adapterdoc.train`; this package only
orchestrates it and the checks (:mod:`~adapterdoc.smoke.checks`, :mod:`~adapterdoc.smoke.run`).

Everything here needs the ML extra (torch, transformers, peft, accelerate, tokenizers) when it runs; importing it
does not import torch.
"""

from adapterdoc.report.smoke_report import CHECK_NAMES
from adapterdoc.smoke.checks import CHECKS
from adapterdoc.smoke.run import SMOKE_LAYOUTS, resolve_layouts, run_layout, run_smoke

__all__ = ["CHECKS", "CHECK_NAMES", "SMOKE_LAYOUTS", "resolve_layouts", "run_layout", "run_smoke"]
