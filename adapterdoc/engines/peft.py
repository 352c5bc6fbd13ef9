"""The default profile: what PEFT itself loads. Verify's own checks are PEFT's rules; it adds only what PEFT does on a quantized base."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from adapterdoc.engines.base import Profile

if TYPE_CHECKING:
    from adapterdoc.quant import Quantization, QuantizedModule
    from adapterdoc.report.findings import Finding


class PeftProfile(Profile):
    name = "peft"
    summary = "PEFT loading (default)"

    def quantized_base(
        self, spec: str, q: Quantization, quantized: Sequence[QuantizedModule]
    ) -> list[Finding]:
        from adapterdoc.engines.quantized import peft_findings

        return peft_findings(spec, q, quantized)


PROFILE = PeftProfile()
