"""Human rendering of a :class:`~adapterdoc.remap.RemapReport`: the renames as a few patterns (old above new),
not a table of every key."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from adapterdoc.report.registry import Group, View, register
from adapterdoc.report.render import KEEP, MORE, Span, Writer, plural, write_findings

if TYPE_CHECKING:
    from adapterdoc.report.remap_report import ConfigChange, RemapReport

SHOWN = 6
"""Rename patterns listed; the rest are counted (``--json`` lists the keys)."""
_DIGITS = re.compile(r"^\d+$")


def _view(report: RemapReport) -> View:
    """One group: the remap input and its findings."""
    return View("remap", [Group(report.input, report.findings)])


@register("RemapReport", view=_view)
def render_remap(report: RemapReport, *, width: int | None = None) -> str:
    w = Writer(width)
    w.para((report.input, "bold"), hang=2)
    w.para(_title(report), indent=2)
    if report.renamed and report.experts is not None:  # the mapping is per module: old modules → new ones
        verb = "would rewrite" if report.dry_run else "rewrote"
        w.para(f"{verb} {_expert_counts(report.experts)} ({report.strategy})", indent=2)
        _patterns(w, report.mapping, unit="fused module")
    elif report.renamed:
        verb = "would rename" if report.dry_run else "renamed"
        w.para(f"{verb} {plural(report.renamed, 'key')} ({report.strategy})", indent=2)
        _patterns(w, report.mapping, unit="key")
    elif not report.rewrites:
        w.para("nothing to rename", indent=2)
    for r in report.rewrites:
        w.para("would rewrite" if report.dry_run else "rewrote", _rewrite(r), indent=2)
        _tensor_rewrites(w, r)
    for c in report.config_changes:
        _config_change(w, c)
    if report.out:
        w.para("output folder:", report.out, indent=2)
    for path in report.written:
        w.para("would write" if report.dry_run else "wrote", path, indent=2)
    for note in report.notes:
        w.para("note:", note, indent=2)
    write_findings(w, report.findings, context=(report.input,))
    return w.getvalue()


def _config_change(w: Writer, c: ConfigChange) -> None:
    label = f"adapter_config.json {c.field} ({c.how}):"
    if isinstance(c.old, list) and isinstance(c.new, list):
        removed = [x for x in c.old if x not in c.new]
        added = [x for x in c.new if x not in c.old]
        w.para(label, indent=2)
        if removed:
            w.para(f"− {len(removed)}:", *_items(removed), indent=4, hang=6)
        if added:
            w.para(f"+ {len(added)}:", *_items(added), indent=4, hang=6)
        if not removed and not added:
            w.para("same entries, new order:", *_items(c.new), indent=4, hang=6)
        return
    w.para(label, (repr(c.old), KEEP) if len(repr(c.old)) < 40 else repr(c.old), indent=2, hang=6)
    w.para("→", (repr(c.new), KEEP) if len(repr(c.new)) < 40 else repr(c.new), indent=4, hang=6)


def _expert_counts(r: Mapping[str, object]) -> str:
    """What an expert conversion rewrote, in the units ``--json`` counts: the tensors read and written, then the
    fused modules (``blocks``, two tensors each) and the per-expert modules (two tensors each)."""
    read, written, blocks = r["tensors_read"], r["tensors_written"], r["blocks"]
    assert isinstance(read, int) and isinstance(written, int) and isinstance(blocks, int)
    to_fused = r.get("to", r.get("direction")) == "fused"  # a --for rewrite says "to", --experts "direction"
    fused = plural(blocks, "fused module")
    per_expert = plural((read if to_fused else written) // 2, "per-expert module")
    old, new = (per_expert, fused) if to_fused else (fused, per_expert)
    return f"{read} tensors → {written}, {old} as {new}"


def _rewrite(r: Mapping[str, object]) -> str:
    """One ``--for`` rewrite in a few words."""
    words: dict[str, Callable[[], str]] = {
        "keys": lambda: f"{r.get('from')} → {r.get('to')}",
        "experts": lambda: (
            f"{r.get('from')} → {r.get('to')}" + (f", {_expert_counts(r)}" if "tensors_read" in r else "")
        ),
        "rslora": lambda: "lora_alpha " + _arrow(r["lora_alpha"]),
        "ranks": lambda: f"to {r['to']}, {r['bytes_added']} bytes added",
        "scaling": lambda: f"{r['tensors']} lora_B tensor(s), largest rounding {r['max_rel_rounding']:.3g}",
        "patterns": lambda: "rank_pattern / alpha_pattern dropped",
        "target_modules": lambda: f"regex → {r['entries']} module path(s)",
        "fill": lambda: (
            f"{r['fill']}, {r['modules']} module(s) ({r['tensors']} tensors), {r['bytes_added']} bytes added"
        ),
    }
    extra = words.get(str(r["rewrite"]))
    return f"{r['rewrite']}: {extra()}" if extra else str(r["rewrite"])


def _arrow(pair: object) -> str:
    """``old → new`` of a two-item list."""
    assert isinstance(pair, (list, tuple))
    return "{} → {}".format(*pair)


def _tensor_rewrites(w: Writer, r: Mapping[str, object]) -> None:
    """The tensors a rewrite replaced, one line per module (old above new), :data:`SHOWN` at most."""
    tensors = r.get("tensors")
    if not isinstance(tensors, dict):
        return
    for i, (old, new) in enumerate(tensors.items()):
        if i == SHOWN:
            w.para(f"and {plural(len(tensors) - SHOWN, 'more module')} (--json lists them)", indent=4)
            break
        w.para((str(old), KEEP), indent=4)
        w.para("→", (str(new), KEEP), indent=4, hang=6)


def _items(items: list[object]) -> list[Span]:
    return [(repr(x) + ("," if i < len(items) - 1 else ""), KEEP) for i, x in enumerate(items)]


def _title(report: RemapReport) -> str:
    move = {"vl": "--vl", "to": "--to", "rule": "--rule"}.get(report.mode, f"--{report.mode}")
    if report.engine is not None:
        move = f"--for {report.engine['name']}"
    src, dst = report.source_layout, report.target_layout
    if move == "--to" and dst:
        move = f"--to {dst}"
    if src and dst and src == dst:
        return f"remap {move}: the adapter is already {src}"
    if src and dst:
        return f"remap {move}: {src} → {dst}"
    if src:
        return f"remap {move}: layout {src}"
    if dst:
        return f"remap {move}: → {dst} (source layout not detected)"
    return f"remap {move}"


def _patterns(w: Writer, mapping: Mapping[str, str], *, unit: str) -> None:
    """Group the renames by what changes (the segments between a common prefix and suffix); each group as its
    count of ``unit`` (the mapping's entries: keys, or ``--experts``' modules), the old pattern, and the new
    pattern below it."""
    groups: dict[tuple[str, str, str], list[tuple[list[str], list[str], list[str], list[str]]]] = {}
    for old, new in mapping.items():
        a, b = old.split("."), new.split(".")
        p = 0
        while p < min(len(a), len(b)) and a[p] == b[p]:
            p += 1
        s = 0
        while s < min(len(a), len(b)) - p and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
            s += 1
        old_mid, new_mid = a[p : len(a) - s], b[p : len(b) - s]
        head, tail = a[:p], a[len(a) - s :]
        key = (_norm(head[-1:]), _norm(old_mid), _norm(new_mid))
        groups.setdefault(key, []).append((head, old_mid, new_mid, tail))
    items = sorted(groups.values(), key=len, reverse=True)
    for members in items[:SHOWN]:
        head_glob = _glob([m[0] for m in members], from_end=True)
        tail_glob = _glob([m[3] for m in members], from_end=False)
        old = ".".join(x for x in (head_glob, ".".join(members[0][1]), tail_glob) if x)
        new = ".".join(x for x in (head_glob, ".".join(members[0][2]), tail_glob) if x)
        label = f"{plural(len(members), unit)}:"
        if 4 + len(label) + 1 + max(len(old), len(new)) <= w.width:
            w.line(label, " ", old, indent=4)
            w.line(" " * (len(label) - 1), "→ ", new, indent=4)
        else:  # a pattern too long for the line: old and new each on a line of its own
            w.line(label, indent=4)
            w.line(old, indent=6)
            w.line("→ ", new, indent=4)
    rest = items[SHOWN:]
    if rest:
        n = sum(len(g) for g in rest)
        w.para(f"and {plural(len(rest), 'other pattern')} ({plural(n, unit)}); {MORE}", indent=4)


def _norm(segs: list[str]) -> str:
    return ".".join("N" if _DIGITS.match(x) else x for x in segs)


def _glob(parts: list[list[str]], *, from_end: bool) -> str:
    """The segments every member shares, position by position, with ``*`` where they differ: for the prefixes
    (aligned at their end, nearest the change) or the suffixes (aligned at their start)."""
    if not parts or not any(parts):
        return ""
    n = min(len(p) for p in parts)
    lengths_differ = any(len(p) != n for p in parts)
    aligned = [p[len(p) - n :] if from_end else p[:n] for p in parts]
    segs = [aligned[0][i] if all(x[i] == aligned[0][i] for x in aligned) else "*" for i in range(n)]
    if from_end:
        if lengths_differ:
            segs = ["*", *segs]
    else:
        # past the first segment the suffix is just "the rest of the key"
        segs = segs[:1] + (["*"] if n > 1 or lengths_differ else [])
    out: list[str] = []
    for seg in segs:
        if not (seg == "*" and out and out[-1] == "*"):
            out.append(seg)
    return ".".join(out)
