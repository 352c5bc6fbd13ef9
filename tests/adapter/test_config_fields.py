"""adapter_config.json fields PEFT drops or misreads (AD110-AD114), unknown `[tool.adapterdoc]` keys, and the class an
adapter names (`auto_mapping`): remap keeps it true, verify builds the base as it.

Every PEFT behaviour the findings describe is pinned here against the installed PEFT first, then the finding."""

from __future__ import annotations

import dataclasses
import inspect as pyinspect
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.adapter import LOADING_FIELDS, LORA_CONFIG_FIELDS, PEFT_CONFIG_FIELDS, AdapterConfig
from adapterdoc.layouts import LAYOUTS, loadable_as

pytestmark = pytest.mark.ml

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from adapterdoc.ml.tiny import TINY_LAYOUTS, build_tiny, tiny_config  # noqa: E402

TEXT = "ministral3_text"
PAIRS = [
    (n, lay.text_counterpart) for n, lay in LAYOUTS.items() if lay.text_counterpart and n in TINY_LAYOUTS
]


@dataclasses.dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: str | os.PathLike[str] | None = None) -> Ran:
    """The CLI in-process (torch is imported once per test run), from ``cwd`` when given."""
    from click.testing import CliRunner

    from adapterdoc.cli import main

    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        r = CliRunner().invoke(
            main, list(args), env={"NO_COLOR": "1", "ADAPTERDOC_DEBUG": None}, catch_exceptions=False
        )
    finally:
        os.chdir(here)
    return Ran(r.exit_code, r.stdout, r.stderr)


def save_adapter(layout: str, out: Path, *, init: bool = False) -> Path:
    """A real PEFT adapter of the tiny ``layout`` model (non-zero lora_B), saved by PEFT itself, naming its base
    the way train-smoke does (``tiny:LAYOUT``)."""
    from adapterdoc.train.lora import lora_config

    cfg = lora_config(layout, r=2, alpha=None, exclude=True, init_lora_weights=init)
    model = peft.get_peft_model(build_tiny(layout), cfg)
    model.save_pretrained(str(out))
    edit(out, base_model_name_or_path=f"tiny:{layout}")
    return out


