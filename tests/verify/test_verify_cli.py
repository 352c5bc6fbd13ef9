"""`adapterdoc verify` on the command line: exit codes, formats, pyproject defaults, base directories, --load."""

from __future__ import annotations

import json
import os
import sys
import warnings
import xml.etree.ElementTree as ET
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")


pytestmark = pytest.mark.ml


def _save_adapter(model: Any, layout: str, out: str, **kw: Any) -> str:
    from adapterdoc.train.lora import lora_config

    args = lora_config(layout, r=kw.pop("r", 2), **{"init_lora_weights": False, **kw})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(2)
        peft.get_peft_model(model, args).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def adapters(tmp_path_factory: Any, tiny_model: Any) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli-adapters")
    return {
        "text": _save_adapter(tiny_model("ministral3_text"), "ministral3_text", str(root / "text")),
        "vl": _save_adapter(tiny_model("mistral3_vl"), "mistral3_vl", str(root / "vl")),
        "r64": _save_adapter(tiny_model("ministral3_text"), "ministral3_text", str(root / "r64"), r=64),
        "zero": _save_adapter(
            tiny_model("ministral3_text"), "ministral3_text", str(root / "zero"), init_lora_weights=True
        ),
    }


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory: Any, tiny_model: Any) -> Any:
    """``base_dir(layout, weights=True)``: the tiny base saved with save_pretrained (or its config.json alone)."""
    cache: dict[tuple[str, bool], str] = {}

    def get(layout: str, weights: bool = True) -> str:
        if (layout, weights) not in cache:
            out = tmp_path_factory.mktemp(f"base-{layout}-{int(weights)}")
            model = tiny_model(layout)
            if weights:
                model.save_pretrained(str(out))
            else:
                model.config.save_pretrained(str(out))
            cache[(layout, weights)] = str(out)
        return cache[(layout, weights)]

    return get


@pytest.fixture(autouse=True)
def _no_pyproject(tmp_path: Any, monkeypatch: Any) -> None:
    """Run from an empty folder so the repository's own pyproject.toml never supplies defaults."""
    monkeypatch.chdir(tmp_path)


def test_clean_exit_0_and_json_contract(cli: Any, adapters: dict[str, str]) -> None:
    r = cli("verify", adapters["text"], "--base", "tiny:ministral3_text", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["ok"] is True and isinstance(d["findings"], list)
    (a,) = d["adapters"]
    assert {"missing", "unexpected", "shape_mismatch", "lora_b", "findings"} <= set(a)
    assert a["missing"] == a["unexpected"] == a["shape_mismatch"] == []
    assert a["lora_b"]["nonzero"] == a["lora_b"]["total"] == 28


def test_vl_adapter_on_text_base_exit_1_with_remap_command(cli: Any, adapters: dict[str, str]) -> None:
    r = cli("verify", adapters["vl"], "--base", "tiny:ministral3_text", "--format", "json")
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["ok"] is False
    assert d["adapters"][0]["move"]["command"] == f"adapterdoc remap {adapters['vl']} --vl"
    assert {"AD220", "AD221", "AD223"} <= {f["code"] for f in d["findings"]}
    text = cli("verify", adapters["vl"], "--base", "tiny:ministral3_text")
    assert text.exit_code == 1
    assert f"adapterdoc remap {adapters['vl']} --vl" in text.stdout and "FAIL" in text.stdout


def test_exit_zero_and_output_file(cli: Any, adapters: dict[str, str], tmp_path: Any) -> None:
    out = tmp_path / "report.xml"
    r = cli(
        "verify",
        adapters["vl"],
        adapters["text"],
        "--base",
        "tiny:ministral3_text",
        "--format",
        "junit",
        "--output-file",
        str(out),
        "--exit-zero",
    )
    assert r.exit_code == 0 and r.stdout == ""
    suite = ET.parse(out).getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [adapters["vl"], adapters["text"]]
    assert cases[0].find("failure") is not None and cases[1].find("failure") is None
    assert suite.get("tests") == "2" and suite.get("failures") == "1"


def test_github_format(cli: Any, adapters: dict[str, str]) -> None:
    r = cli("verify", adapters["zero"], "--base", "tiny:ministral3_text", "--format", "github")
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert any(line.startswith("::error ") and "AD301" in line for line in lines)
    assert all(line.startswith(("::error ", "::warning ", "::notice ")) for line in lines[:-1])


def test_profile_and_rank_from_pyproject(cli: Any, adapters: dict[str, str], tmp_path: Any) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.adapterdoc]\nprofile = "vllm"\nbase = "tiny:ministral3_text"\n'
    )
    sub = tmp_path / "deep" / "er"
    sub.mkdir(parents=True)
    os.chdir(sub)
    r = cli("verify", adapters["r64"], "--json")
    assert r.exit_code == 1
    assert "AD411" in {f["code"] for f in json.loads(r.stdout)["findings"]}
    (tmp_path / "pyproject.toml").write_text(
        '[tool.adapterdoc]\nprofile = "vllm"\nmax-lora-rank = 64\nbase = "tiny:ministral3_text"\n'
    )
    assert cli("verify", adapters["r64"], "--json").exit_code == 0
    assert cli("verify", adapters["r64"], "--json", "--max-lora-rank", "32").exit_code == 1  # the flag wins
    assert cli("verify", adapters["r64"], "--json", "--profile", "peft").exit_code == 0


