"""`adapterdoc merge`: fold a LoRA adapter into its base checkpoint, one tensor at a time.

Plan first, from headers and a meta-device model: every adapter module is placed on the on-disk tensors its
weight update lands in (see :mod:`adapterdoc.ml.names`); a module that lands nowhere is an error, and nothing
is written. Then stream: each base shard is rewritten under the same name with a header computed up front;
untouched tensors are copied byte for byte, touched ones are read, merged in float32 (``W + s·B@A``, DoRA,
bias, whole-weight replacements) and cast back. Memory holds one tensor (plus its update) at a time. The output
is built in a temp folder beside ``--out`` and renamed into place; the base is only ever read.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from adapterdoc.adapter import WRAPPER, LoraKey, parse_key
from adapterdoc.checkpoint import Checkpoint, open_checkpoint, safe_shard_name
from adapterdoc.errors import RefusedError, UnsupportedInputError
from adapterdoc.report.findings import Finding, has_errors, make, sort_findings
from adapterdoc.st.atomic import (
    TEMP_PREFIX,
    check_output_folder,
    make_temp_folder,
    replace_folder,
    slow_point,
    write_marker,
)
from adapterdoc.st.header import DTYPE_BITS, Header, TensorInfo, serialize_header

DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
"""``--dtype`` choices (besides ``auto``) → safetensors dtype."""
_FLOAT = ("F16", "BF16", "F32", "F64")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")
_COPY_CHUNK = 8 << 20
"""Buffer size of the fallback copy where ``sendfile`` cannot copy between files."""

Progress = Callable[[int, int], None]


@dataclass
class MergeReport:
    """What a merge did (or would have done) and why it passed or failed."""

    adapter: str
    base: str
    out: str | None
    """The merged folder; ``None`` when nothing was written."""
    dtype: str
    applied: list[str] = field(default_factory=list)
    """Adapter modules (and saved whole weights) merged into the base."""
    unused: list[str] = field(default_factory=list)
    """Adapter modules that matched no base tensor (each also an AD501 finding)."""
    findings: list[Finding] = field(default_factory=list)
    model_class: str | None = None
    tensors: int = 0
    """Tensors written."""
    merged_tensors: int = 0
    """Tensors changed by the adapter."""
    bytes_written: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [f.to_dict() for f in sort_findings(self.findings)],
            "adapter": self.adapter,
            "base": self.base,
            "out": self.out,
            "dtype": self.dtype,
            "model_class": self.model_class,
            "applied": self.applied,
            "unused": self.unused,
            "tensors": self.tensors,
            "merged_tensors": self.merged_tensors,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
        }


# ----------------------------------------------------------------------------------------------- plan


@dataclass
class _Edit:
    """One change to one in-memory parameter: ``replace`` / ``lora`` / ``dora`` / ``bias`` / ``tokens``."""

    kind: str
    label: str
    keys: dict[str, str]
    """Role → adapter tensor name."""
    target: Any = None
    """The :class:`~adapterdoc.ml.names.LoraTarget` (not for ``replace``)."""


@dataclass
class _Output:
    """One tensor of the merged checkpoint."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: TensorInfo | None
    """The base tensor it starts from (``None`` for a tensor the merge adds, e.g. an untied head)."""
    source_file: str | None
    edits: list[_Edit] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BITS[self.dtype] // 8


@dataclass
class _Plan:
    base: Checkpoint
    adapter: Checkpoint
    shards: list[tuple[str, Header, list[_Output]]]
    """(output file name relative to the folder, base header, tensors in write order)."""
    applied: list[str]
    unused: list[str]
    findings: list[Finding]
    pieces: dict[str, Any]
    """Output tensor name → its :class:`~adapterdoc.ml.names.Piece`."""
    untie: bool
    model_class: str
    added: list[str] = field(default_factory=list)
    """Output tensors the base does not have (an untied weight)."""