def edit(path: Path, *, drop: tuple[str, ...] = (), **changes: Any) -> None:
    p = path / "adapter_config.json"
    cfg = json.loads(p.read_text())
    for k in drop:
        cfg.pop(k, None)
    cfg.update(changes)
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def findings(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in report["findings"]:
        out.setdefault(f["code"], []).append(f)
    return out


@pytest.fixture(scope="module")
def text_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_adapter(TEXT, tmp_path_factory.mktemp("cfg") / "text")


@pytest.fixture
def adapter(text_adapter: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(text_adapter, tmp_path / "a"))


def inspect_json(path: Path) -> tuple[int, dict[str, Any]]:
    r = run_cli("inspect", str(path), "--json")
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def verify_json(path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    r = run_cli("verify", str(path), *extra, "--json")
    assert r.returncode in (0, 1), r.stderr
    out = json.loads(r.stdout)
    return r.returncode, out["adapters"][0]


# ------------------------------------------------------------------------------------- the known fields, vs PEFT


def test_known_fields_are_the_installed_peft_dataclass_fields() -> None:
    lora = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    base = {f.name for f in dataclasses.fields(peft.PeftConfig)}
    assert set(LORA_CONFIG_FIELDS) == lora
    assert set(PEFT_CONFIG_FIELDS) == base
    # what from_pretrained accepts is the constructor's signature; the same set
    assert lora == set(pyinspect.signature(peft.LoraConfig.__init__).parameters) - {"self"}
    assert set(LOADING_FIELDS) <= lora


def _peft_loads(tmp_path: Path, cfg: dict[str, Any]) -> tuple[Any, list[str]]:
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = peft.LoraConfig.from_pretrained(str(tmp_path))
    return loaded, [str(w.message) for w in caught]


def test_peft_drops_a_typo_with_a_warning_and_loads_the_default(tmp_path: Path) -> None:
    loaded, msgs = _peft_loads(
        tmp_path, {"peft_type": "LORA", "r": 8, "lora_alhpa": 32, "target_modules": ["q"]}
    )
    assert loaded.lora_alpha == 8  # the default, not 32
    assert any("Unexpected keyword arguments ['lora_alhpa']" in m for m in msgs), msgs


def test_peft_keeps_wrong_types_as_they_are(tmp_path: Path) -> None:
    loaded, msgs = _peft_loads(
        tmp_path,
        {
            "peft_type": "LORA",
            "r": 8,
            "target_modules": ["q_proj"],
            "use_dora": "false",
            "rank_pattern": {"q_proj": "4"},
        },
    )
    assert loaded.use_dora == "false" and loaded.rank_pattern == {"q_proj": "4"}  # no coercion, no warning
    assert not msgs


def test_peft_treats_the_string_false_as_true_and_crashes_on_string_ranks() -> None:
    """What AD112 and AD113 say PEFT does."""
    model = build_tiny(TEXT)
    cfg = peft.LoraConfig(r=2, target_modules=["q_proj"], use_dora="false", use_rslora="false")
    pm = peft.get_peft_model(model, cfg)
    q = pm.base_model.model.model.layers[0].self_attn.q_proj
    assert "default" in q.lora_magnitude_vector  # DoRA layers built from the string
    assert q.scaling["default"] == pytest.approx(8 / 2**0.5)  # rsLoRA scaling: alpha / sqrt(r)
    # fan_in_fan_out is not such a flag: PEFT sets it from the layer type (warning), so AD112 leaves it alone
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = peft.get_peft_model(
            build_tiny(TEXT), peft.LoraConfig(target_modules=["q_proj"], fan_in_fan_out="x")
        )
    assert pm.base_model.model.model.layers[0].self_attn.q_proj.fan_in_fan_out is False
    assert any("fan_in_fan_out is set to True" in str(w.message) for w in caught)
    with pytest.raises(TypeError):
        peft.get_peft_model(
            build_tiny(TEXT), peft.LoraConfig(r=2, target_modules=["q_proj"], rank_pattern={"q_proj": "4"})
        )
    with pytest.raises(TypeError):
        peft.get_peft_model(
            build_tiny(TEXT), peft.LoraConfig(r=2, target_modules=["q_proj"], rank_pattern={"q_proj": 4.0})
        )


# ------------------------------------------------------------------------------------- typos: inspect and verify


def test_typo_of_a_loading_field_is_an_error_in_inspect_and_verify(adapter: Path) -> None:
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    edit(adapter, drop=("lora_alpha",), lora_alhpa=cfg["lora_alpha"])
    code, report = inspect_json(adapter)
    assert code == 1 and report["ok"] is False
    (f,) = findings(report)["AD110"]
    assert f["severity"] == "error" and f["key"] == "lora_alhpa"
    assert "did you mean lora_alpha?" in f["message"] and "default lora_alpha (8)" in f["message"]
    assert f["path"].endswith("adapter_config.json")
    code, rep = verify_json(adapter, "--base", f"tiny:{TEXT}")
    assert code == 1 and [g["key"] for g in findings(rep)["AD110"]] == ["lora_alhpa"]


def test_typo_of_another_field_is_a_warning(adapter: Path) -> None:
    edit(adapter, drop=("lora_dropout",), lora_dropuot=0.05, zzz_tool_metadata={"x": 1})
    code, report = inspect_json(adapter)
    assert code == 0
    got = {f["key"]: f for f in findings(report)["AD111"]}
    assert set(got) == {"lora_dropuot", "zzz_tool_metadata"}
    assert "did you mean lora_dropout?" in got["lora_dropuot"]["message"]
    assert "did you mean" not in got["zzz_tool_metadata"]["message"]
    assert all(f["severity"] == "warning" for f in got.values())
    assert "AD110" not in findings(report)


def test_typo_beside_the_real_field_is_a_warning(adapter: Path) -> None:
    edit(adapter, lora_alhpa=32)  # lora_alpha is set too: PEFT uses it
    code, report = inspect_json(adapter)
    assert code == 0
    (f,) = findings(report)["AD111"]
    assert "also set" in f["message"] and "AD110" not in findings(report)


def test_a_clean_peft_config_has_no_field_findings(text_adapter: Path) -> None:
    _, report = inspect_json(text_adapter)
    assert not {"AD110", "AD111", "AD112", "AD113", "AD114"} & set(findings(report))


# ------------------------------------------------------------------------------------- types


def test_string_false_for_use_dora_is_reported_and_not_shown_as_dora(adapter: Path) -> None:
    edit(adapter, use_dora="false")
    code, report = inspect_json(adapter)
    assert code == 1
    (f,) = findings(report)["AD112"]
    assert f["key"] == "use_dora" and "treats it as true" in f["message"] and '"use_dora": false' in f["hint"]
    assert report["lora"]["use_dora"] is False
    code, rep = verify_json(adapter, "--base", f"tiny:{TEXT}")
    got = findings(rep)
    assert code == 1 and "AD112" in got and "AD230" not in got  # not called a DoRA adapter
    # PEFT builds DoRA layers from the string, so it expects magnitude vectors the file does not have
    assert rep["missing"] and all(".lora_magnitude_vector" in k for k in rep["missing"])
    assert AdapterConfig(json.loads((adapter / "adapter_config.json").read_text())).use_dora is False


def test_string_rank_pattern_value_is_reported_not_coerced(adapter: Path) -> None:
    edit(adapter, rank_pattern={"q_proj": "2"}, alpha_pattern={"k_proj": "4"})
    code, report = inspect_json(adapter)
    assert code == 1
    got = {f["key"]: f for f in findings(report)["AD113"]}
    assert set(got) == {"rank_pattern", "alpha_pattern"}
    assert "TypeError" in got["rank_pattern"]["message"] and "'q_proj'" in got["rank_pattern"]["message"]
    assert report["lora"]["rank_pattern"] == {"q_proj": "2"}  # shown as written
    assert "AD204" not in findings(report)  # no rank comparison against a coerced value
    code, rep = verify_json(adapter, "--base", f"tiny:{TEXT}")
    got = findings(rep)
    assert code == 1 and "AD113" in got and "AD226" in got  # PEFT refuses to inject it
    # and nothing else about keys: with no layer built, "matches nothing" / "not targeted" would be false
    assert not {"AD220", "AD221", "AD223", "AD224"} & set(got)


def test_modules_to_save_string_and_bad_bias_are_reported(adapter: Path) -> None:
    edit(adapter, modules_to_save="lm_head", bias="yes", layers_to_transform=False, fan_in_fan_out="false")
    code, report = inspect_json(adapter)
    assert code == 1
    assert {f["key"] for f in findings(report)["AD114"]} == {"modules_to_save", "bias", "layers_to_transform"}
    assert "AD112" not in findings(report)


def test_problems_are_in_file_order_and_name_the_field() -> None:
    cfg = AdapterConfig.parse(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 4,
                "tagret_modules": ["q_proj"],
                "use_rslora": "true",
                "velora_confg": 1,
            }
        ).encode()
    )
    got = [(p.code, p.field) for p in cfg.problems()]
    assert got == [("AD110", "tagret_modules"), ("AD111", "velora_confg"), ("AD112", "use_rslora")]
    assert cfg.use_rslora is False and cfg.scaling_for("x") == 8 / 4


