"""Every verify output format, rendered from one shared report, against golden files.

Regenerate after an intended change: ``ADAPTERDOC_UPDATE_GOLDEN=1 python -m pytest tests/report/test_formats.py``.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from adapterdoc.report.findings import make
from adapterdoc.report.github import escape_data, escape_property, render_github
from adapterdoc.report.junit import render_junit
from adapterdoc.report.render import to_json
from adapterdoc.report.verify_text import render_verify
from adapterdoc.verify import VerifyOptions, VerifyReport, VerifyRun

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
GOOD = "adapters/good"
BAD = "adapters/vl-on-text"
BROKEN = "adapters/missing"


@pytest.fixture
def run() -> VerifyRun:
    return sample_run()


def sample_run() -> VerifyRun:
    """One run with a passing adapter, a failing one (layout move, zero lora_B module, vLLM rank), an unusable one."""
    good = VerifyReport(
        adapter=GOOD,
        path=GOOD,
        layout="ministral3_text",
        base_layout="ministral3_text",
        lora_b={"nonzero": 28, "total": 28},
        dtypes={"F32": 56},
        config={"expected_keys": 56},
        served_as="text",
        findings=[
            make("AD229", "scaling lora_alpha / r = 2 (r 2, lora_alpha 4)", path=GOOD),
            make(
                "AD416", "vLLM 0.33.0: served as text: inferred: the base is Ministral3ForCausalLM", path=GOOD
            ),
        ],
    )
    cmd = f"adapterdoc remap {BAD} --vl"
    key = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"
    bad = VerifyReport(
        adapter=BAD,
        path=BAD,
        layout="mistral3_vl",
        base_layout="ministral3_text",
        missing=["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"],
        unexpected=[key],
        lora_b={"nonzero": 27, "total": 28},
        dtypes={"BF16": 56},
        config={"expected_keys": 56},
        move={
            "kind": "layout",
            "from": "mistral3_vl",
            "to": "ministral3_text",
            "description": "VL adapter on a text-only base (adapter keys use mistral3_vl names, the base "
            "ministral3_text names)",
            "command": cmd,
        },
        served_as="text",
        findings=[
            make(
                "AD223",
                "VL adapter on a text-only base; the 56 mismatched key(s) all match after the move",
                path=BAD,
                hint=cmd,
            ),
            make(
                "AD221",
                "56 adapter key(s) match nothing, e.g. 'a,b:c' 100% dropped",
                path=BAD,
                key=key,
                hint=cmd,
            ),
            make(
                "AD411",
                "vLLM 0.33.0: LoRA rank 64 is greater than max_lora_rank 16",
                path=BAD,
                hint="start the server with --max-lora-rank 64 and verify with the same value",
            ),
            make(
                "AD302",
                "lora_B is all zero (27 of 28 are not)",
                path=BAD,
                key="base_model.model.model.language_model.layers.3.mlp.down_proj.lora_B.weight",
            ),
            make("AD229", "scaling lora_alpha / r = 2 (r 64, lora_alpha 128)\nsecond line", path=BAD),
        ],
    )
    broken = VerifyReport(adapter=BROKEN, error=f"{BROKEN}: no such file or directory")
    options = VerifyOptions(profile="vllm", max_lora_rank=16)
    return VerifyRun(
        base="tiny:ministral3_text",
        options=options,
        adapters=[good, bad, broken],
        base_info={
            "kind": "tiny",
            "has_weights": True,
            "model_type": "ministral3",
            "layout": "ministral3_text",
        },
    )


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("ADAPTERDOC_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; set ADAPTERDOC_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8")


def test_text_golden(run: VerifyRun, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    text = render_verify(run, width=80)
    check_golden("verify.txt", text)
    assert "\x1b[" not in text


def test_json_golden(run: VerifyRun) -> None:
    text = to_json(run.to_dict()) + "\n"
    check_golden("verify.json", text)
    d = json.loads(text)
    assert d["ok"] is False and d["profile"] == "vllm" and d["vllm_version"] == "0.33.0"
    assert [a["adapter"] for a in d["adapters"]] == [GOOD, BAD, BROKEN]
    assert len(d["findings"]) == 8 and all(f["path"] in (GOOD, BAD) for f in d["findings"][:7])
    assert d["findings"][7]["code"] == "AD100" and d["findings"][7]["path"] == BROKEN  # the unusable adapter


def test_junit_golden_and_parses(run: VerifyRun) -> None:
    text = render_junit(run)
    check_golden("verify.junit.xml", text)
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    cases = suites[0].findall("testcase")
    assert [c.get("name") for c in cases] == [GOOD, BAD, BROKEN]
    assert (
        suites[0].get("tests") == "3" and suites[0].get("failures") == "1" and suites[0].get("errors") == "1"
    )
    good, bad, broken = cases
    assert good.find("failure") is None and good.find("error") is None
    failure = bad.find("failure")
    assert failure is not None and failure.get("type") == "AD223"
    assert "adapterdoc remap adapters/vl-on-text --vl" in (failure.text or "")
    assert "AD302" in (bad.findtext("system-out") or "")
    assert broken.find("error") is not None
    props = {p.get("name"): p.get("value") for p in suites[0].iter("property")}
    assert props == {
        "base": "tiny:ministral3_text",
        "profile": "vllm",
        "max_lora_rank": "16",
        "vllm_version": "0.33.0",
    }


def test_github_golden(run: VerifyRun) -> None:
    text = render_github(run)
    check_golden("verify.github.txt", text)
    lines = text.splitlines()
    annotations = lines[:-1]
    assert all(line.startswith(("::error ", "::warning ", "::notice ")) for line in annotations)
    assert sum(line.startswith("::error ") for line in annotations) == 4
    assert sum(line.startswith("::warning ") for line in annotations) == 1
    assert lines[-1] == "adapterdoc verify: 1 of 3 adapter(s) passed"
    assert all("\n" not in line for line in annotations)


def test_github_escaping() -> None:
    assert escape_data("100% a\nb\r") == "100%25 a%0Ab%0D"
    assert escape_property("a,b:c") == "a%2Cb%3Ac"


def test_every_format_names_every_adapter(run: VerifyRun) -> None:
    for text in (
        render_verify(run, width=80),
        to_json(run.to_dict()),
        render_junit(run),
        render_github(run),
    ):
        assert GOOD in text and BAD in text and BROKEN in text


def test_github_annotations_attach_to_the_adapters_files(run: VerifyRun) -> None:
    """A folder is not something GitHub can annotate: every finding names adapter_config.json or the weights."""
    for line in render_github(run).splitlines()[:-1]:
        file = line.split("file=", 1)[1].split(",", 1)[0]
        if "unusable input" in line:
            assert file == BROKEN
        elif "(key: " in line:  # a tensor finding
            assert file.endswith("/adapter_model.safetensors"), line
        else:
            assert file.endswith("/adapter_config.json"), line


def test_github_annotation_lines_point_at_the_config_field(tmp_path: Path) -> None:
    folder = tmp_path / "my adapter"
    folder.mkdir()
    config = {"r": 8, "lora_alpha": 16, "modules_to_save": ["lm_head"], "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "adapter_model.bin").write_bytes(b"")
    tensor = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    report = VerifyReport(
        adapter=str(folder),
        path=str(folder),
        findings=[
            make("AD403", "modules_to_save is set", path=str(folder), key="modules_to_save"),
            make("AD303", "1 NaN value(s)", path=str(folder), key=tensor),
            make("AD229", "scaling", path=str(folder)),
        ],
    )
    single = tmp_path / "loose.safetensors"
    loose = VerifyReport(
        adapter=str(single), path=str(single), findings=[make("AD229", "scaling", path=str(single))]
    )
    bare = tmp_path / "bare"  # weights but no adapter_config.json (its config was inferred): the weights file
    bare.mkdir()
    (bare / "adapter_model.safetensors").write_bytes(b"")
    inferred = VerifyReport(
        adapter=str(bare), path=str(bare), findings=[make("AD231", "inferred", path=str(bare))]
    )
    adapters = [report, loose, inferred]
    text = render_github(VerifyRun(base="tiny:x", options=VerifyOptions(), adapters=adapters))
    cfg = escape_property(str(folder / "adapter_config.json"))
    assert text.splitlines()[:5] == [
        f"::error file={cfg},line=4,title=AD403 vllm-modules-to-save::modules_to_save is set (key: modules_to_save)",
        f"::error file={escape_property(str(folder / 'adapter_model.bin'))},title=AD303 non-finite-weights::"
        f"1 NaN value(s) (key: {tensor})",
        f"::notice file={cfg},title=AD229 lora-scaling::scaling",
        f"::notice file={escape_property(str(single))},title=AD229 lora-scaling::scaling",
        f"::warning file={escape_property(str(bare / 'adapter_model.safetensors'))},title=AD231 "
        "adapter-config-inferred::inferred",
    ]
