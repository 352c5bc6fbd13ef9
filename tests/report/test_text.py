"""Human (text) output of every command, each rendered from one shared report against a golden file at 80 columns.

Regenerate after an intended change: ``ADAPTERDOC_UPDATE_GOLDEN=1 python -m pytest tests/report/test_text.py``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_formats import sample_run

from adapterdoc.inspection import FileSummary, InspectReport, LoraSummary
from adapterdoc.layouts import Detection
from adapterdoc.merge import MergeReport
from adapterdoc.remap import ConfigChange, RemapReport
from adapterdoc.report import render
from adapterdoc.report.findings import make
from adapterdoc.report.inspect_text import render_inspect
from adapterdoc.report.merge_text import render_merge
from adapterdoc.report.remap_text import render_remap
from adapterdoc.report.roundtrip_text import render_roundtrip
from adapterdoc.report.smoke_report import CHECK_NAMES, CheckResult, LayoutRun, SmokeReport
from adapterdoc.report.train_text import render_smoke
from adapterdoc.report.verify_text import render_verify
from adapterdoc.roundtrip import Check, RoundtripReport
from adapterdoc.verify import OWN_BASE, VerifyOptions, VerifyReport, VerifyRun

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
AD = "runs/quick/qwen3_5_vl/adapter"
VL = "base_model.model.model.language_model.layers.{i}.{m}.lora_{ab}.weight"
TEXT = "base_model.model.model.layers.{i}.{m}.lora_{ab}.weight"
MODULES = [
    f"{p}.{leaf}"
    for p, leaves in (
        ("linear_attn", ("in_proj_qkv", "in_proj_z", "out_proj")),
        ("mlp", ("down_proj", "gate_proj", "up_proj")),
    )
    for leaf in leaves
]
"""Six modules a layer, four layers, + one attention module: 25 modules, 50 keys (the Qwen3.5 quickstart's)."""
MODULE_PATHS = [
    *[f"model.language_model.layers.{i}.{m}" for i in range(4) for m in MODULES][:24],
    "model.language_model.layers.3.self_attn.q_proj",
]
FIX = f"adapterdoc remap {AD} --vl"


@pytest.fixture(autouse=True)
def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("COLUMNS", raising=False)


def _vl_keys() -> list[str]:
    return [f"base_model.model.{m}.lora_{ab}.weight" for m in MODULE_PATHS for ab in "AB"]


def _lora(target_modules: Any) -> LoraSummary:
    leaves: dict[str, int] = {}
    for m in MODULE_PATHS:
        leaves[m.rsplit(".", 1)[1]] = leaves.get(m.rsplit(".", 1)[1], 0) + 1
    return LoraSummary(
        modules=25,
        ranks={8: 25},
        alpha=16,
        scaling=2.0,
        use_rslora=False,
        use_dora=False,
        target_modules=target_modules,
        exclude_modules=r"(^|.*\.)(visual|mtp)(\..*|$)",
        target_parameters=[],
        modules_to_save=[],
        rank_pattern={},
        alpha_pattern={},
        per_prefix={"model.language_model.layers": 25},
        per_leaf=dict(sorted(leaves.items())),
        fused_expert_modules=0,
        embedding_modules=0,
        config_r=8,
        peft_type="LORA",
    )


def _inspect(target_modules: Any, findings: list[Any], files: int = 1) -> InspectReport:
    if files == 1:
        summaries = [FileSummary(f"{AD}/adapter_model.safetensors", 140_206, 7_088, 50)]
    else:
        summaries = [
            FileSummary(f"{AD}/model-{i:05d}-of-{files:05d}.safetensors", 4_900_000_000, 9_000 + i, 120 + i)
            for i in range(1, files + 1)
        ]
    return InspectReport(
        spec=AD,
        kind="adapter",
        files=summaries,
        tensors=50,
        parameters=33_280,
        bytes=140_206,
        dtypes={"F32": 50},
        metadata={"format": "pt"},
        layout=Detection(
            "qwen3_5_vl",
            (
                r"25 module(s) match /^model\.language_model\.layers\.\d+\.(self_attn|mlp|linear_attn)\.[^.]+$/",
                "Gated-DeltaNet in_proj_qkv (Qwen3.5 linear attention): 3 module(s)",
            ),
        ),
        lora=_lora(target_modules),
        findings=findings,
    )


@pytest.fixture
def inspect_report() -> InspectReport:
    """A Qwen3.5 VL adapter whose config has no target_modules: 25 AD205 warnings, one per module."""
    findings = [
        make("AD205", "no target_modules/target_parameters entry selects this module", path=AD, key=m)
        for m in MODULE_PATHS
    ]
    return _inspect(None, findings)


@pytest.fixture
def sharded_report() -> InspectReport:
    return _inspect(["q_proj"], [], files=3)


@pytest.fixture
def remap_report() -> RemapReport:
    """``remap --vl`` of the quickstart adapter: 50 renames of one pattern, a config change, a note."""
    mapping = {k: k.replace(".language_model.", ".") for k in _vl_keys()}
    return RemapReport(
        input=AD,
        mode="vl",
        strategy="copy",
        mapping=mapping,
        source_layout="qwen3_5_vl",
        target_layout="qwen3_5_text",
        weights=f"{AD}/adapter_model.safetensors",
        out="runs/quick/text-adapter",
        config_changes=[
            ConfigChange("base_model_name_or_path", "tiny:qwen3_5_vl", "tiny:qwen3_5_text", "towers"),
            ConfigChange(
                "target_modules", ["q_proj", "up_proj"], ["up_proj", "model.layers.3.self_attn.qkv"], "rules"
            ),
        ],
        written=[
            "runs/quick/text-adapter/adapter_config.json",
            "runs/quick/text-adapter/adapter_model.safetensors",
        ],
        notes=[
            "adapter_config.json auto_mapping still names Qwen3_5ForConditionalGeneration (kept): "
            "AutoPeftModel.from_pretrained would build that class; load the Qwen3_5ForCausalLM base yourself"
        ],
        findings=[
            make(
                "AD202",
                "LoRA on the vision tower stays behind: no text-only module takes it",
                path=AD,
                key="base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight",
            )
        ],
    )


@pytest.fixture
def merge_report() -> MergeReport:
    """A text adapter merged into a VL base: nothing matches, 25 AD501 errors sharing one fix."""
    unused = [m.replace("language_model.", "") for m in MODULE_PATHS]
    hint = (
        "the adapter's names fit qwen3_5_text, the base is Qwen3_5ForConditionalGeneration: "
        "adapterdoc remap runs/quick/text --to qwen3_5_vl"
    )
    return MergeReport(
        adapter="runs/quick/text",
        base="runs/quick/qwen3_5_vl/base",
        out=None,
        dtype="auto",
        applied=[],
        unused=unused,
        model_class="Qwen3_5ForConditionalGeneration",
        findings=[
            make(
                "AD501",
                f"`{m}` is not a module PEFT creates on this base for the adapter's config",
                key=m,
                hint=hint if i == 0 else None,
            )
            for i, m in enumerate(unused)
        ]
        + [
            make(
                "AD505",
                "25 module(s) PEFT creates for this config have no tensors in the adapter "
                "(e.g. `model.language_model.layers.0.linear_attn.out_proj`); they merge as no-ops",
            )
        ],
    )


@pytest.fixture
def merge_ok_report() -> MergeReport:
    return MergeReport(
        adapter=AD,
        base="runs/quick/qwen3_5_vl/base",
        out="runs/merged",
        dtype="auto",
        applied=MODULE_PATHS,
        model_class="Qwen3_5ForConditionalGeneration",
        tensors=77,
        merged_tensors=25,
        bytes_written=1_814_000,
        seconds=11.8,
    )


@pytest.fixture
def roundtrip_report() -> RoundtripReport:
    return RoundtripReport(
        input=AD,
        layout="qwen3_5_vl",
        base=None,
        checks=[
            Check(
                "remap:qwen3_5_vl→qwen3_5_text→qwen3_5_vl",
                "pass",
                "50 keys renamed (in-place), 50 back (in-place); weights byte-identical, config identical",
                0.02,
            ),
            Check("format:safetensors↔bin", "fail", "tensor `base_model.model.x.lora_A.weight` differs", 3.7),
            Check(
                "load/save/merge/counterpart",
                "skipped",
                "no --base: the model-level round trips need base weights (a model folder with weights, "
                "or tiny:LAYOUT)",
            ),
        ],
        findings=[make("AD701", "the .bin copy does not read back identically", path=AD, key="x")],
    )


@pytest.fixture
def smoke_report() -> SmokeReport:
    def layout_run(layout: str, failed: tuple[str, ...] = (), skipped: tuple[str, ...] = ()) -> LayoutRun:
        checks = [
            CheckResult(
                n,
                None if n in skipped else n not in failed,
                "max |Δ| 0.0" if n not in failed else "outputs differ by 0.31 (max |Δ|)",
                f"adapterdoc.{n}",
            )
            for n in CHECK_NAMES
        ]
        return LayoutRun(layout, "causal", 6.903, 6.136, 6.902, 6.143, 0.1, 0.7, checks, seconds=2.8)

    return SmokeReport(
        runs=[
            layout_run("qwen3_5_vl"),
            layout_run("qwen3_omni_thinker", failed=("remap", "merge")),
            layout_run("modernbert_mlm", skipped=("remap", "towers")),
        ],
        steps=8,
        out="runs/smoke",
        seconds=31.4,
        import_seconds=7.5,
    )


@pytest.fixture
def run() -> VerifyRun:
    """The verify report test_formats renders as json, junit and github too."""
    return sample_run()


@pytest.fixture
def own_bases_run() -> VerifyRun:
    """verify without --base: each adapter against the base its config names (no base info for the header)."""
    keys = [k.replace(".language_model.", ".") for k in _vl_keys()]
    bad = VerifyReport(
        adapter="runs/quick/qwen3_5_vl/adapter-qwen3_5_text",
        path="runs/quick/qwen3_5_vl/adapter-qwen3_5_text",
        layout="qwen3_5_text",
        base_layout="qwen3_5_vl",
        missing=_vl_keys(),
        unexpected=keys,
        lora_b={"nonzero": 25, "total": 25},
        dtypes={"F32": 50},
        config={"expected_keys": 50},
        move={"command": "adapterdoc remap runs/quick/qwen3_5_vl/adapter-qwen3_5_text --to qwen3_5_vl"},
        served_as="vl",
    )
    cmd = bad.move["command"]  # type: ignore[index]
    bad = dataclasses.replace(
        bad,
        findings=[
            make(
                "AD220",
                "50 LoRA key(s) that PEFT creates on Qwen3_5ForConditionalGeneration are not in the "
                "adapter (they stay at their zero initialisation)",
                path=bad.adapter,
                key=_vl_keys()[0],
                hint=cmd,
            ),
            make(
                "AD221",
                "50 adapter key(s) match nothing on Qwen3_5ForConditionalGeneration and would be dropped "
                "without a warning",
                path=bad.adapter,
                key=keys[0],
                hint=cmd,
            ),
            make(
                "AD223",
                "text-only adapter on a VL base (adapter keys use qwen3_5_text names, the base qwen3_5_vl "
                "names); the 50 mismatched key(s) all match Qwen3_5ForConditionalGeneration after the move",
                path=bad.adapter,
                hint=cmd,
            ),
            make("AD229", "scaling lora_alpha / r = 2 (r 8, lora_alpha 16)", path=bad.adapter),
        ],
    )
    good = VerifyReport(
        adapter=AD,
        path=AD,
        layout="qwen3_5_vl",
        base_layout="qwen3_5_vl",
        lora_b={"nonzero": 25, "total": 25},
        dtypes={"F32": 50},
        config={"expected_keys": 50},
        findings=[make("AD229", "scaling lora_alpha / r = 2 (r 8, lora_alpha 16)", path=AD)],
    )
    return VerifyRun(base=OWN_BASE, options=VerifyOptions(), adapters=[bad, good])


RENDERERS: dict[str, tuple[str, Callable[..., str]]] = {
    "inspect": ("inspect_report", render_inspect),
    "inspect_sharded": ("sharded_report", render_inspect),
    "remap": ("remap_report", render_remap),
    "merge": ("merge_report", render_merge),
    "merge_ok": ("merge_ok_report", render_merge),
    "roundtrip": ("roundtrip_report", render_roundtrip),
    "train_smoke": ("smoke_report", render_smoke),
    "verify": ("run", render_verify),
    "verify_own_bases": ("own_bases_run", render_verify),
}


def _render(name: str, request: pytest.FixtureRequest, width: int | None = 80) -> tuple[str, Any]:
    fixture, fn = RENDERERS[name]
    report = request.getfixturevalue(fixture)
    return fn(report, width=width), report


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("ADAPTERDOC_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; set ADAPTERDOC_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", list(RENDERERS))
def test_golden(name: str, request: pytest.FixtureRequest) -> None:
    text, _ = _render(name, request)
    _check_golden(f"{name}.txt" if name != "verify" else "verify.txt", text)
    assert "\x1b[" not in text and text.endswith("\n") and "\n\n\n" not in text


def _unbreakable(report: Any) -> set[str]:
    """Every key, path and module name a report holds: the only things allowed past the line's end."""
    out: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, str):
            out.update(t.strip("`'\",;()") for t in x.split())
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple, set)):
            for v in x:
                walk(v)
        elif hasattr(x, "__dict__"):
            walk(vars(x))

    walk(report)
    return {t for t in out if len(t) > 40}