def test_bad_pyproject_value_is_exit_3(cli: Any, adapters: dict[str, str], tmp_path: Any) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.adapterdoc]\nmax-lora-rank = 17\n")
    r = cli("verify", adapters["text"], "--base", "tiny:ministral3_text")
    assert r.exit_code == 3 and r.stderr.startswith("adapterdoc: error: ") and "max-lora-rank" in r.stderr


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--base", "tiny:ministral3_text", "--json", "--format", "junit"], 2),
        (["--base", "tiny:ministral3_text", "--max-lora-rank", "17"], 2),
        ([], 3),  # no --base: the adapter's own base_model_name_or_path, which this one leaves empty
        (["--base", "tiny:no_such_layout"], 3),
        (["--base", "/no/such/base"], 3),
    ],
    ids=["json-vs-junit", "bad-rank", "no-base", "bad-tiny", "missing-base"],
)
def test_usage_and_input_errors(cli: Any, adapters: dict[str, str], args: list[str], code: int) -> None:
    r = cli("verify", adapters["text"], *args)
    assert r.exit_code == code, r.output
    if code == 3:
        assert r.stderr.startswith("adapterdoc: error: ") and len(r.stderr.strip().splitlines()) == 1


def test_unusable_adapter_is_exit_3_others_still_reported(
    cli: Any, adapters: dict[str, str], tmp_path: Any
) -> None:
    r = cli("verify", adapters["text"], str(tmp_path / "missing"), "--base", "tiny:ministral3_text", "--json")
    assert r.exit_code == 3
    d = json.loads(r.stdout)
    assert [a["ok"] for a in d["adapters"]] == [True, False] and d["ok"] is False
    assert "adapterdoc: error:" in r.stderr and "Traceback" not in r.stderr


def test_missing_ml_stack_is_exit_3(cli: Any, adapters: dict[str, str], monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)
    r = cli("verify", adapters["text"], "--base", "tiny:ministral3_text")
    assert r.exit_code == 3
    assert "peft" in r.stderr and "pip install" in r.stderr


@pytest.mark.parametrize("weights", [True, False], ids=["model-dir", "config-only"])
def test_base_directory_equals_tiny(cli: Any, adapters: dict[str, str], base_dir: Any, weights: bool) -> None:
    folder = base_dir("mistral3_vl", weights)
    for base in (folder, os.path.join(folder, "config.json")):
        d = json.loads(cli("verify", adapters["vl"], "--base", base, "--json").stdout)
        assert d["ok"] is True, d["findings"]
        assert d["base"]["has_weights"] is (weights and base == folder)
        assert d["adapters"][0]["base_layout"] == "mistral3_vl"