def merge(
    adapter: str | os.PathLike[str],
    base: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    dtype: str = "auto",
    force: bool = False,
    progress: Progress | None = None,
) -> MergeReport:
    """Merge ``adapter`` into the checkpoint folder ``base`` and write the result to the folder ``out``.

    Raises :class:`~adapterdoc.errors.AdapterdocError` for unusable inputs or a refused ``out``; returns a report
    whose ``findings`` hold any error that stopped the merge (then nothing is written and ``out`` is ``None``).
    """
    started = time.perf_counter()
    if dtype != "auto" and dtype not in DTYPES:
        raise UnsupportedInputError(
            None, f"--dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}"
        )
    aspec, bspec, ospec = (os.path.expanduser(os.fspath(p)) for p in (adapter, base, out))
    adapter_ckpt = _open_adapter(aspec)
    base_ckpt = _open_base(bspec)
    out_path = _check_out(ospec, base_ckpt, adapter_ckpt, force=force)
    plan = _plan(adapter_ckpt, base_ckpt, dtype)
    report = MergeReport(
        adapter=aspec,
        base=bspec,
        out=None,
        dtype=dtype,
        applied=plan.applied,
        unused=plan.unused,
        findings=plan.findings,
        model_class=plan.model_class,
    )
    if has_errors(plan.findings):
        report.seconds = time.perf_counter() - started
        return report
    try:
        written = _write(plan, out_path, dtype, force=force, progress=progress)
    except _NotFinite as e:
        report.findings.append(
            make(
                "AD506", f"merging gives non-finite values in `{e.tensor}`; nothing was written", key=e.tensor
            )
        )
        report.seconds = time.perf_counter() - started
        return report
    report.out = out_path
    report.tensors, report.merged_tensors, report.bytes_written = written
    report.seconds = time.perf_counter() - started
    return report


def _open_adapter(spec: str) -> Checkpoint:
    ckpt = open_checkpoint(spec)
    if ckpt.adapter_config is None:
        raise UnsupportedInputError(
            spec, "is not a PEFT adapter folder (adapter_config.json is needed to merge)"
        )
    return _as_peft_reads_it(ckpt)


def _as_peft_reads_it(ckpt: Checkpoint) -> Checkpoint:
    """Rename keys the way PEFT's loader reads them (wrapper added, ``default`` adapter name removed), so an
    adapter PEFT loads is one merge can merge. ``original_names`` maps back for reading a ``.bin``."""
    from adapterdoc.adapter import peft_load_name

    renamed = {peft_load_name(k): k for k in ckpt.tensors}
    if len(renamed) != len(ckpt.tensors):
        raise UnsupportedInputError(
            ckpt.spec, "two tensors name the same LoRA weight once normalised as PEFT reads them"
        )
    if all(new == old for new, old in renamed.items()):
        return ckpt
    ckpt.tensors = {new: ckpt.tensors[old] for new, old in renamed.items()}
    ckpt.tensor_file = {new: ckpt.tensor_file[old] for new, old in renamed.items()}
    ckpt.original_names = renamed
    return ckpt


def _open_base(spec: str) -> Checkpoint:
    if spec.startswith("tiny:"):
        raise UnsupportedInputError(
            spec,
            "merge needs the base's real weights, and tiny:LAYOUT is a config only; pass the model folder "
            "(config.json and its safetensors shards, e.g. one written by save_pretrained)",
        )
    ckpt = open_checkpoint(spec)
    if ckpt.adapter_config is not None or ckpt.kind == "adapter":
        raise UnsupportedInputError(spec, "is an adapter, not a base model folder")
    if not os.path.isdir(ckpt.root):
        raise UnsupportedInputError(
            spec, "--base must be the model folder (config.json and its safetensors shards)"
        )
    if ckpt.weights_format != "safetensors" or not ckpt.headers:
        raise UnsupportedInputError(spec, "merge reads safetensors checkpoints only")
    return ckpt


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _check_out(out: str, base: Checkpoint, adapter: Checkpoint, *, force: bool) -> str:
    """Refuse an --out that overlaps an input or that merge may not replace (see :mod:`adapterdoc.st.atomic`)."""
    out_abs = os.path.abspath(out)
    if not os.path.islink(out_abs):
        real = _real(out_abs)
        for label, ckpt in (("base", base), ("adapter", adapter)):
            root = _real(ckpt.root if os.path.isdir(ckpt.root) else os.path.dirname(ckpt.root))
            if _inside(real, root) or _inside(root, real):
                raise RefusedError(
                    out, f"overlaps the {label} folder {ckpt.root}; the merge never writes there"
                )
    return check_output_folder(out, force=force)


