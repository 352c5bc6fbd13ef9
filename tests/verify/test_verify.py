"""`verify` against PEFT itself: for every tiny layout, our missing/unexpected sets equal `PeftModel.load_adapter`'s."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from adapterdoc.layouts import LAYOUTS

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from safetensors.torch import load_file, save_file  # noqa: E402

from adapterdoc.ml.tiny import TINY_LAYOUTS  # noqa: E402
from adapterdoc.verify import VerifyOptions, verify  # noqa: E402

pytestmark = pytest.mark.ml

COUNTERPARTS = [(name, lay.text_counterpart) for name, lay in LAYOUTS.items() if lay.text_counterpart]


def lora_config(layout: str, **kw: Any) -> Any:
    from adapterdoc.train.lora import lora_config as registry_config

    exclude = kw.pop("exclude_modules", True)
    r, alpha = kw.pop("r", 2), kw.pop("lora_alpha", None)
    kw = {"init_lora_weights": False, **kw}
    return registry_config(layout, r=r, alpha=alpha, exclude=exclude if exclude is not None else False, **kw)


def _weights(path: str) -> str:
    return os.path.join(path, "adapter_model.safetensors")


def _rewrite(path: str, edit: Callable[[dict[str, Any]], None], dtype: Any = None) -> None:
    state = load_file(_weights(path))
    edit(state)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    save_file(state, _weights(path), metadata={"format": "pt"})


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _module_keys(state: dict[str, Any]) -> dict[str, list[str]]:
    mods: dict[str, list[str]] = {}
    for k in sorted(state):
        mods.setdefault(k.split(".lora_")[0], []).append(k)
    return mods


def _drop_one(state: dict[str, Any]) -> None:
    mods = _module_keys(state)
    for k in mods[sorted(mods)[len(mods) // 2]]:
        del state[k]


def _add_extra(state: dict[str, Any]) -> None:
    """Copy one module's tensors to a layer index no tiny model has."""
    mods = _module_keys(state)
    src = next(m for m in sorted(mods) if ".layers.0." in m)
    for k in mods[src]:
        state[k.replace(".layers.0.", ".layers.7.")] = state[k].clone()


VARIANTS: dict[str, Callable[[dict[str, Any]], None] | None] = {
    "clean": None,
    "missing": _drop_one,
    "extra": _add_extra,
}


