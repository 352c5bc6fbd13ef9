"""The profile seam: the registry lists the profiles, the CLI's ``--profile`` choices are its names, and a profile
registered from outside is run by ``verify`` (its findings and its JSON keys), with no change to verify itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.codes import catalogue
from adapterdoc.report.findings import Finding, make
from adapterdoc.verify import VerifyOptions, verify
from adapterdoc.verify.profiles import PROFILES, Profile, get_profile, profile_names, register
from adapterdoc.verify.profiles.vllm import VLLM_VERSION


class EchoProfile(Profile):
    """A stand-in engine: one finding naming the adapter's layout, one run-level JSON key."""

    name = "echo"
    summary = "echo serving"
    options = ("served_as",)

    def findings(
        self, spec: str, report: Any, keys: list[Any], meta: Any, options: Any, config: Any
    ) -> list[Finding]:
        lora = sum(1 for k in keys if k.is_lora)
        return [
            make("AD416", f"echo: {lora} LoRA key(s), layout {report.layout} on {meta.layout}", path=spec)
        ]

    def run_fields(self, options: Any, *, active: bool) -> dict[str, Any]:
        return {"echo_version": "1.0" if active else None}


@pytest.fixture
def echo() -> Iterator[Profile]:
    """The echo profile, registered for one test only."""
    profile = register(EchoProfile())
    assert PROFILES["echo"] is profile and profile_names()[-1] == "echo"
    yield profile
    del PROFILES["echo"]


def test_registry_lists_peft_then_vllm() -> None:
    assert profile_names()[:2] == ("peft", "vllm") and {"peft", "vllm", "tgi", "lorax"} <= set(PROFILES)
    assert all(isinstance(p, Profile) and p.name == n for n, p in PROFILES.items())
    assert get_profile("vllm").options == ("max_lora_rank", "served_as")
    with pytest.raises(ValueError, match=r"unknown profile 'nosuch'; choose from peft, vllm, "):
        VerifyOptions(profile="nosuch")


def test_cli_profile_choices_come_from_the_registry() -> None:
    from adapterdoc.commands.verify_cmd import command

    option = next(p for p in command.params if p.name == "profile")
    assert tuple(option.type.choices) == tuple(PROFILES)
    assert option.help.startswith("Rules to apply: PEFT loading (default), vLLM serving, ")
    assert "TGI serving" in option.help and "LoRAX serving" in option.help


def test_serving_codes_name_the_profiles_vllm_release() -> None:
    """The code catalogue's explanations and the vLLM profile describe the same release."""
    serving = [c for c in catalogue().values() if c.name.startswith("vllm-")]
    assert serving and all(f"vLLM {VLLM_VERSION}." in c.summary for c in serving)


def test_a_registered_profile_is_run_by_verify(echo: Profile, tmp_path: Path) -> None:
    from small_adapters import BASE, write_small_adapter

    adapter = str(write_small_adapter(tmp_path / "a"))
    run = verify([adapter], BASE, VerifyOptions(profile="echo", scan="nonzero"))
    report = run.adapters[0]
    mine = [f for f in report.findings if f.message.startswith("echo:")]
    assert [f.message for f in mine] == [f"echo: 2 LoRA key(s), layout {report.layout} on ministral3_text"]
    assert report.error is None and not any(f.message.startswith("vLLM") for f in report.findings)
    d = json.loads(json.dumps(run.to_dict()))
    assert d["profile"] == "echo" and d["echo_version"] == "1.0"
    assert d["max_lora_rank"] is None and d["vllm_version"] is None  # the other profiles' keys stay, null
    order = list(d)[: list(d).index("served_as")]
    assert order[order.index("profile") :][:3] == ["profile", "max_lora_rank", "vllm_version"]
    assert order[-1] == "echo_version" and {"tgi_version", "lorax_version"} <= set(order)
    peft = verify([adapter], BASE, VerifyOptions(scan="nonzero")).to_dict()
    assert peft["echo_version"] is None and not any(
        f["message"].startswith("echo:") for f in peft["findings"]
    )
