"""The two gates agree: `verify --json` in the light install (a venv with adapterdoc's base dependencies only: no
torch, transformers, PEFT or numpy; :class:`tests.conftest.LightVenv`) gives the verdict of the ML path (PEFT on the
meta device, ``expected_keys="meta-device"``) on every input class: the same exit code, the same missing /
unexpected / shape_mismatch keys, the same finding codes. The light side decides from the registry; it may decline
("needs torch", exit 3) only for a family outside the registry, and then names the base.

The cases: every registry layout (clean, keys left out and reshaped, the text class's names on a VL base, per-expert
and fused experts), VL-on-text and text-on-VL adapters (auto_mapping naming the other class), a double
``language_model`` infix, DoRA with modules_to_save, a ``.bin`` adapter, NaN, a wrong shape, an extra key, zero
lora_B, typo'd, unknown and ill-typed config fields, an unknown peft_type, and the adapters of ``fixtures/``. The
bulk is ``slow``; a representative handful runs by default (one light subprocess each way).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

from adapterdoc.errors import AdapterdocError
from adapterdoc.layouts import LAYOUTS
from tests.verify.test_verify_registry import CASES as LAYOUT_LORA
from tests.verify.test_verify_registry import _base

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "old_stack"
OUTSIDE = ("mixtral",)
"""Families of the fixtures that the registry does not describe: the light gate declines them (needs torch)."""

NUMPY_AUDIT = ("AD310", "AD311", "AD312")
"""The weights audit's delta findings: computed with numpy (singular values), which the light install does not
have, so the light gate does not report them (verify's own zero/NaN scans, AD301-AD304, are pure Python)."""
LIGHT_DRIVER = """
import json, sys
from click.testing import CliRunner
from adapterdoc.cli import main
out = []
for argv in json.loads(open(sys.argv[1]).read()):
    r = CliRunner().invoke(main, argv, catch_exceptions=False)
    out.append({"code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr})
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "peft", "numpy"))
json.dump({"runs": out, "heavy": heavy}, open(sys.argv[2], "w"))
"""
LORA = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]}


