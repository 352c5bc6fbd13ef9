"""The torch-free `.bin` reader (:mod:`adapterdoc.st.pickled`) against ``torch.load(weights_only=True)``: the same
names, dtypes, shapes and bytes (views, transposes, parameters, bfloat16, ints), and `remap`'s .bin → safetensors
bytes equal to ``safetensors.torch.save``'s; in the light install (no torch, no numpy) inspect, verify and remap
read a `.bin`, and the malicious pickles are refused there too, their payload never run."""

from __future__ import annotations

import collections
import io
import json
import pickle
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.st.pickled import read_pickled, safetensors_bytes
from tests.checkpoint.test_pickle_safety import _malicious_adapter, _Payload

torch = pytest.importorskip("torch")


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    sd: dict[str, Any] = collections.OrderedDict(
        a=torch.randn(2, 3, generator=g),
        b=torch.randn(4, generator=g).to(torch.bfloat16),
        c=torch.randn(3, 2, generator=g).t(),
        d=torch.nn.Parameter(torch.ones(2, dtype=torch.float16)),
        h=torch.randn(3, 4, 5, generator=g).permute(2, 0, 1),
        i=torch.arange(6, dtype=torch.int64),
        z=torch.zeros(0, 3),
    )
    sd["e"] = sd["a"][1]
    return sd


def _raw(t: Any) -> bytes:
    t = t.detach().contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def test_the_reader_gives_torch_loads_tensors(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "x.bin")
    got = read_pickled(str(tmp_path / "x.bin"))
    ref = torch.load(tmp_path / "x.bin", weights_only=True)
    assert list(got) == list(ref)
    for name, t in ref.items():
        assert got[name].shape == tuple(t.shape), name
        assert got[name].data == _raw(t), name
    assert got["b"].dtype == "BF16" and got["d"].dtype == "F16" and got["i"].dtype == "I64"


def test_the_safetensors_bytes_equal_safetensors_torch_save(tmp_path: Path) -> None:
    from safetensors.torch import save

    state = _state()
    state.pop("e")  # a view sharing a's storage: safetensors.torch.save refuses shared tensors
    torch.save(state, tmp_path / "x.bin")
    ref = torch.load(tmp_path / "x.bin", weights_only=True)
    theirs = save({k: v.detach().contiguous().clone() for k, v in ref.items()}, metadata={"format": "pt"})
    assert safetensors_bytes(read_pickled(str(tmp_path / "x.bin")), {"format": "pt"}) == theirs


def _evil_zip(path: Path, marker: Path) -> None:
    """A torch.save-style zip archive whose data.pkl calls os.system."""
    buf = io.BytesIO()
    pickle.dump({"base_model.model.q_proj.lora_A.weight": _Payload(marker)}, buf, protocol=2)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")


LIGHT = """
import json, sys
from click.testing import CliRunner
from adapterdoc.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    r = CliRunner().invoke(main, argv, catch_exceptions=False)
    out.append([r.exit_code, r.stdout, r.stderr])
assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")]
print(json.dumps(out))
"""


def _light(venv: Any, *argvs: list[str]) -> list[tuple[int, str, str]]:
    proc = subprocess.run(
        [str(venv.python), "-c", LIGHT, json.dumps([[str(a) for a in v] for v in argvs])],
        capture_output=True,
        text=True,
        env=venv.env,
        cwd=venv.root,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return [tuple(r) for r in json.loads(proc.stdout)]


def test_the_light_install_reads_bin_and_refuses_malicious_pickles(light_venv: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from tests.verify.test_verify_registry import _base

    marker = tmp_path / "PWNED"
    evil = _malicious_adapter(tmp_path / "evil", marker)
    evil_zip = tmp_path / "evil-zip"
    evil_zip.mkdir()
    (evil_zip / "adapter_config.json").write_text((evil / "adapter_config.json").read_text())
    _evil_zip(evil_zip / "adapter_model.bin", marker)
    good = tmp_path / "good"
    good.mkdir()
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    state = {f"{key}.lora_A.weight": torch.randn(2, 8), f"{key}.lora_B.weight": torch.randn(8, 2)}
    torch.save(state, good / "adapter_model.bin")
    (good / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"]})
    )
    evil_before = (evil / "adapter_model.bin").read_bytes()
    runs = _light(
        light_venv,
        ["inspect", evil],
        ["verify", evil, "--base", _base(tmp_path, "ministral3_text")],
        ["remap", evil, "--vl", "--out", tmp_path / "out-evil"],
        ["inspect", evil_zip],
        ["remap", evil_zip, "--rule", "^$=>", "--out", tmp_path / "out-evil-zip"],
        ["inspect", good, "--json"],
        ["remap", good, "--rule", "^$=>", "--out", tmp_path / "out"],
    )
    for code, _, err in runs[:5]:
        assert code == 3 and err.startswith("adapterdoc: error: ") and err.count("\n") == 1, err
        assert "weights_only" in err and "Traceback" not in err
    assert not marker.exists()
    assert (evil / "adapter_model.bin").read_bytes() == evil_before
    assert not (tmp_path / "out-evil").exists() and not (tmp_path / "out-evil-zip").exists()
    code, out, err = runs[5]
    assert code == 0, err
    report = json.loads(out)
    assert report["weights_format"] == "bin" and report["tensors"] == 2
    code, _, err = runs[6]
    assert code == 0, err
    written = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    assert set(written) == set(state)
    for name, t in state.items():
        assert torch.equal(written[name], t)
