"""Factorised arithmetic on LoRA deltas with an error certificate: the exact sum of adapters as stacked factors
(``combine --method cat``), the best rank-R factorisation of a delta from its factors alone (``combine --method
svd``, ``resize``), and the plain PEFT adapter that holds the result.

``read`` reads an adapter's modules with each one's PEFT scaling folded in, ``factors`` does the maths (QR of the
stacked factors and an SVD of the small core: the full ``d x k`` matrix is never formed), ``write`` writes the
result as a plain PEFT adapter, ``run`` is what the commands call.
"""

from __future__ import annotations

from adapterdoc.algebra.run import combine, resize

__all__ = ["combine", "resize"]