@pytest.fixture(scope="session")
def make_adapter(tmp_path_factory: Any, tiny_model: Any) -> Callable[..., str]:
    """``make_adapter(layout, variant="clean", **lora_kw)``: a PEFT-saved adapter dir (cached per arguments)."""
    cache: dict[Any, str] = {}

    def make(layout: str, variant: str = "clean", dtype: Any = None, **kw: Any) -> str:
        key = (layout, variant, str(dtype), json.dumps(kw, sort_keys=True, default=str))
        if key not in cache:
            out = str(tmp_path_factory.mktemp(f"ad-{layout}-{variant}"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(1)
                pm = peft.get_peft_model(tiny_model(layout), lora_config(layout, **kw))
                pm.save_pretrained(out)
            edit = VARIANTS.get(variant)
            if edit is not None or dtype is not None:
                _rewrite(out, edit or (lambda s: None), dtype)
            cache[key] = out
        return cache[key]

    return make


def peft_oracle(tiny_model: Any, base_layout: str, adapter: str) -> tuple[list[str], list[str]]:
    """What PEFT itself reports: `load_adapter`'s missing (adapter name removed) and unexpected keys."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.PeftModel.from_pretrained(tiny_model(base_layout), adapter, adapter_name="first")
        res = pm.load_adapter(adapter, adapter_name="oracle")
    missing = sorted(k.replace(".oracle.", ".").removesuffix(".oracle") for k in res.missing_keys)
    return missing, sorted(res.unexpected_keys)


def run_one(adapter: str, base: str, **kw: Any) -> Any:
    run = verify([adapter], base, VerifyOptions(**kw))
    assert run.adapters[0].error is None, run.adapters[0].error
    return run.adapters[0]


def codes(report: Any, severity: str | None = None) -> set[str]:
    return {f.code for f in report.findings if severity is None or f.severity == severity}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("layout", TINY_LAYOUTS)
def test_keys_match_peft_oracle(layout: str, variant: str, make_adapter: Any, tiny_model: Any) -> None:
    adapter = make_adapter(layout, variant)
    report = run_one(adapter, f"tiny:{layout}", scan="nonzero")
    missing, unexpected = peft_oracle(tiny_model, layout, adapter)
    assert report.missing == missing
    assert report.unexpected == unexpected
    assert report.base_layout == layout
    if variant == "clean":
        assert (missing, unexpected) == ([], [])
        assert report.ok, [f.to_dict() for f in report.findings if f.severity == "error"]
        assert report.shape_mismatch == []
        assert report.lora_b["nonzero"] == report.lora_b["total"] > 0
    elif variant == "missing":
        assert missing and not unexpected
        assert "AD220" in codes(report, "error") and not report.ok
    else:
        assert unexpected and not missing
        assert "AD221" in codes(report, "error") and not report.ok


@pytest.mark.parametrize(("src", "dst"), COUNTERPARTS)
def test_unmapped_counterpart_adapter_is_diagnosed(
    src: str, dst: str, make_adapter: Any, tiny_model: Any
) -> None:
    adapter = make_adapter(src)
    report = run_one(adapter, f"tiny:{dst}", scan="nonzero")
    missing, unexpected = peft_oracle(tiny_model, dst, adapter)
    assert (report.missing, report.unexpected) == (missing, unexpected)
    assert missing and unexpected
    assert report.move is not None and report.move["from"] == src
    move = next(f for f in report.findings if f.code == "AD223")
    assert move.severity == "error"
    strip_only = LAYOUTS[src].remaps.get(dst) == (LAYOUTS["qwen3_5_vl"].remaps["qwen3_5_text"][0],)
    expected_cmd = (
        f"adapterdoc remap {adapter} --vl" if strip_only else f"adapterdoc remap {adapter} --to {dst}"
    )
    assert move.hint == expected_cmd
    assert {f.hint for f in report.findings if f.code in ("AD220", "AD221")} == {expected_cmd}


def test_diagnosed_move_really_fixes_the_load(make_adapter: Any, tiny_model: Any, tmp_path: Any) -> None:
    """Apply the diagnosed rename (as remap would) and PEFT loads every key on the text base."""
    from adapterdoc.adapter import parse_key
    from adapterdoc.layouts import STRIP_LANGUAGE_MODEL

    adapter = make_adapter("qwen3_5_moe_vl")
    report = run_one(adapter, "tiny:qwen3_5_moe_text", scan="nonzero")
    assert report.move["command"].endswith("--vl")
    out = tmp_path / "moved"
    out.mkdir()
    state = load_file(_weights(adapter))
    moved = {}
    for k, v in state.items():
        m = parse_key(k).module
        moved[k.replace(m, STRIP_LANGUAGE_MODEL.apply(m), 1)] = v
    save_file(moved, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_bytes(_read(os.path.join(adapter, "adapter_config.json")))
    assert peft_oracle(tiny_model, "qwen3_5_moe_text", str(out)) == ([], [])
    assert run_one(str(out), "tiny:qwen3_5_moe_text", scan="nonzero").ok


def test_peft_config_rewrite_is_reflected(make_adapter: Any, tmp_path: Any) -> None:
    """PEFT moves gate/up/down_proj to target_parameters on qwen3_moe (and saves the rewritten config). An adapter
    whose config still has the original list loads the same; verify expects what PEFT builds and says so."""
    adapter = make_adapter(
        "qwen3_moe_text",
        "clean",
        target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"],
        target_parameters=None,
    )
    saved = json.loads(_read(os.path.join(adapter, "adapter_config.json")))
    assert saved["target_parameters"] and saved["rank_pattern"]  # PEFT wrote the rewritten form
    original = dict(
        saved,
        target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"],
        target_parameters=None,
        rank_pattern={},
        alpha_pattern={},
    )
    (tmp_path / "adapter_config.json").write_text(json.dumps(original))
    (tmp_path / "adapter_model.safetensors").write_bytes(_read(_weights(adapter)))
    report = run_one(str(tmp_path), "tiny:qwen3_moe_text", scan="nonzero")
    assert report.ok, [f.to_dict() for f in report.findings if f.severity == "error"]
    rewrite = next(f for f in report.findings if f.code == "AD225")
    assert "gate_up_proj" in rewrite.message
    assert report.config["peft_rewrite"]["target_parameters"] == ["down_proj", "gate_up_proj"]
    assert report.config["peft_rewrite"]["rank_pattern"] == {r".*\.gate_up_proj": 4}


def test_shape_mismatch_against_other_size(make_adapter: Any, tmp_path: Any) -> None:
    adapter = make_adapter("ministral3_text")
    cfg = json.loads(_read(os.path.join(adapter, "adapter_config.json")))
    cfg["r"] = 4  # config says 4, tensors have 2
    bad = tmp_path / "r4"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps(cfg))
    (bad / "adapter_model.safetensors").write_bytes(_read(_weights(adapter)))
    report = run_one(str(bad), "tiny:ministral3_text", scan="nonzero")
    assert report.shape_mismatch and not report.missing and not report.unexpected
    assert {"AD222", "AD204"} <= codes(report, "error")
    detail = report.shape_details[0]
    assert 2 in detail["adapter"] and 4 in detail["expected"]


# --------------------------------------------------------------------------------------------- weights


def test_zero_lora_b_fails(make_adapter: Any, tmp_path: Any) -> None:
    adapter = make_adapter("qwen3_5_text", "clean", init_lora_weights=True)  # PEFT's default: lora_B = 0
    report = run_one(adapter, "tiny:qwen3_5_text")
    assert report.lora_b == {"nonzero": 0, "total": report.lora_b["total"]} and report.lora_b["total"] > 0
    assert "AD301" in codes(report, "error") and not report.ok


def test_single_zero_module_warns(make_adapter: Any, tmp_path: Any) -> None:
    adapter = make_adapter("ministral3_text")
    path = str(tmp_path / "one")
    os.mkdir(path)
    state = load_file(_weights(adapter))
    key = sorted(k for k in state if k.endswith("lora_B.weight"))[3]
    state[key] = torch.zeros_like(state[key])
    save_file(state, os.path.join(path, "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "one" / "adapter_config.json").write_bytes(
        _read(os.path.join(adapter, "adapter_config.json"))
    )
    report = run_one(path, "tiny:ministral3_text")
    assert report.ok
    zero = [f for f in report.findings if f.code == "AD302"]
    assert [f.key for f in zero] == [key] and zero[0].severity == "warning"
    assert report.lora_b["nonzero"] == report.lora_b["total"] - 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("where", ["lora_A", "lora_B"])
def test_nan_fails(where: str, dtype: str, make_adapter: Any, tmp_path: Any) -> None:
    adapter = make_adapter("ministral3_text")
    path = tmp_path / "nan"
    path.mkdir()
    state = {k: v.to(getattr(torch, dtype)) for k, v in load_file(_weights(adapter)).items()}
    key = sorted(k for k in state if k.endswith(f"{where}.weight"))[5]
    state[key][0, 1] = float("nan")
    state[key][1, 0] = float("inf")
    save_file(state, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    (path / "adapter_config.json").write_bytes(_read(os.path.join(adapter, "adapter_config.json")))
    report = run_one(str(path), "tiny:ministral3_text")
    assert report.nonfinite == {key: 2}
    assert "AD303" in codes(report, "error") and not report.ok
    if dtype == "bfloat16":
        assert report.dtypes == {"BF16": len(state)}
    if where == "lora_A":  # lora-b scans only lora_B
        assert run_one(str(path), "tiny:ministral3_text", scan="lora-b").nonfinite == {}


# --------------------------------------------------------------------------------------------- profiles


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        (dict(use_dora=True), "AD402"),
        (dict(modules_to_save=["lm_head"]), "AD403"),
        (dict(r=64, lora_alpha=128), "AD411"),
    ],
    ids=["dora", "modules_to_save", "rank64"],
)
def test_fails_only_under_vllm(kw: dict[str, Any], code: str, make_adapter: Any) -> None:
    adapter = make_adapter("ministral3_text", "clean", **kw)
    peft_report = run_one(adapter, "tiny:ministral3_text", scan="nonzero")
    assert peft_report.ok, [f.to_dict() for f in peft_report.findings if f.severity == "error"]
    assert (peft_report.missing, peft_report.unexpected, peft_report.shape_mismatch) == ([], [], [])
    vllm_report = run_one(adapter, "tiny:ministral3_text", profile="vllm", scan="nonzero")
    assert code in codes(vllm_report, "error") and not vllm_report.ok
    assert all("vLLM 0.33.0" in f.message for f in vllm_report.findings if f.code.startswith("AD4"))
    if code == "AD411":
        assert run_one(adapter, "tiny:ministral3_text", profile="vllm", max_lora_rank=64, scan="nonzero").ok


def test_vllm_clean_adapter_passes(make_adapter: Any) -> None:
    report = run_one(make_adapter("qwen3_5_moe_vl"), "tiny:qwen3_5_moe_vl", profile="vllm", scan="nonzero")
    assert report.ok and report.served_as == "vl"
    assert "AD416" in codes(report)


def test_vllm_full_path_check_served_as_text(make_adapter: Any) -> None:
    """A VL adapter on a VL base is clean for PEFT, but not for a server running the text-only class."""
    adapter = make_adapter("qwen3_5_vl")
    assert run_one(adapter, "tiny:qwen3_5_vl", profile="vllm", scan="nonzero").ok
    report = run_one(adapter, "tiny:qwen3_5_vl", profile="vllm", served_as="text", scan="nonzero")
    path = next(f for f in report.findings if f.code == "AD415")
    assert path.severity == "error" and path.hint == f"adapterdoc remap {adapter} --vl"
    assert report.served_as == "text"


def test_vllm_full_path_check_text_adapter_on_vl_server(make_adapter: Any) -> None:
    adapter = make_adapter("mistral3_vl")
    text = make_adapter("ministral3_text")
    report = run_one(text, "tiny:ministral3_text", profile="vllm", served_as="vl", scan="nonzero")
    assert report.missing == [] and report.unexpected == []  # PEFT on the text class is fine...
    path = next(f for f in report.findings if f.code == "AD415")  # ...but the VL server has other names
    assert path.hint == f"adapterdoc remap {text} --to mistral3_vl"
    assert (
        run_one(adapter, "tiny:ministral3_text", profile="vllm", served_as="vl", scan="nonzero").served_as
        == "vl"
    )


def test_vllm_tower_lora_dropped(make_adapter: Any) -> None:
    adapter = make_adapter("qwen3_5_vl", "clean", exclude_modules=None, target_modules=["q_proj", "qkv"])
    report = run_one(adapter, "tiny:qwen3_5_vl", profile="vllm", scan="nonzero")
    assert {"AD414"} <= codes(report, "error")
    assert "AD227" in codes(report, "warning") and "AD202" in codes(report)
    assert run_one(adapter, "tiny:qwen3_5_vl", scan="nonzero").ok  # PEFT loads it fine


def test_several_adapters_one_unusable(make_adapter: Any, tmp_path: Any) -> None:
    good = make_adapter("ministral3_text")
    run = verify([good, str(tmp_path / "nope")], "tiny:ministral3_text", VerifyOptions(scan="nonzero"))
    assert [a.ok for a in run.adapters] == [True, False]
    assert run.adapters[1].error and "no such file" in run.adapters[1].error
    assert run.exit_code == 3
    d = run.to_dict()
    assert d["ok"] is False and len(d["adapters"]) == 2


def test_bare_safetensors_file_infers_config(make_adapter: Any) -> None:
    adapter = make_adapter("ministral3_text")
    report = run_one(_weights(adapter), "tiny:ministral3_text", scan="nonzero")
    assert "AD231" in codes(report, "warning")
    assert report.missing == [] and report.unexpected == []


@pytest.mark.parametrize(("src", "dst"), COUNTERPARTS)
def test_printed_remap_command_fixes_the_adapter(
    src: str, dst: str, make_adapter: Any, cli: Any, tmp_path: Any
) -> None:
    """Run the exact command verify prints (through the real `remap`), then verify again: clean, and PEFT agrees."""
    import shlex
    import shutil

    copy = str(tmp_path / "adapter")
    shutil.copytree(make_adapter(src), copy)
    before = run_one(copy, f"tiny:{dst}", scan="nonzero")
    argv = shlex.split(before.move["command"])
    assert argv[:3] == ["adapterdoc", "remap", copy]
    result = cli(*argv[1:])
    assert result.exit_code == 0, result.output
    after = run_one(copy, f"tiny:{dst}", scan="nonzero")
    assert (after.missing, after.unexpected, after.shape_mismatch) == ([], [], [])
    assert after.ok, [f.to_dict() for f in after.findings if f.severity == "error"]


def test_keys_on_excluded_modules(make_adapter: Any, tiny_model: Any, tmp_path: Any) -> None:
    """Tower LoRA tensors next to a config whose exclude_modules keeps PEFT off the tower: PEFT drops them without a
    word; verify reports them as unexpected and says the exclusion is why."""
    adapter = make_adapter("qwen3_5_vl", "clean", exclude_modules=None, target_modules=["q_proj", "qkv"])
    cfg = json.loads(_read(os.path.join(adapter, "adapter_config.json")))
    cfg["exclude_modules"] = LAYOUTS["qwen3_5_vl"].exclude_regex
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    (tmp_path / "adapter_model.safetensors").write_bytes(_read(_weights(adapter)))
    report = run_one(str(tmp_path), "tiny:qwen3_5_vl", scan="nonzero")
    assert (report.missing, report.unexpected) == peft_oracle(tiny_model, "qwen3_5_vl", str(tmp_path))
    assert report.unexpected and all(".visual." in k for k in report.unexpected) and not report.missing
    excluded = [f for f in report.findings if f.code == "AD224"]
    assert excluded and all("exclude_modules" in f.message for f in excluded)
    assert {f.key for f in excluded} == {"model.visual.blocks.0.attn.qkv"}


def test_ungathered_zero3_shards(make_adapter: Any, tmp_path: Any) -> None:
    """ZeRO-3 saved without gathering: empty tensors. PEFT's load fails on the shapes; verify says why."""
    adapter = make_adapter("ministral3_text")
    state = load_file(_weights(adapter))
    for k in state:
        state[k] = torch.empty(0)
    save_file(state, str(tmp_path / "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "adapter_config.json").write_bytes(_read(os.path.join(adapter, "adapter_config.json")))
    report = run_one(str(tmp_path), "tiny:ministral3_text", scan="nonzero")
    assert len(report.shape_mismatch) == len(state)
    mismatch = [f for f in report.findings if f.code == "AD222"]
    assert mismatch and all("ZeRO-3" in f.message for f in mismatch)
    assert "AD301" in codes(report, "error")  # nothing non-zero to find either
