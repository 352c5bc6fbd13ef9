"""`adapterdoc explain` and the generated code list: every code is explained, reachable and documented."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from adapterdoc.codes import AREAS, area_of, catalogue
from adapterdoc.codes.docs import codes_by_area, generate, main


def test_every_code_is_complete_and_well_formed() -> None:
    codes = catalogue()
    names = [c.name for c in codes.values()]
    assert len(names) == len(set(names)), "kebab-case names must be unique"
    for code, c in codes.items():
        assert re.fullmatch(r"AD[1-9]\d\d", code) and c.code == code
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", c.name), c.name
        assert c.severity in ("error", "warning", "info")
        for part in (c.summary, c.why, c.example, c.instead):
            assert part.strip(), f"{code} has an empty section"
        area = area_of(code)
        assert c in codes_by_area().get(area, []), f"{code} lives outside its area module"


def test_every_vllm_rule_names_the_version() -> None:
    serving = [c for c in catalogue().values() if c.name.startswith("vllm-")]
    assert len(serving) >= 15
    assert all("vLLM 0.33.0" in c.summary for c in serving)


def test_explain_text_has_the_four_sections(cli: Any) -> None:
    r = cli("explain", "AD301")
    assert r.exit_code == 0
    for title in ("What it means", "Why it matters", "Example", "What to do instead"):
        assert title in r.stdout
    assert r.stdout.startswith("AD301 lora-b-all-zero (error, area weights")


def test_explain_by_name_and_lowercase(cli: Any) -> None:
    assert cli("explain", "vllm-rank-above-limit").stdout == cli("explain", "ad411").stdout
    assert "max_lora_rank" in cli("explain", "AD411").stdout


def test_explain_json(cli: Any) -> None:
    d = json.loads(cli("explain", "AD415", "--json").stdout)
    assert d["ok"] is True and d["findings"] == []
    assert d["code"] == "AD415" and d["name"] == "vllm-path-not-served" and d["area"] == "serving"
    assert {"summary", "why", "example", "instead", "severity", "since"} <= set(d)


def test_explain_list(cli: Any) -> None:
    text = cli("explain").stdout
    assert all(code in text for code in catalogue())
    rows = json.loads(cli("explain", "--json").stdout)["codes"]
    assert [r["code"] for r in rows] == list(catalogue())


@pytest.mark.parametrize("bad", ["AD999", "lora-b-all-zer"])
def test_unknown_code_is_a_usage_error(cli: Any, bad: str) -> None:
    r = cli("explain", bad)
    assert r.exit_code == 2 and "unknown finding code" in r.stderr
    if bad == "lora-b-all-zer":
        assert "lora-b-all-zero" in r.stderr


def test_generated_page_lists_every_code(tmp_path: Any) -> None:
    text = generate()
    for code, c in catalogue().items():
        assert f"### {code}" in text and f"`{c.name}`" in text and f"[{code}](#{code.lower()})" in text
    out = tmp_path / "codes.md"
    assert main([str(out)]) == 0
    assert out.read_text() == text
    assert main([str(out), "--check"]) == 0
    out.write_text(text + "stale\n")
    assert main([str(out), "--check"]) == 1


def test_every_listed_area_module_exists() -> None:
    import importlib.util

    from adapterdoc.codes import area_modules

    for area in AREAS:
        assert importlib.util.find_spec(f"adapterdoc.codes.{area}") is not None, area
    assert list(area_modules()) == list(AREAS)


def test_a_missing_area_module_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import adapterdoc.codes as codes

    monkeypatch.setattr(codes, "AREAS", (*codes.AREAS, "no_such_area"))
    with pytest.raises(ImportError):
        codes.area_modules()