def _plan(adapter: Checkpoint, base: Checkpoint, dtype: str) -> _Plan:
    from adapterdoc.ml import names

    base_dir = base.root
    config = names.load_base_config(base_dir)
    model = names.meta_model(config, base_dir)
    disk_shapes = {n: t.shape for n, t in base.tensors.items()}
    name_map = names.build_name_map(model, disk_shapes)
    assert adapter.adapter_config is not None
    inv = names.inventory(model, adapter.adapter_config, adapter.spec)

    findings: list[Finding] = []
    applied: list[str] = []
    unused: list[str] = []
    member_edits: dict[str, list[_Edit]] = {}
    """In-memory parameter → its edits in order (tied parameters are separate members here)."""

    def add(param: str, edit: _Edit, *, shared: bool = False) -> None:
        # ``shared``: the edit lands in the Parameter object itself (a weight loaded into a tied tensor);
        # otherwise only the module that owns ``param`` sees it (LoRA, a modules_to_save copy).
        for m in (param, *(name_map.tied.get(param, ()) if shared else ())):
            member_edits.setdefault(m, []).append(edit)

    def fail_unused(label: str, why: str, key: str | None = None) -> None:
        unused.append(label)
        findings.append(make("AD501", f"`{label}` {why}", key=key or label))

    groups, full, tokens, strays = _group_keys(adapter)
    # 1. whole weights first: PEFT loads them before it merges anything.
    for lk in full:
        param = names.saved_weight_param(lk.module, lk.key.rpartition(".")[2])
        label = lk.key[len(WRAPPER) :] if lk.wrapped else lk.key
        if not lk.wrapped:
            fail_unused(label, "lacks PEFT's `base_model.model.` prefix, so PEFT would not load it", lk.key)
            continue
        shape = tuple(adapter.tensors[lk.key].shape)
        if param not in name_map.param_shapes:
            fail_unused(label, "names no parameter of the base model", lk.key)
            continue
        if shape != tuple(name_map.param_shapes[param]):
            want = list(name_map.param_shapes[param])
            findings.append(
                make(
                    "AD502",
                    f"saved weight `{label}` is {list(shape)}, the base `{param}` is {want}",
                    key=lk.key,
                )
            )
            continue
        if name_map.resolve(param) is None:
            fail_unused(label, f"targets `{param}`, which the base checkpoint does not store", lk.key)
            continue
        own_copy = any(lk.module == m or lk.module.endswith(f".{m}") for m in inv.modules_to_save)
        add(param, _Edit("replace", label, {"value": lk.key}), shared=not own_copy)
        applied.append(label)

    # 2. LoRA modules, in the order PEFT merges them (module order of the model).
    order = {m: i for i, m in enumerate(inv.targets)}
    for module in sorted(groups, key=lambda m: (order.get(m, len(order)), m)):
        keys = groups[module]
        target = inv.targets.get(module)
        if any(parse_key(k).adapter_name for k in keys.values()):
            fail_unused(module, "has keys that still carry an adapter name (`lora_A.default.weight`)")
            continue
        if not all(parse_key(k).wrapped for k in keys.values()):
            fail_unused(module, "lacks PEFT's `base_model.model.` prefix, so PEFT would not load it")
            continue
        if target is None:
            fail_unused(module, "is not a module PEFT creates on this base for the adapter's config")
            continue
        problem = _check_shapes(adapter, keys, target)
        if problem:
            findings.append(make("AD502", f"`{module}`: {problem}", key=module))
            continue
        new_edits = _lora_edits(module, keys, target)
        resolved = name_map.resolve(target.param)
        if resolved is None:
            fail_unused(module, f"updates `{target.param}`, which the base checkpoint does not store")
            continue
        canonical, pieces = resolved
        blocker = _blocker(target, name_map, canonical, pieces, new_edits)
        bias_param = target.param.rpartition(".")[0] + ".bias"
        if blocker is None and target.lora_bias:
            res = name_map.resolve(bias_param)
            if res is None or len(res[1]) != 1 or not res[1][0].whole:
                blocker = f"it has a LoRA bias but the base stores no single `{bias_param}`"
        if blocker:
            findings.append(make("AD503", f"`{module}`: {blocker}", key=module))
            continue
        for e in new_edits:
            add(bias_param if e.kind == "bias" else target.param, e)
        applied.append(module)
    absent = [m for m in inv.targets if m not in groups]
    if absent:
        findings.append(
            make(
                "AD505",
                f"{len(absent)} module(s) PEFT creates for this config have no tensors in the adapter "
                f"(e.g. `{absent[0]}`); they merge as no-ops",
            )
        )

    # 3. trainable tokens.
    for module, key in tokens.items():
        target = inv.tokens.get(module)
        if target is None or not parse_key(key).wrapped:
            fail_unused(
                module, "holds trainable-token deltas for a module PEFT does not wrap on this base", key
            )
            continue
        shape = tuple(adapter.tensors[key].shape)
        if shape != target.a_shape:
            findings.append(
                make(
                    "AD502",
                    f"`{module}`: token deltas are {list(shape)}, PEFT expects {list(target.a_shape)}",
                )
            )
            continue
        resolved = name_map.resolve(target.param)
        if resolved is None:
            fail_unused(module, f"updates `{target.param}`, which the base checkpoint does not store", key)
            continue
        if len(resolved[1]) != 1 or not resolved[1][0].whole:
            findings.append(make("AD503", f"`{module}`: trainable tokens on a split tensor", key=module))
            continue
        # the token layer swaps rows of the shared embedding matrix itself
        add(target.param, _Edit("tokens", module, {"delta": key}, target), shared=True)
        applied.append(module)
    for key in strays:
        fail_unused(parse_key(key).module, "is a tensor kind merge does not know", key)

    if unused:
        hint = _unused_hint(unused, inv.targets, model, adapter.spec, base.spec)
        findings[:] = [replace(f, hint=hint) if f.code == "AD501" else f for f in findings]

    # 4. Edits per on-disk tensor; tied parameters that end up different get their own tensor.
    by_disk_edits: dict[str, list[_Edit]] = {}
    pieces_by_out: dict[str, Any] = {}
    added: dict[str, tuple[str, str]] = {}
    """New output tensor (an untied weight) → (its in-memory parameter, the on-disk tensor it copies)."""
    for param, plist in name_map.by_param.items():
        mine = member_edits.get(param, [])
        for piece in plist:
            pieces_by_out[piece.disk] = piece
            if mine:
                by_disk_edits[piece.disk] = mine
        for other in name_map.tied.get(param, ()):
            if name_map.by_param.get(other) or other in added:
                continue  # stored on its own, or already split off
            theirs = member_edits.get(other, [])
            if [id(e) for e in theirs] == [id(e) for e in mine]:
                continue
            partner = plist[0].disk
            added[other] = (other, partner)
            pieces_by_out[other] = names.Piece(other, other)
            findings.append(
                make(
                    "AD504",
                    f"`{other}` and `{param}` share one matrix in the base, but the adapter changes them "
                    "differently; the merged checkpoint stores both (tie_word_embeddings set to false)",
                    key=other,
                )
            )
    for disk, e in by_disk_edits.items():
        info = base.tensors.get(disk)
        if info is not None and info.dtype not in _FLOAT and any(x.kind != "replace" for x in e):
            findings.append(
                make(
                    "AD503", f"`{disk}` is {info.dtype}; merge only updates floating-point weights", key=disk
                )
            )
    after: dict[str, list[str]] = {}
    for new, (_param, partner) in added.items():
        after.setdefault(partner, []).append(new)
    shards: list[tuple[str, Header, list[_Output]]] = []
    for header in base.headers:
        rel = _relative_name(base, header.path)
        outs: list[_Output] = []
        for info in sorted(header.tensors.values(), key=lambda t: (t.begin, t.end)):
            out_dtype = _out_dtype(info.dtype, dtype)
            outs.append(
                _Output(info.name, out_dtype, info.shape, info, header.path, by_disk_edits.get(info.name, []))
            )
            for new in after.get(info.name, []):
                outs.append(_Output(new, out_dtype, info.shape, info, header.path, member_edits.get(new, [])))
        shards.append((rel, header, outs))
    return _Plan(
        base=base,
        adapter=adapter,
        shards=shards,
        applied=applied,
        unused=unused,
        findings=findings,
        pieces=pieces_by_out,
        untie=bool(added),
        model_class=name_map.model_class,
        added=list(added),
    )


