"""`adapterdoc merge`: fold a LoRA adapter into its base checkpoint, one tensor at a time.

Plan first: every adapter module is placed on the on-disk tensors its weight update lands in; a module that
lands nowhere is an error, and nothing is written. Where the registry can vouch for it, the plan comes from the
headers and config files alone (:mod:`~adapterdoc.merge.header_plan`: no transformers, no peft); otherwise from
a meta-device model (:mod:`~adapterdoc.merge.plan`, names through :mod:`adapterdoc.ml.names`). Both give the same
plan where both apply. Then stream: each base shard is rewritten under the same name with a header computed up front;
untouched tensors are copied byte for byte, touched ones are read, merged in float32 (``W + s·B@A``, DoRA,
bias, whole-weight replacements) and cast back. Memory holds one tensor (plus its update) at a time. The output
is built in a temp folder beside ``--out`` and renamed into place; the base is only ever read.

The modules: :mod:`~adapterdoc.merge.header_plan`, :mod:`~adapterdoc.merge.plan` and
:mod:`~adapterdoc.merge.checks` (placing the adapter),
:mod:`~adapterdoc.merge.edits` (the plan's data), :mod:`~adapterdoc.merge.delta` (the maths),
:mod:`~adapterdoc.merge.output` and :mod:`~adapterdoc.merge.background_writer` (the output), :mod:`~adapterdoc.merge.run`
(:func:`merge` itself).
"""

from adapterdoc.merge.output import Progress
from adapterdoc.merge.run import merge
from adapterdoc.report.merge_report import MergeReport

__all__ = ["MergeReport", "Progress", "merge"]
