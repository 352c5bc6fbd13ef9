"""`adapterdoc merge`: fold a LoRA adapter into its base checkpoint, one tensor at a time.

Plan first, from headers and a meta-device model: every adapter module is placed on the on-disk tensors its
weight update lands in (see :mod:`adapterdoc.ml.names`); a module that lands nowhere is an error, and nothing
is written. Then stream: each base shard is rewritten under the same name with a header computed up front;
untouched tensors are copied byte for byte, touched ones are read, merged in float32 (``W + s·B@A``, DoRA,
bias, whole-weight replacements) and cast back. Memory holds one tensor (plus its update) at a time. The output
is built in a temp folder beside ``--out`` and renamed into place; the base is only ever read.

The modules: :mod:`~adapterdoc.merge.plan` and :mod:`~adapterdoc.merge.checks` (placing the adapter),
:mod:`~adapterdoc.merge.edits` (the plan's data), :mod:`~adapterdoc.merge.delta` (the maths),
:mod:`~adapterdoc.merge.write` and :mod:`~adapterdoc.merge.writer` (the output), :mod:`~adapterdoc.merge.run`
(:func:`merge` itself).
"""

from adapterdoc.merge.run import merge
from adapterdoc.merge.write import Progress
from adapterdoc.report.merge_report import MergeReport

__all__ = ["MergeReport", "Progress", "merge"]