def _group_keys(
    adapter: Checkpoint,
) -> tuple[dict[str, dict[str, str]], list[LoraKey], dict[str, str], list[str]]:
    groups: dict[str, dict[str, str]] = {}
    full: list[LoraKey] = []
    tokens: dict[str, str] = {}
    strays: list[str] = []
    for key in adapter.tensors:
        lk = parse_key(key)
        if lk.role == "full":
            full.append(lk)
        elif lk.role == "tokens":
            if key.rsplit(".", 1)[-1].startswith("trainable_tokens_delta") or "trainable_tokens_delta" in key:
                tokens[lk.module] = key
        elif lk.role in (
            "lora_A",
            "lora_B",
            "lora_B.bias",
            "lora_embedding_A",
            "lora_embedding_B",
            "magnitude",
        ):
            groups.setdefault(lk.module, {})[lk.role] = key
        else:
            strays.append(key)
    return groups, full, tokens, strays


def _check_shapes(adapter: Checkpoint, keys: dict[str, str], target: Any) -> str | None:
    if target.kind == "tokens":
        return "is a trainable-token module, not LoRA"
    emb = target.kind == "embedding"
    a_role, b_role = ("lora_embedding_A", "lora_embedding_B") if emb else ("lora_A", "lora_B")
    if a_role not in keys or b_role not in keys:
        have = ", ".join(sorted(keys))
        return f"needs both {a_role} and {b_role}; the adapter has {have}"
    checks = [(a_role, target.a_shape), (b_role, target.b_shape)]
    if target.magnitude_shape is not None:
        if "magnitude" not in keys:
            return "the config uses DoRA but the adapter has no lora_magnitude_vector"
        checks.append(("magnitude", target.magnitude_shape))
    if target.lora_bias and "lora_B.bias" not in keys:
        return "the config sets lora_bias but the adapter has no lora_B.bias"
    for role, want in checks:
        got = tuple(adapter.tensors[keys[role]].shape)
        if got != tuple(want):
            return f"{role} is {list(got)}, PEFT builds {list(want)} (rank {target.rank})"
    return None