# ------------------------------------------------------------------------------------- [tool.adapterdoc]


def test_unknown_tool_table_key_is_exit_3_with_the_known_keys(text_adapter: Path, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.adapterdoc]\nprofle = "vllm"\nbase = "tiny:ministral3_text"\n'
    )
    r = run_cli("verify", str(text_adapter), cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("adapterdoc: error: ") and "`profle`" in line and "did you mean profile?" in line
    assert "base, lora-target-modules, max-inert-share, max-lora-rank, profile, served-as" in line
    (tmp_path / "pyproject.toml").write_text("[tool.adapterdoc]\nmax_lora_rnk = 64\n")
    r = run_cli("verify", str(text_adapter), cwd=tmp_path)
    assert r.returncode == 3 and "did you mean max-lora-rank?" in r.stderr
    (tmp_path / "pyproject.toml").write_text("[tool.adapterdoc]\nmax_lora_rank = 64\nserved_as = 'text'\n")
    r = run_cli("verify", str(text_adapter), "--base", f"tiny:{TEXT}", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # underscores are still accepted


def test_pre_commit_hook_reads_the_table_the_same_way(text_adapter: Path, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.adapterdoc]\nprofle = "vllm"\n')
    code = "import sys; from adapterdoc.precommit import precommit_main; precommit_main(sys.argv[1:])"
    env = {**os.environ, "NO_COLOR": "1"}
    r = subprocess.run(
        [sys.executable, "-c", code, str(text_adapter / "adapter_config.json")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 3 and "`profle`" in r.stderr and "did you mean profile?" in r.stderr


# ------------------------------------------------------------------------------------- auto_mapping: the registry


@pytest.mark.parametrize("layout", TINY_LAYOUTS)
def test_registry_class_and_module_are_what_peft_writes(layout: str, tmp_path: Path) -> None:
    lay = LAYOUTS[layout]
    pm = peft.get_peft_model(build_tiny(layout), peft.LoraConfig(r=2, target_modules=list(lay.lora_leaves)))
    pm.save_pretrained(str(tmp_path))
    auto = json.loads((tmp_path / "adapter_config.json").read_text())["auto_mapping"]
    assert auto == {"base_model_class": lay.model_class, "parent_library": lay.model_module}


def test_every_layout_names_the_module_of_its_class() -> None:
    for lay in LAYOUTS.values():
        assert getattr(transformers, lay.model_class).__module__ == lay.model_module, lay.name


@pytest.mark.parametrize(("layout", "counterpart"), PAIRS)
def test_counterpart_class_builds_from_the_sub_config(layout: str, counterpart: str) -> None:
    chain = dict(loadable_as(layout))
    sub = tiny_config(layout)
    for attr in chain[counterpart]:
        sub = getattr(sub, attr)
    cls = getattr(transformers, LAYOUTS[counterpart].model_class)
    with torch.device("meta"):
        got = {n for n, _ in cls._from_config(sub).named_modules()}
    assert got == {n for n, _ in build_tiny(counterpart).named_modules()}


# ------------------------------------------------------------------------------------- auto_mapping: remap


@pytest.fixture(scope="module")
def vl_adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vl")
    return {layout: save_adapter(layout, root / layout) for layout, _ in PAIRS}


def _auto_mapping_text(path: Path) -> str:
    text = (path / "adapter_config.json").read_text()
    m = re.search(r'"auto_mapping": \{[^}]*\}', text)
    assert m, text
    return m.group(0)


@pytest.mark.parametrize(("layout", "counterpart"), PAIRS)
def test_remap_points_auto_mapping_at_the_counterpart_and_back(
    vl_adapters: dict[str, Path], layout: str, counterpart: str, tmp_path: Path
) -> None:
    src = vl_adapters[layout]
    out = tmp_path / "text"
    r = run_cli("remap", str(src), "--to", counterpart, "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    changes = {c["field"]: c for c in json.loads(r.stdout)["config_changes"]}
    assert changes["auto_mapping"]["how"] == "class"
    auto = json.loads((out / "adapter_config.json").read_text())["auto_mapping"]
    cp = LAYOUTS[counterpart]
    assert auto == {"base_model_class": cp.model_class, "parent_library": cp.model_module}
    back = tmp_path / "back"
    r = run_cli("remap", str(out), "--to", layout, "--out", str(back), "--json")
    assert r.returncode == 0, r.stderr
    assert _auto_mapping_text(back) == _auto_mapping_text(src)  # byte for byte


@pytest.mark.parametrize("how", ["vl", "rule"])
def test_vl_and_rule_remaps_update_auto_mapping_too(
    vl_adapters: dict[str, Path], how: str, tmp_path: Path
) -> None:
    src = vl_adapters["qwen3_5_vl"]
    flag = ["--vl"] if how == "vl" else ["--rule", r"\.language_model\.=>."]
    r = run_cli("remap", str(src), *flag, "--out", str(tmp_path / "t"), "--json")
    assert r.returncode == 0, r.stderr
    auto = json.loads((tmp_path / "t" / "adapter_config.json").read_text())["auto_mapping"]
    assert auto["base_model_class"] == "Qwen3_5ForCausalLM"


def test_in_place_round_trip_restores_the_config_bytes(vl_adapters: dict[str, Path], tmp_path: Path) -> None:
    a = Path(shutil.copytree(vl_adapters["mistral3_vl"], tmp_path / "a"))
    before = (a / "adapter_config.json").read_bytes()
    assert run_cli("remap", str(a), "--vl").returncode == 0
    assert json.loads((a / "adapter_config.json").read_text())["auto_mapping"] == {
        "base_model_class": "Ministral3ForCausalLM",
        "parent_library": "transformers.models.ministral3.modeling_ministral3",
    }
    assert run_cli("remap", str(a), "--to", "mistral3_vl").returncode == 0
    assert (a / "adapter_config.json").read_bytes() == before


def test_a_class_the_registry_does_not_know_is_kept(vl_adapters: dict[str, Path], tmp_path: Path) -> None:
    a = Path(shutil.copytree(vl_adapters["qwen3_5_vl"], tmp_path / "a"))
    mine = {"base_model_class": "MyQwenVL", "parent_library": "my_models"}
    edit(a, auto_mapping=mine)
    r = run_cli("remap", str(a), "--vl", "--out", str(tmp_path / "t"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "t" / "adapter_config.json").read_text())["auto_mapping"] == mine
    assert any("MyQwenVL" in n and "kept" in n for n in json.loads(r.stdout)["notes"])


# ------------------------------------------------------------------------------------- auto_mapping: verify


@pytest.mark.parametrize(("layout", "counterpart"), PAIRS)
def test_remapped_adapter_verifies_clean_without_base(
    vl_adapters: dict[str, Path], layout: str, counterpart: str, tmp_path: Path
) -> None:
    """train-smoke's ``adapter-<text>/``: remapped to the counterpart, naming the VL base ``tiny:LAYOUT``."""
    out = tmp_path / f"adapter-{counterpart}"
    assert run_cli("remap", str(vl_adapters[layout]), "--to", counterpart, "--out", str(out)).returncode == 0
    assert (
        json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == f"tiny:{layout}"
    )
    r = run_cli("verify", str(out), "--json")
    assert r.returncode == 0, r.stdout[-3000:]
    rep = json.loads(r.stdout)["adapters"][0]
    assert rep["ok"] and not (rep["missing"] or rep["unexpected"] or rep["shape_mismatch"])
    assert rep["config"]["model_class"] == LAYOUTS[counterpart].model_class
    assert rep["base_layout"] == counterpart
    (f,) = findings(rep)["AD115"]
    assert LAYOUTS[counterpart].model_class in f["message"]
    # the original VL adapter still verifies against the same base as its own class
    r = run_cli("verify", str(vl_adapters[layout]), "--json")
    assert r.returncode == 0, r.stdout[-3000:]
    assert "AD115" not in findings(json.loads(r.stdout)["adapters"][0])


def test_vllm_still_serves_the_base_as_its_own_class(vl_adapters: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "text"
    assert run_cli("remap", str(vl_adapters["qwen3_5_vl"]), "--vl", "--out", str(out)).returncode == 0
    r = run_cli("verify", str(out), "--profile", "vllm", "--json")
    rep = json.loads(r.stdout)["adapters"][0]
    assert rep["served_as"] == "vl"  # vLLM builds Qwen3_5ForConditionalGeneration from the VL folder
    assert r.returncode == 1 and "AD415" in findings(rep)


def test_a_stale_auto_mapping_does_not_hide_a_layout_mismatch(
    vl_adapters: dict[str, Path], tmp_path: Path
) -> None:
    """Keys decide: text-named keys on a VL base whose auto_mapping still says VL are diagnosed as before."""
    a = tmp_path / "text"
    assert run_cli("remap", str(vl_adapters["qwen3_5_vl"]), "--vl", "--out", str(a)).returncode == 0
    edit(a, auto_mapping={"base_model_class": "Qwen3_5ForConditionalGeneration", "parent_library": "x"})
    code, rep = verify_json(a, "--base", "tiny:qwen3_5_vl")
    assert code == 1 and "AD223" in findings(rep) and "AD115" not in findings(rep)


@pytest.mark.parametrize("layout", ["qwen3_5_vl", "modernbert_mlm"])
def test_remapped_adapter_loads_for_real_as_the_counterpart(
    vl_adapters: dict[str, Path], layout: str, tmp_path: Path
) -> None:
    """``--load`` builds the same class the key check did, with the base's own weights renamed onto it."""
    out = tmp_path / "text"
    cp = LAYOUTS[layout].text_counterpart
    assert run_cli("remap", str(vl_adapters[layout]), "--to", str(cp), "--out", str(out)).returncode == 0
    r = run_cli("verify", str(out), "--load", "--json")
    assert r.returncode == 0, r.stdout[-3000:]
    load = json.loads(r.stdout)["adapters"][0]["load"]
    assert load["lora_modules"] > 0 and load["missing"] == [] and load["unexpected"] == []
    assert load["max_abs_diff"] > 0


def test_other_adapter_types_are_not_judged_by_lora_fields() -> None:
    ia3 = AdapterConfig.parse(
        json.dumps(
            {"peft_type": "IA3", "feedforward_modules": ["down_proj"], "target_modules": ["k"]}
        ).encode()
    )
    assert ia3.problems() == []
    lora = AdapterConfig.parse(
        json.dumps({"peft_type": "LORA", "feedforward_modules": ["down_proj"]}).encode()
    )
    assert [p.code for p in lora.problems()] == ["AD111"]


@pytest.mark.parametrize(("field", "value"), [("r", "8"), ("r", 8.0), ("lora_alpha", "16")])
def test_wrong_type_for_r_or_alpha_crashes_peft_and_is_exit_3(adapter: Path, field: str, value: Any) -> None:
    with pytest.raises(TypeError):  # PEFT keeps the value and fails building the layers or the scaling
        peft.get_peft_model(build_tiny(TEXT), peft.LoraConfig(target_modules=["q_proj"], **{field: value}))
    edit(adapter, **{field: value})
    r = run_cli("inspect", str(adapter))
    assert r.returncode == 3 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert f"`{field}`" in line and "TypeError" in line
