"""`adapterdoc remap`: rename an adapter's keys to another model layout, header-only and atomically, and keep
adapter_config.json consistent with the new names.

Three ways to say what to rename, exactly one per call:

- ``vl=True``: strip the first ``.language_model.`` from every key that has one (a VL adapter onto the text class);
  decided from the adapter's own keys only.
- ``to=LAYOUT``: the registry's rules (:mod:`adapterdoc.layouts`) from the detected (or given) source layout;
  they act on module paths without the ``base_model.model.`` wrapper.
- ``rules=["REGEX=>REPLACEMENT", ...]``: ``re.sub(REGEX, REPLACEMENT, key, count=1)`` on the full key, in order.

The weights are renamed in place when the new header fits (space padding, O(header)), else by a streamed copy to a
temp file in the same folder renamed over the file (:mod:`adapterdoc.st.atomic`). An in-place remap edits its input:
a symlink there (a Hugging Face cache snapshot links to blobs shared by every revision) is replaced by a regular file
and its target is never written, unlike an output path the user names, whose links are followed. Refusals raise
:class:`~adapterdoc.errors.RefusedError` before anything is written. Torch is imported only for ``.bin`` adapters.

The modules: :mod:`~adapterdoc.remap.moves` (what a move renames), :mod:`~adapterdoc.remap.plan` (the mapping and
its refusals), :mod:`~adapterdoc.remap.config` and :mod:`~adapterdoc.remap.rewriter` (adapter_config.json),
:mod:`~adapterdoc.remap.write` (the writes), :mod:`~adapterdoc.remap.run` (:func:`remap` itself).
"""

from adapterdoc.remap.moves import parse_rule
from adapterdoc.remap.plan import BIN_BACKUP
from adapterdoc.remap.run import remap
from adapterdoc.report.remap_report import ConfigChange, RemapReport

__all__ = ["BIN_BACKUP", "ConfigChange", "RemapReport", "parse_rule", "remap"]
