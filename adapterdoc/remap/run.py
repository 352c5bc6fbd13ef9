"""The ``remap`` entry point: check the call, plan, and write (in place under the folder's lock)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from adapterdoc.engines.base import EngineNeeds
from adapterdoc.layouts import Rule
from adapterdoc.remap.expert_plan import make_expert_plan
from adapterdoc.remap.for_engine.plan import make_engine_plan
from adapterdoc.remap.moves import parse_rule
from adapterdoc.remap.plan import Plan, make_plan
from adapterdoc.remap.write import CopyProgress, write
from adapterdoc.report.remap_report import RemapReport, Written, build_remap_report
from adapterdoc.st.atomic import atomic_write_bytes, folder_lock
from adapterdoc.st.paths import check_writable

EXPERT_FORMS = ("per-expert", "fused")
"""The two expert layouts ``experts=`` converts to."""


def remap(
    spec: str | os.PathLike[str],
    *,
    vl: bool = False,
    to: str | None = None,
    source: str | None = None,
    rules: Iterable[str | Rule] = (),
    experts: str | None = None,
    engine: str | None = None,
    base: str | None = None,
    needs: EngineNeeds | None = None,
    out: str | os.PathLike[str] | None = None,
    dry_run: bool = False,
    progress: CopyProgress | None = None,
) -> RemapReport:
    """Remap ``spec`` (adapter dir, .safetensors/.bin file or cached repo id); see the module docstring.

    ``experts`` (``per-expert`` or ``fused``) rewrites a mixture-of-experts adapter into that expert layout
    (:mod:`adapterdoc.remap.expert_rewrite`; always a streamed copy of the weights). ``engine`` (``vllm``, ``sglang``,
    ``tgi``, ``lorax``) makes every exact rewrite that engine needs (:mod:`adapterdoc.remap.for_engine.plan`); ``base``
    (only with ``engine``) names the served base when the adapter's own keys do not say it; ``needs`` (only with
    ``engine``) replaces the engine profile's :class:`~adapterdoc.engines.base.EngineNeeds`. ``source`` names the source layout for ``to`` when detection is ambiguous. ``out`` writes a complete new
    adapter folder and leaves the input untouched. ``dry_run`` plans and writes nothing. ``progress`` opens a
    progress display for a streamed copy (see :data:`~adapterdoc.remap.write.CopyProgress`). Raises an :class:`~adapterdoc.errors.AdapterdocError` (nothing
    written) when the input is unusable or the remap is refused.
    """
    user_rules = [r if isinstance(r, Rule) else parse_rule(r) for r in rules]
    modes = sum([bool(vl), to is not None, bool(user_rules), experts is not None, engine is not None])
    if modes != 1:
        raise ValueError("choose exactly one of vl=True, to=LAYOUT, rules=[...], experts= or engine=")
    if base is not None and engine is None:
        raise ValueError("base= only goes with engine=")
    if experts is not None and experts not in EXPERT_FORMS:
        raise ValueError(f"experts= is one of {', '.join(EXPERT_FORMS)}")
    if source is not None and to is None:
        raise ValueError("source= only goes with to=")
    if out is not None:
        out = os.path.expanduser(os.fspath(out))

    def make(out: str | None) -> Plan:
        if experts is not None:
            return make_expert_plan(os.fspath(spec), experts, out)
        if engine is not None:
            return make_engine_plan(os.fspath(spec), engine, base, out, needs)
        return make_plan(os.fspath(spec), vl=vl, to=to, source=source, user_rules=user_rules, out=out)

    if dry_run:
        return build_remap_report(make(out).planned, None)
    if out is not None:
        plan = make(out)
        return build_remap_report(plan.planned, write(plan, out=out, progress=progress))
    folder = _writable_folder(os.fspath(spec))
    if folder is None:  # not a cached repo id either (an hf:// spec): planning finds the folder
        probe = make(None)
        folder = os.path.dirname(os.path.abspath(probe.weights_path))
    # Writing in place: plan (once, reading the header once) and write under the folder's lock, so that a second
    # remap running at the same time sees the first one's result (and finds nothing to do, or refuses) instead of
    # interleaving with it.
    with folder_lock(folder):
        plan = make(None)
        if plan.config_only:  # --for: only adapter_config.json changes; the weights file is not touched
            assert plan.config_path is not None and plan.config_bytes is not None
            check_writable(plan.config_path)
            atomic_write_bytes(plan.config_path, plan.config_bytes, link="replace")
            written = Written((plan.config_path,))
        else:
            written = write(plan, out=None, progress=progress)
    return build_remap_report(plan.planned, written)


def _writable_folder(spec: str) -> str | None:
    """The folder an in-place remap of ``spec`` writes into (locked while it does), found without reading the
    weights: the folder itself, a file's folder, a cached repo id's snapshot folder; ``None`` otherwise."""
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        return os.path.abspath(path)
    if os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path))
    from adapterdoc.bases import match_repo_id, resolve_cached_repo

    m = match_repo_id(path)
    if os.path.lexists(path) or m is None or path.startswith("hf://"):
        return None  # planning says what is wrong with it (a broken link, no such path)
    return os.path.abspath(resolve_cached_repo(m["repo"], m["rev"]))