@pytest.mark.parametrize("name", list(RENDERERS))
def test_every_line_fits_80_columns(name: str, request: pytest.FixtureRequest) -> None:
    text, report = _render(name, request, width=80)
    allowed = _unbreakable(report)
    for line in text.splitlines():
        if len(line) <= 80:
            continue
        words = line.split()
        # a key too long for any line stands alone, after at most a label (`at`, `e.g.`, `→`)
        assert (
            words[-1] in allowed and len(words) <= 2 and (len(words) == 1 or words[0] in ("at", "e.g.", "→"))
        ), line
        assert len(words[-1]) > 80 - 8, line  # it would not have fitted after any indent


@pytest.mark.parametrize("name", list(RENDERERS))
def test_wider_terminal_only_rewraps(name: str, request: pytest.FixtureRequest) -> None:
    """The same words at 80 and at 120 columns; nothing is cut, folded or padded to the width."""
    narrow, _ = _render(name, request, width=80)
    wide, _ = _render(name, request, width=120)
    assert narrow.split() == wide.split()
    fixed = ("train_smoke", "inspect_sharded")  # short lines only: the same at any width
    assert max(map(len, wide.splitlines())) > 80 or name in fixed
    assert all(line == line.rstrip() for line in (narrow + wide).splitlines())