def _lora_edits(module: str, keys: dict[str, str], target: Any) -> list[_Edit]:
    emb = target.kind == "embedding"
    ab = {
        "A": keys["lora_embedding_A" if emb else "lora_A"],
        "B": keys["lora_embedding_B" if emb else "lora_B"],
    }
    out: list[_Edit] = []
    if target.magnitude_shape is not None:
        out.append(_Edit("dora", module, {**ab, "magnitude": keys["magnitude"]}, target))
    else:
        out.append(_Edit("lora", module, ab, target))
    if target.lora_bias:
        out.append(_Edit("bias", module, {"bias": keys["lora_B.bias"]}, target))
    return out


def _blocker(target: Any, name_map: Any, canonical: str, pieces: list[Any], e: list[_Edit]) -> str | None:
    if target.kind not in ("linear", "embedding", "experts"):
        return f"LoRA on a {target.kind} layer is not supported by the streaming merge"
    if target.variant and target.variant not in ("DoraLinearVariant", "DoraEmbeddingVariant"):
        return f"the LoRA variant {target.variant} has its own merge rule, which the streaming merge lacks"
    if canonical in name_map.unsupported:
        return f"its weight's on-disk layout cannot be sliced ({name_map.unsupported[canonical]})"
    whole = len(pieces) == 1 and pieces[0].whole
    if any(x.kind == "dora" for x in e):
        if not whole:
            return "DoRA over a weight stored in several on-disk pieces"
        if target.fan_in_fan_out:
            return "DoRA with fan_in_fan_out"
    if target.kind in ("linear", "embedding") and not whole:
        return "its weight is stored in several on-disk pieces"
    return None


def _unused_hint(unused: list[str], targets: dict[str, Any], model: Any, spec: str, base: str) -> str:
    """Name the registry move that makes the unused modules land on modules PEFT creates, if one does."""
    from adapterdoc.layouts import LAYOUTS, remap_path

    cls = type(model).__name__
    for dst, lay in LAYOUTS.items():
        if lay.model_class != cls:
            continue
        for src in LAYOUTS:
            steps = remap_path(src, dst)
            if not steps:
                continue
            moved = []
            for m in unused:
                for _, rules in steps:
                    for rule in rules:
                        m = rule.apply(m)
                moved.append(m)
            if moved and all(m in targets for m in moved):
                return f"the adapter's names fit {src}, the base is {cls}: adapterdoc remap {spec} --to {dst}"
    return f"compare names with `adapterdoc verify {spec} --base {base}`"


def _relative_name(base: Checkpoint, shard_path: str) -> str:
    rel = os.path.relpath(shard_path, base.root)
    if base.index_path:
        safe_shard_name(base.index_path, rel)  # refuses ../ and absolute names
    return rel


def _out_dtype(st_dtype: str, dtype: str) -> str:
    if dtype == "auto" or st_dtype not in _FLOAT:
        return st_dtype
    return DTYPES[dtype]


# ----------------------------------------------------------------------------------------------- tensors


_ST_TORCH: dict[str, Any] = {}
_BLOCK_BYTES = 4 << 20
"""Float32 working set per row block of a merged tensor."""


def _torch_dtype(st: str) -> Any:
    import torch

    if not _ST_TORCH:
        from adapterdoc.checkpoint import TORCH_TO_ST

        for tname, sname in TORCH_TO_ST.items():
            t = getattr(torch, tname.split(".", 1)[1], None)
            if t is not None:
                _ST_TORCH[sname] = t
    try:
        return _ST_TORCH[st]
    except KeyError as e:
        raise UnsupportedInputError(None, f"dtype {st} cannot be merged") from e


def _read(f: Any, offset: int, dtype: str, shape: tuple[int, ...]) -> Any:
    """Read one tensor (or a run of its rows) with plain file I/O.

    No mmap: pages of a mapped file stay resident in the process and count as its memory.
    """
    import torch

    n = 1
    for d in shape:
        n *= d
    nbytes = n * DTYPE_BITS[dtype] // 8
    if not nbytes:
        return torch.empty(shape, dtype=_torch_dtype(dtype))
    buf = bytearray(nbytes)
    f.seek(offset)
    view = memoryview(buf)
    got = 0
    while got < nbytes:
        k = f.readinto(view[got:])
        if not k:
            raise UnsupportedInputError(f.name, "file ended inside a tensor")
        got += k
    return torch.frombuffer(buf, dtype=_torch_dtype(dtype)).reshape(shape)