class Cases:
    """Bases (config.json folders) and adapters, written once under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._bases: dict[str, Path] = {}

    def base(self, layout: str) -> Path:
        if layout not in self._bases:
            self._bases[layout] = _base(self.root, layout)
        return self._bases[layout]

    def expected(self, layout: str, lora: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        from adapterdoc.ml import meta as M

        spec = M.resolve_base(str(self.base(layout)))
        meta = M.build_meta_adapter(spec, M.lora_config_from_raw(lora), config=M.load_config(spec))
        assert meta.inject_error is None, meta.inject_error
        return dict(meta.expected)

    def adapter(
        self,
        name: str,
        lora: dict[str, Any],
        keys: dict[str, tuple[int, ...]],
        fill: Callable[[str], float] = lambda k: 0.01,
        binary: bool = False,
    ) -> Path:
        import numpy as np

        folder = self.root / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps(lora))
        arrays = {k: np.full(s, fill(k), np.float32) for k, s in keys.items()}
        if binary:
            import torch

            torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, folder / "adapter_model.bin")
        else:
            from safetensors.numpy import save_file

            save_file(arrays, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        return folder


def _auto(layout: str) -> dict[str, Any]:
    lay = LAYOUTS[layout]
    return {"auto_mapping": {"base_model_class": lay.model_class, "parent_library": lay.model_module}}


def _layout_cases(c: Cases, layout: str) -> dict[str, tuple[Path, Path]]:
    """Clean, left-out and reshaped keys, the text names on a VL base, per-expert keys where PEFT converts."""
    from tests.verify.test_verify_registry import _adapters

    base = c.base(layout)
    return {
        f"layout:{a.name}": (a, base)
        for a in _adapters(c.root / f"l-{layout.replace(':', '-')}", layout, base)
    }


def _config_cases(c: Cases) -> dict[str, tuple[Path, Path]]:
    layout = "ministral3_text"
    keys = c.expected(layout, LORA)
    base = c.base(layout)
    configs = {
        "typo": {**LORA, "lora_alhpa": 16},
        "typo-loading": {
            "peft_type": "LORA",
            "r": 2,
            "lora_alhpa": 4,
            "target_modules": ["q_proj", "v_proj"],
        },
        "note": {**LORA, "my_note": "hello"},
        "dora-string": {**LORA, "use_dora": "false"},
        "rslora-string": {**LORA, "use_rslora": "false"},
        "rank-string": {**LORA, "rank_pattern": {"q_proj": "4"}},
        "alpha-string": {**LORA, "alpha_pattern": {"v_proj": "8"}},
        "dropout-string": {**LORA, "lora_dropout": "0.1"},
        "bias-unknown": {**LORA, "bias": "some"},
        "loha": {**LORA, "peft_type": "LOHA"},
        "layers-pattern-alone": {**LORA, "layers_pattern": "layers"},
        "targets-nothing": {**LORA, "target_modules": ["no_such_proj"]},
    }
    return {f"config:{n}": (c.adapter(f"cfg-{n}", cfg, keys), base) for n, cfg in configs.items()}


def _weight_cases(c: Cases) -> dict[str, tuple[Path, Path]]:
    layout = "qwen3_5_text"
    base = c.base(layout)
    keys = c.expected(layout, LORA)
    first_a = next(k for k in keys if k.endswith("lora_A.weight"))
    extra = dict(keys)
    extra[first_a.replace("q_proj", "k_proj")] = keys[first_a]
    wrong = dict(keys)
    wrong[first_a] = (keys[first_a][0] + 1, keys[first_a][1])
    dora = {**LORA, "use_dora": True, "modules_to_save": ["lm_head"]}
    return {
        "weights:clean": (c.adapter("w-clean", LORA, keys), base),
        "weights:nan": (c.adapter("w-nan", LORA, keys, lambda k: math.nan if k == first_a else 0.01), base),
        "weights:zero-b": (c.adapter("w-zero-b", LORA, keys, lambda k: 0.0 if "lora_B" in k else 0.01), base),
        "weights:extra-key": (c.adapter("w-extra", LORA, extra), base),
        "weights:wrong-shape": (c.adapter("w-wrong", LORA, wrong), base),
        "weights:bin": (c.adapter("w-bin", LORA, keys, binary=True), base),
        "weights:dora-mts": (c.adapter("w-dora", dora, c.expected(layout, dora)), base),
    }


def _class_cases(c: Cases) -> dict[str, tuple[Path, Path]]:
    """auto_mapping naming the other class of the family: VL adapters on text bases and text adapters on VL ones."""
    out: dict[str, tuple[Path, Path]] = {}
    for vl, text in (("qwen3_5_vl", "qwen3_5_text"), ("mistral3_vl", "ministral3_text")):
        vl_lora, text_lora = {**LORA, **_auto(vl)}, {**LORA, **_auto(text)}
        vl_keys, text_keys = c.expected(vl, LORA), c.expected(text, LORA)
        out[f"class:{vl}-on-{text}"] = (c.adapter(f"c-{vl}-on-text", vl_lora, vl_keys), c.base(text))
        out[f"class:{text}-on-{vl}"] = (c.adapter(f"c-{text}-on-vl", text_lora, text_keys), c.base(vl))
        on_vl = {k.replace(".language_model.", ".", 1): s for k, s in vl_keys.items()}
        out[f"class:{text}-names-on-{vl}"] = (c.adapter(f"c-{text}-names", text_lora, on_vl), c.base(vl))
        double = {
            k.replace(".language_model.", ".language_model.language_model.", 1): s for k, s in vl_keys.items()
        }
        out[f"class:{vl}-double-infix"] = (c.adapter(f"c-{vl}-double", vl_lora, double), c.base(vl))
    return out


def _fixture_cases() -> dict[str, tuple[Path, Path]]:
    out = {}
    for family in sorted(p for p in FIXTURES.iterdir() if (p / "base").is_dir()):
        for adapter in sorted(family.glob("adapter_*")):
            out[f"fixture:{family.name}/{adapter.name}"] = (adapter, family / "base")
    return out


def _ml(adapter: Path, base: Path) -> tuple[int, dict[str, Any] | None]:
    from adapterdoc.verify import VerifyOptions, verify

    try:
        run = verify([str(adapter)], str(base), VerifyOptions(expected_keys="meta-device"))
    except AdapterdocError:
        return 3, None
    return run.exit_code, run.to_dict()


def _light(venv: Any, tmp: Path, pairs: list[tuple[Path, Path]]) -> list[dict[str, Any]]:
    argvs = [["verify", str(a), "--base", str(b), "--json"] for a, b in pairs]
    (tmp / "argv.json").write_text(json.dumps(argvs))
    subprocess.run(
        [str(venv.python), "-c", LIGHT_DRIVER, str(tmp / "argv.json"), str(tmp / "out.json")],
        check=True,
        cwd=tmp,
        env=venv.env,
        timeout=600,
        capture_output=True,
    )
    out = json.loads((tmp / "out.json").read_text())
    assert out["heavy"] == [], out["heavy"]
    return out["runs"]


def _verdict(code: int, doc: dict[str, Any] | None) -> dict[str, Any]:
    if doc is None or code == 3:
        return {"code": code}
    (a,) = doc["adapters"]
    return {
        "code": code,
        "missing": a["missing"],
        "unexpected": a["unexpected"],
        "shape_mismatch": a["shape_mismatch"],
        "codes": sorted(f["code"] for f in doc["findings"] if f["code"] not in NUMPY_AUDIT),
    }


def compare(venv: Any, tmp: Path, cases: dict[str, tuple[Path, Path]]) -> dict[str, Any]:
    """Run every case both ways; return the disagreements (empty when the gates agree) and the light runs."""
    names = list(cases)
    light = _light(venv, tmp, [cases[n] for n in names])
    wrong: dict[str, Any] = {}
    declined: list[str] = []
    for name, run in zip(names, light):
        adapter, base = cases[name]
        code, doc = _ml(adapter, base)
        if any(name.startswith(f"fixture:{o}/") for o in OUTSIDE):
            # a family outside the registry: the light gate declines, naming the base and the extra
            line = run["stderr"].strip()
            if not (run["code"] == 3 and str(base) in line and "adapterdoc[ml]" in line and "\n" not in line):
                wrong[name] = {"light": run}
            continue
        if run["code"] == 3 and code != 3 and "the registry cannot decide" in run["stderr"]:
            declined.append(name)  # a decline where the ML path decides: a disagreement of its own kind
        ours = _verdict(run["code"], json.loads(run["stdout"]) if run["stdout"].strip() else None)
        theirs = _verdict(code, doc)
        if ours != theirs:
            wrong[name] = {"light": ours, "ml": theirs, "stderr": run["stderr"][-400:]}
    return {"wrong": wrong, "declined": declined, "light": dict(zip(names, light))}


DEFAULT = (
    "config:typo",
    "config:dora-string",
    "config:rank-string",
    "config:loha",
    "weights:bin",
    "weights:dora-mts",
    "weights:nan",
    "class:qwen3_5_vl-on-qwen3_5_text",
    "class:mistral3_vl-double-infix",
    "class:qwen3_5_text-on-qwen3_5_vl",
)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Cases:
    return Cases(tmp_path_factory.mktemp("light-gate"))


def _all_cases(c: Cases) -> dict[str, tuple[Path, Path]]:
    out = {**_config_cases(c), **_weight_cases(c), **_class_cases(c), **_fixture_cases()}
    for layout in sorted(LAYOUT_LORA):
        out.update(_layout_cases(c, layout))
    return out


def test_the_light_gate_gives_the_ml_verdicts(light_venv: Any, cases: Cases, tmp_path: Path) -> None:
    every = {**_config_cases(cases), **_weight_cases(cases), **_class_cases(cases)}
    picked = {n: every[n] for n in DEFAULT}
    got = compare(light_venv, tmp_path, picked)
    assert got["wrong"] == {} and got["declined"] == []
    light = got["light"]
    # the verdicts themselves: a typo is a finding (AD111), a truthy "false" builds DoRA, a string rank is PEFT's
    # injection refusal (AD226), another peft_type is an unusable input, the VL adapter is judged on the text base
    assert light["config:typo"]["code"] == 0
    assert light["config:dora-string"]["code"] == 1
    assert "AD226" in light["config:rank-string"]["stdout"]
    assert light["config:loha"]["code"] == 3 and "peft_type LOHA" in light["config:loha"]["stderr"]
    assert light["weights:bin"]["code"] == 0


@pytest.mark.slow
def test_the_light_gate_gives_the_ml_verdicts_everywhere(
    light_venv: Any, cases: Cases, tmp_path: Path
) -> None:
    got = compare(light_venv, tmp_path, _all_cases(cases))
    if os.environ.get("ADAPTERDOC_LIGHT_GATE_DUMP"):
        Path(os.environ["ADAPTERDOC_LIGHT_GATE_DUMP"]).write_text(json.dumps(got, indent=1))
    assert got["wrong"] == {} and got["declined"] == []