def test_identical_findings_are_one_line_with_a_count(inspect_report: InspectReport) -> None:
    text = render_inspect(inspect_report, width=80)
    lines = [line for line in text.splitlines() if "AD205" in line]
    assert lines == ["warning AD205 ×25 no target_modules/target_parameters entry selects this module"]
    assert (
        "e.g. model.language_model.layers.0.linear_attn.in_proj_qkv and 24 more; --json lists them"
        in " ".join(text.split())
    )
    assert text.splitlines()[-1] == "25 warnings"
    one = render_inspect(_inspect(["q_proj"], inspect_report.findings[:1]), width=80)
    assert "AD205 ×" not in one and "at model.language_model.layers.0.linear_attn.in_proj_qkv" in one


def test_a_lone_info_finding_is_one_line(run: VerifyRun) -> None:
    text = render_verify(run, width=80)
    good = text.split("\n\n")[1]
    assert "  info AD229 scaling lora_alpha / r = 2 (r 2, lora_alpha 4)" in good.splitlines()
    assert "┃" not in text and "│" not in text and "Findings" not in text


def test_a_fix_shown_for_the_adapter_is_not_repeated_per_finding(run: VerifyRun) -> None:
    text = render_verify(run, width=80)
    assert text.count("adapterdoc remap adapters/vl-on-text --vl") == 1
    assert "  fix: adapterdoc remap adapters/vl-on-text --vl" in text.splitlines()