class _AdapterTensors:
    """Adapter tensors on demand, each dropped after the last output tensor that needs it (fused-expert
    factors serve every expert), and never more than ``budget`` bytes held."""

    def __init__(self, ckpt: Checkpoint, uses: dict[str, int] | None = None, budget: int = 256 << 20) -> None:
        self.ckpt = ckpt
        self.budget = budget
        self.uses = dict(uses or {})
        self.cache: OrderedDict[str, Any] = OrderedDict()
        self.size = 0
        self._bin: dict[str, Any] | None = None

    def done_with(self, edits: list[_Edit]) -> None:
        """One output tensor that used ``edits`` is written."""
        for e in edits:
            for key in e.keys.values():
                self.uses[key] = self.uses.get(key, 1) - 1
                if self.uses[key] <= 0 and key in self.cache:
                    self.size -= self.cache.pop(key).numel() * 4

    def get(self, key: str) -> Any:
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        if self.ckpt.weights_format == "bin":
            if self._bin is None:
                from adapterdoc.checkpoint import load_bin

                assert self.ckpt.weights_path is not None
                self._bin = load_bin(self.ckpt.weights_path)
            t = self._bin[self.ckpt.original_names.get(key, key)].float()
        else:
            path = self.ckpt.tensor_file[key]
            header = next(h for h in self.ckpt.headers if h.path == path)
            info = self.ckpt.tensors[key]
            with open(path, "rb") as f:
                t = _read(f, header.data_start + info.begin, info.dtype, info.shape).float()
        self.cache[key] = t
        self.size += t.numel() * 4
        while self.size > self.budget and len(self.cache) > 1:
            _, old = self.cache.popitem(last=False)
            self.size -= old.numel() * 4
        return t


def _delta(edit: _Edit, piece: Any, tensors: _AdapterTensors, rows: tuple[int, int] | None = None) -> Any:
    """PEFT's ``get_delta_weight`` for ``edit``'s module, restricted to ``piece`` (and its ``rows``), float32."""
    t = edit.target
    a = tensors.get(edit.keys["A"])
    b = tensors.get(edit.keys["B"])
    if t.kind == "embedding":  # lora_embedding_A [r, num_embeddings], lora_embedding_B [dim, r]
        if rows is not None:
            a = a[:, rows[0] : rows[1]]
        return piece.take((b @ a).T.mul_(t.scaling))
    if t.kind == "linear":
        if rows is not None:  # only without fan_in_fan_out (see _row_blocks)
            b = b[rows[0] : rows[1]]
        d = b @ a
        if t.fan_in_fan_out:
            d = d.T
        return piece.take(d.mul_(t.scaling))
    # fused experts (PEFT's ParamWrapper): lora_A [r·E, in] is expert-major, lora_B [out, r·E] is rank-major.
    e_count = t.num_experts
    if e_count == 1:
        return piece.take((b @ a).mul_(t.scaling))
    r = a.shape[0] // e_count
    if piece.expert is not None:
        a_e = a.reshape(e_count, r, a.shape[-1])[piece.expert]
        b_e = b.reshape(b.shape[0], r, e_count)[:, :, piece.expert]
        d = (b_e @ a_e).mul_(t.scaling)
        if not t.experts_out_in:
            d = d.T
        return piece.take(d, expert_selected=True)
    import torch

    a3 = a.reshape(e_count, r, a.shape[-1])
    b3 = b.reshape(b.shape[0], r, e_count)
    spec = "o r e, e r i -> e o i" if t.experts_out_in else "o r e, e r i -> e i o"
    return piece.take(torch.einsum(spec, b3, a3).mul_(t.scaling))


def _apply(
    w: Any, edits: list[_Edit], piece: Any, tensors: _AdapterTensors, rows: tuple[int, int] | None = None
) -> Any:
    """Apply ``edits`` to ``w`` (float32, the piece's rows ``rows`` or all of it), PEFT's formulas in its order."""
    import torch

    r0, r1 = rows if rows is not None else (0, w.shape[0] if w.dim() else 1)
    for e in edits:
        if e.kind == "replace":
            value = piece.take(tensors.get(e.keys["value"]))
            w = (value[r0:r1] if rows is not None else value).clone()
        elif e.kind == "lora":
            w.add_(_delta(e, piece, tensors, rows))
        elif e.kind == "dora":
            d = _delta(e, piece, tensors, rows)
            m = tensors.get(e.keys["magnitude"])
            merged = w.add_(d)
            if e.target.kind == "embedding":  # norm over the vocabulary: whole tensor only
                norm = torch.linalg.norm(merged.T, dim=1).to(merged.dtype)
                w = (m / norm).view(1, -1) * merged
            else:
                norm = torch.linalg.norm(merged, dim=1).to(merged.dtype)
                w = (m[r0:r1] / norm).view(-1, 1) * merged
        elif e.kind == "bias":
            w.add_(tensors.get(e.keys["bias"]) * e.target.scaling)
        elif e.kind == "tokens":
            idx = torch.tensor(e.target.token_indices, dtype=torch.long)
            delta = tensors.get(e.keys["delta"]).to(w.dtype)
            keep = (idx >= r0) & (idx < r1)
            w = w.index_copy(0, idx[keep] - r0, delta[keep])
    return w