def test_load_confirms_a_good_adapter(cli: Any, adapters: dict[str, str], base_dir: Any) -> None:
    r = cli("verify", adapters["text"], "--base", base_dir("ministral3_text"), "--load", "--json")
    assert r.exit_code == 0, r.stdout
    load = json.loads(r.stdout)["adapters"][0]["load"]
    assert load["lora_modules"] == 28 and load["missing"] == load["unexpected"] == []
    assert load["max_abs_diff"] > 0


def test_load_catches_the_silent_no_op(cli: Any, adapters: dict[str, str], base_dir: Any) -> None:
    """The seed's three post-load facts on a VL adapter loaded onto the text class: modules present, keys missing,
    output unchanged."""
    r = cli("verify", adapters["vl"], "--base", base_dir("ministral3_text"), "--load", "--json")
    d = json.loads(r.stdout)["adapters"][0]
    assert r.exit_code == 1
    assert d["load"]["lora_modules"] == 28  # PEFT injected from the config...
    assert len(d["load"]["missing"]) == 56  # ...but no saved weight reached them
    assert d["load"]["max_abs_diff"] == 0.0
    assert {"AD233", "AD234"} <= {f["code"] for f in d["findings"]}
    assert "AD232" not in {f["code"] for f in d["findings"]}


def test_load_needs_weights(cli: Any, adapters: dict[str, str], base_dir: Any) -> None:
    r = cli("verify", adapters["text"], "--base", base_dir("ministral3_text", weights=False), "--load")
    assert r.exit_code == 3 and "--load needs a base with weights" in r.stderr


def test_vl_adapter_with_tower_lora_on_a_text_base_still_gets_the_fix(tmp_path: Any, tiny_model: Any) -> None:
    """QA: a Mistral3 adapter trained without the tower exclusion got no diagnosis on a text base."""
    import json as _json

    from click.testing import CliRunner

    from adapterdoc.cli import main

    out = _save_adapter(tiny_model("mistral3_vl"), "mistral3_vl", str(tmp_path / "a"), exclude_modules=None)
    res = CliRunner().invoke(main, ["verify", out, "--base", "tiny:ministral3_text", "--json"])
    assert res.exit_code == 1
    codes = {f["code"] for f in _json.loads(res.stdout)["findings"]}
    assert "AD223" in codes and "adapterdoc remap" in res.stdout and "--vl" in res.stdout


def test_without_base_each_adapter_uses_the_base_it_names(cli: Any, tiny_model: Any, tmp_path: Any) -> None:
    """train-smoke's adapters name `tiny:LAYOUT`: `verify A B` checks each against its own base, one run."""
    import json as _json

    dirs = []
    for layout in ("qwen3_5_vl", "ministral3_text"):
        out = _save_adapter(tiny_model(layout), layout, str(tmp_path / layout))
        _set_base(out, f"tiny:{layout}")
        dirs.append(out)
    r = cli("verify", *dirs, "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    d = _json.loads(r.stdout)
    assert [a["ok"] for a in d["adapters"]] == [True, True] and d["ok"] is True
    # an adapter whose base does not resolve locally is unusable (exit 3), the others still reported
    _set_base(dirs[1], "no-such-org/no-such-model")
    r = cli("verify", *dirs, "--json")
    assert r.exit_code == 3 and "no-such-org/no-such-model" in r.stderr
    assert [a["ok"] for a in _json.loads(r.stdout)["adapters"]] == [True, False]


def _set_base(adapter: str, name: str) -> None:
    from pathlib import Path

    path = Path(adapter) / "adapter_config.json"
    cfg = json.loads(path.read_text())
    cfg["base_model_name_or_path"] = name
    path.write_text(json.dumps(cfg))