def test_verify_header_without_base_says_whose_base(own_bases_run: VerifyRun) -> None:
    text = render_verify(own_bases_run, width=80)
    assert text.splitlines()[:3] == [
        "adapterdoc verify",
        "  base: each adapter's own (its base_model_name_or_path)",
        "  profile: peft",
    ]
    assert "()" not in text and OWN_BASE not in text
    assert text.splitlines()[-1] == "FAIL 1 of 2 adapters passed (1 failed); 3 errors, 2 info"


def test_verify_header_with_a_base_names_it(run: VerifyRun) -> None:
    head = render_verify(run, width=80).splitlines()[:3]
    assert head == [
        "adapterdoc verify",
        "  base: tiny:ministral3_text (ministral3, layout ministral3_text)",
        "  profile: vllm 0.33.0, max LoRA rank 16",
    ]
    run.base_info.clear()
    assert render_verify(run, width=80).splitlines()[1] == "  base: tiny:ministral3_text"


@pytest.mark.parametrize(
    ("mode", "source", "target", "note", "title"),
    [
        (
            "vl",
            "qwen3_5_text",
            None,
            "no key contains `.language_model.`: the adapter is already in text form",
            "remap --vl: layout qwen3_5_text",
        ),
        (
            "to",
            "qwen3_5_text",
            "qwen3_5_text",
            "the rules rename no key",
            "remap --to qwen3_5_text: the adapter is already qwen3_5_text",
        ),
        ("rule", None, None, "the rules rename no key", "remap --rule"),
    ],
)
def test_a_no_op_remap_says_so(
    mode: str, source: str | None, target: str | None, note: str, title: str
) -> None:
    report = RemapReport(
        input=AD,
        mode=mode,
        strategy="none",
        mapping={},
        source_layout=source,
        target_layout=target,
        dry_run=True,
        notes=[note, "dry run: nothing was written"],
    )
    lines = render_remap(report, width=80).splitlines()
    assert lines == [
        AD,
        f"  {title}",
        "  nothing to rename",
        f"  note: {note}",
        "  note: dry run: nothing was written",
    ]
    assert "?" not in "\n".join(lines)