class _NotFinite(Exception):
    def __init__(self, tensor: str) -> None:
        super().__init__(tensor)
        self.tensor = tensor


# ----------------------------------------------------------------------------------------------- write


def _header_bytes(metadata: dict[str, str] | None, outs: list[_Output]) -> bytes:
    infos = []
    pos = 0
    for o in outs:
        infos.append(TensorInfo(o.name, o.dtype, tuple(o.shape), pos, pos + o.nbytes))
        pos += o.nbytes
    raw = serialize_header(metadata if metadata is not None else {"format": "pt"}, infos)
    raw += b" " * ((8 - (8 + len(raw)) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _write(
    plan: _Plan, out_path: str, dtype: str, *, force: bool, progress: Progress | None
) -> tuple[int, int, int]:
    tmp = make_temp_folder(out_path)
    try:
        counts = _fill(plan, tmp, dtype, progress)
        write_marker(tmp, "merge", adapter=plan.adapter.spec, base=plan.base.spec, dtype=dtype)
        slow_point("merge-before-rename")
        replace_folder(tmp, out_path, force=force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return counts


def _return_freed_memory() -> None:
    """Make glibc hand large freed blocks back to the system (a fixed mmap threshold).

    The merge allocates and frees blocks of a few MiB on two threads; with glibc's default dynamic threshold
    they end up in the heap, which then grows to a large fraction of the model size without being trimmed
    (measured: 1.6 GB peak for a 1.1 GiB merge, 0.48 GB with the threshold fixed). No-op elsewhere.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB (also turns the dynamic adjustment off)


def _fill(plan: _Plan, folder: str, dtype: str, progress: Progress | None) -> tuple[int, int, int]:
    _return_freed_memory()
    uses: dict[str, int] = {}
    for _, _, outs in plan.shards:
        for o in outs:
            for e in o.edits:
                for key in e.keys.values():
                    uses[key] = uses.get(key, 0) + 1
    tensors = _AdapterTensors(plan.adapter, uses)
    total = sum(sum(o.nbytes for o in outs) for _, _, outs in plan.shards)
    done = 0
    n_tensors = n_merged = 0
    weight_map: dict[str, str] = {}
    written_bytes = 0
    writer = _Writer()
    try:
        for rel, header, outs in plan.shards:
            dest = os.path.join(folder, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            head = _header_bytes(header.metadata, outs)
            with open(dest, "wb", buffering=0) as f, open(header.path, "rb") as src:
                writer.put(f, head)
                for o in outs:
                    assert o.source is not None
                    start = header.data_start + o.source.begin
                    if not o.edits and o.dtype == o.source.dtype:
                        writer.copy(f, src, start, o.source.nbytes)  # in the kernel, no buffers here
                    else:
                        for block in _blocks(o, src, start, plan, tensors):
                            writer.put(f, block)
                        n_merged += 1 if o.edits else 0
                        tensors.done_with(o.edits)
                    done += o.nbytes
                    n_tensors += 1
                    weight_map[o.name] = rel
                    if progress:
                        progress(done, total)
                writer.flush()
            written_bytes += len(head) + sum(o.nbytes for o in outs)
            slow_point("merge-shard")
    finally:
        writer.close()
    _write_index(plan, folder, weight_map, total)
    _copy_side_files(plan, folder, dtype)
    return n_tensors, n_merged, written_bytes


def _row_blocks(o: _Output, piece: Any) -> bool:
    """Whether ``o`` can be computed a run of rows at a time (every edit is row-local)."""
    if not o.shape or not piece.whole:
        return False
    for e in o.edits:
        t = e.target
        if e.kind in ("replace", "tokens"):
            continue
        if e.kind == "lora" and t.kind in ("linear", "embedding") and not t.fan_in_fan_out:
            continue
        if e.kind == "dora" and t.kind == "linear" and not t.fan_in_fan_out:
            continue
        return False
    return True


def _blocks(o: _Output, src: Any, start: int, plan: _Plan, tensors: _AdapterTensors) -> Any:
    """The output bytes of one tensor that needs computing (merged, or cast), a block of rows at a time."""
    import torch

    assert o.source is not None
    piece = plan.pieces.get(o.name)
    shape = tuple(o.shape)
    in_dtype = o.source.dtype
    rows = shape[0] if shape else 1
    row_elems = o.source.numel // rows if rows else 0
    blocked = not o.edits or _row_blocks(o, piece)
    step = max(1, _BLOCK_BYTES // max(4 * row_elems, 1)) if blocked else rows
    row_bytes = row_elems * DTYPE_BITS[in_dtype] // 8
    for r0 in range(0, max(rows, 1), step):
        r1 = min(rows, r0 + step)
        sub = (r1 - r0, *shape[1:]) if shape else shape
        w = _read(src, start + r0 * row_bytes, in_dtype, sub)
        if o.edits:
            w = _apply(w.float(), o.edits, piece, tensors, (r0, r1) if blocked else None)
            # one reduction instead of an elementwise isfinite pass; inf/nan always reach the sum
            if not math.isfinite(float(w.sum())) and not bool(torch.isfinite(w).all()):
                raise _NotFinite(o.name)
        w = w.to(_torch_dtype(o.dtype)).contiguous()
        yield memoryview(w.reshape(-1).view(torch.uint8).numpy())


class _Writer:
    """Writes to the output files in order on one thread, so computing the next block overlaps writing the
    last one. At most ``depth`` blocks wait (bounded memory); byte-for-byte copies run in the kernel."""

    def __init__(self, depth: int = 2) -> None:
        import queue
        import threading

        self.q: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="adapterdoc-merge-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.q.get()
            if job is None:
                return
            if self.error is None:
                try:
                    job()
                except BaseException as e:  # re-raised on the main thread
                    self.error = e

    def _submit(self, job: Any) -> None:
        if self.error is not None:
            raise self.error
        self.q.put(job)

    def put(self, f: Any, data: Any) -> None:
        def job() -> None:
            view = memoryview(data)
            while view:
                n = f.write(view)
                view = view[n:]

        self._submit(job)

    def copy(self, f: Any, src: Any, offset: int, n: int) -> None:
        out_fd, in_fd = f.fileno(), src.fileno()

        def job() -> None:
            pos, left = offset, n
            while left:
                try:
                    k = os.sendfile(out_fd, in_fd, pos, min(left, 1 << 30))
                except OSError as e:
                    if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        raise
                    k = len(chunk := os.pread(in_fd, min(left, _COPY_CHUNK), pos))
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out_fd, view) :]
                if not k:
                    raise UnsupportedInputError(src.name, "file ended inside a tensor")
                pos += k
                left -= k

        self._submit(job)

    def flush(self) -> None:
        """Wait until every queued job ran; raise what one of them raised."""
        import threading

        done = threading.Event()
        self.q.put(done.set)
        done.wait()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()


def _write_index(plan: _Plan, folder: str, weight_map: dict[str, str], total: int) -> None:
    base = plan.base
    if base.index_path is None:
        return
    with open(base.index_path, "rb") as f:
        data = json.loads(f.read().decode("utf-8"))
    meta = dict(data.get("metadata") or {}) if isinstance(data.get("metadata"), dict) else {}
    meta["total_size"] = total
    new_map = dict(data["weight_map"])
    for name in plan.added:
        new_map[name] = weight_map[name]
    out = {**data, "metadata": meta, "weight_map": new_map}
    with open(os.path.join(folder, os.path.basename(base.index_path)), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")


def _copy_side_files(plan: _Plan, folder: str, dtype: str) -> None:
    """config.json, tokenizer, generation and processor files: every top-level regular file but weights."""
    root = plan.base.root
    for name in sorted(os.listdir(root)):
        src = os.path.join(root, name)
        if name.startswith(".") or not os.path.isfile(src):
            continue
        if name.endswith(_WEIGHT_SUFFIXES) or name.endswith(".index.json") or name.startswith(TEMP_PREFIX):
            continue
        dst = os.path.join(folder, name)
        if name == "config.json" and (dtype != "auto" or plan.untie):
            with open(src, "rb") as f:
                cfg = json.loads(f.read().decode("utf-8"))
            _edit_config(cfg, DTYPES_TORCH.get(dtype), plan.untie)
            with open(dst, "w", encoding="utf-8") as f:
                json.dump(cfg, f, indent=2, sort_keys=True)
                f.write("\n")
        else:
            shutil.copyfile(src, dst)


DTYPES_TORCH = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def _edit_config(cfg: Any, dtype: str | None, untie: bool) -> None:
    if isinstance(cfg, dict):
        for k in list(cfg):
            if dtype and k in ("dtype", "torch_dtype") and isinstance(cfg[k], str):
                cfg[k] = dtype
            elif untie and k == "tie_word_embeddings":
                cfg[k] = False
            else:
                _edit_config(cfg[k], dtype, untie)
        if untie and "tie_word_embeddings" not in cfg and "architectures" in cfg:
            cfg["tie_word_embeddings"] = False