def test_remap_shows_each_rename_pattern_once(remap_report: RemapReport) -> None:
    lines = render_remap(remap_report, width=80).splitlines()
    i = lines.index("    50 keys: base_model.model.model.language_model.layers.*")
    assert lines[i + 1] == "           → base_model.model.model.layers.*"
    assert not any(k in line for line in lines for k in remap_report.mapping)  # no key-by-key listing
    rules = {
        f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_{ab}.weight": f"base_model.model.model.layers.{i}.self_attn.qkv.lora_{ab}.weight"
        for i in range(3)
        for ab in "AB"
    }
    rules["model.norm.weight"] = "model.final_norm.weight"
    text = render_remap(RemapReport(input=AD, mode="rule", strategy="in-place", mapping=rules), width=80)
    assert "    6 keys: base_model.model.model.layers.*.self_attn.q_proj.*" in text.splitlines()
    assert "          → base_model.model.model.layers.*.self_attn.qkv.*" in text.splitlines()
    assert (
        "    1 key: model.norm.weight" in text.splitlines() and "         → model.final_norm.weight" in text
    )


def test_merge_groups_unused_modules_and_shows_the_fix_once(merge_report: MergeReport) -> None:
    text = render_merge(merge_report, width=80)
    assert "  nothing written" in text and "  unused: 25 modules" in text.splitlines()
    assert [line for line in text.splitlines() if "AD501" in line] == [
        "error AD501 ×25 `model.layers.0.linear_attn.in_proj_qkv` is not a module PEFT"
    ]
    assert "and 24 more like it; --json lists them" in text
    assert text.count("adapterdoc remap runs/quick/text --to qwen3_5_vl") == 1
    assert text.splitlines()[-1] == "25 errors, 1 info"


def test_train_smoke_table_fits_and_counts_checks(smoke_report: SmokeReport) -> None:
    lines = render_smoke(smoke_report, width=80).splitlines()
    header = next(line for line in lines if line.startswith("layout"))
    assert header.split() == ["layout", "train", "loss", "val", "loss", "val", "acc", "checks", "s"]
    rows = {
        line.split()[0]: line.split()
        for line in lines
        if line.split() and line.split()[0] in ("qwen3_5_vl", "qwen3_omni_thinker", "modernbert_mlm")
    }
    n = len(CHECK_NAMES)
    assert rows["qwen3_5_vl"][-2] == f"✓{n}" and rows["qwen3_omni_thinker"][-3:-1] == [f"✓{n - 2}", "✗2"]
    assert rows["modernbert_mlm"][-3:-1] == [f"✓{n - 2}", "–2"]
    assert "2/3 layouts passed in 31.4 s (imports 7.5 s); outputs in runs/smoke" in lines
    assert "✗ qwen3_omni_thinker remap: outputs differ by 0.31 (max |Δ|)" in lines
    assert all(name in " ".join(lines) for name in CHECK_NAMES)  # the legend names every check


def test_roundtrip_summary_like_pytest(roundtrip_report: RoundtripReport) -> None:
    lines = render_roundtrip(roundtrip_report, width=80).splitlines()
    assert lines[-1] == "1 failed, 1 passed, 1 skipped in 3.7 s"
    assert "  ✗ fail format:safetensors↔bin (3.70 s)" in lines


# --------------------------------------------------------------------------------------------- width, colour


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_width_is_80_off_a_terminal_and_columns_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    assert render.output_width(io.StringIO()) == 80
    monkeypatch.setenv("COLUMNS", "132")
    assert render.output_width(io.StringIO()) == 132
    monkeypatch.setenv("COLUMNS", "20")
    assert render.output_width(io.StringIO()) == render.MIN_WIDTH


def test_colour_only_on_a_terminal_without_no_color(
    monkeypatch: pytest.MonkeyPatch, inspect_report: InspectReport
) -> None:
    monkeypatch.setattr("sys.stdout", _Tty())
    monkeypatch.delenv("NO_COLOR")
    coloured = render_inspect(inspect_report, width=80)
    assert "\x1b[" in coloured
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in render_inspect(inspect_report, width=80)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    monkeypatch.delenv("NO_COLOR")
    plain = render_inspect(inspect_report, width=80)
    assert "\x1b[" not in plain and re.sub(r"\x1b\[[0-9;]*m", "", coloured) == plain


def test_markup_in_messages_is_printed_literally() -> None:
    w = render.Writer(80)
    render.write_findings(w, [make("AD205", "[bold]not markup[/] and a trailing backslash \\", key="a[b]")])
    assert w.getvalue() == ("warning AD205 [bold]not markup[/] and a trailing backslash \\\n    at a[b]\n")


def test_commands_and_backticked_names_never_break() -> None:
    w = render.Writer(40)
    w.para("fix: first run", "adapterdoc remap some/long/path/to/an/adapter --vl", "then `a b c d` again")
    lines = w.getvalue().splitlines()
    assert "adapterdoc remap some/long/path/to/an/adapter --vl" in lines[1] and "`a b c d`" in w.getvalue()
    assert all(len(line) <= 40 for line in lines if "adapterdoc" not in line)


# --------------------------------------------------------------------------------------------- the real CLI

LABELS = ("at", "e.g.", "→")


def _assert_fits(text: str, width: int = 80) -> None:
    for line in text.splitlines():
        if len(line) > width:
            words = line.split()
            assert len(words) == 1 or (len(words) == 2 and words[0] in LABELS), line


def test_real_commands_fit_80_columns_off_a_terminal(tmp_path: Path, cli: Any) -> None:
    """Header commands in a subprocess (stdout a pipe, no COLUMNS) and verify in-process: 80 columns, grouped."""
    import subprocess
    import sys

    from tests.remap.test_remap import make_adapter, peft_config

    ad = make_adapter(tmp_path / "ad", config=peft_config(target_modules=None))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    outs = {}
    for args in (["inspect", str(ad)], ["remap", str(ad), "--vl", "--dry-run"]):
        proc = subprocess.run(
            [sys.executable, "-m", "adapterdoc", *args], capture_output=True, text=True, env=env, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert "\x1b[" not in proc.stdout
        _assert_fits(proc.stdout)
        outs[args[0]] = proc.stdout
    assert [line for line in outs["inspect"].splitlines() if "AD205" in line] == [
        "warning AD205 ×8 no target_modules/target_parameters entry selects this module"
    ]
    assert "    16 keys: base_model.model.model.language_model.layers.*" in outs["remap"].splitlines()
    vl = make_adapter(tmp_path / "vl")
    res = cli("verify", str(vl), "--base", "tiny:qwen3_5_text")
    assert res.exit_code == 1
    _assert_fits(res.stdout)
    lines = res.stdout.splitlines()
    assert lines[-1].startswith("FAIL 0 of 1 adapter passed (1 failed); ")
    assert [line.split()[:2] for line in lines if " AD22" in line][:2] == [
        ["error", "AD220"],
        ["error", "AD221"],
    ]


_word = st.text(alphabet="abcxyz._/-×→", min_size=1, max_size=30)
"""Words without backticks (a backticked span is one unbreakable unit, tested above)."""


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(_word, min_size=1, max_size=40),
    width=st.integers(40, 120),
    indent=st.integers(0, 8),
    hang=st.integers(0, 8),
)
def test_wrapping_keeps_every_word_and_the_width(
    words: list[str], width: int, indent: int, hang: int
) -> None:
    w = render.Writer(width)
    w.para(" ".join(words), indent=indent, hang=hang)
    lines = w.getvalue().splitlines()
    assert " ".join(lines).split() == " ".join(words).split()  # nothing lost, nothing broken mid-word
    for n, line in enumerate(lines):
        pad = indent if n == 0 else hang
        assert line.startswith(" " * pad) and not line[pad:].startswith(" ")
        assert (
            len(line) <= width or len(line[pad:].split()) == 1
        )  # only a lone over-long word passes the width


def test_every_explanation_fits_80_columns() -> None:
    from adapterdoc.codes import catalogue
    from adapterdoc.commands.explain_cmd import render_code

    for info in catalogue().values():
        text = render_code(info, width=80)
        _assert_fits(text)
        assert text.startswith(f"{info.code} {info.name} (") and " ".join(info.why.split()) in " ".join(
            text.split()
        )
