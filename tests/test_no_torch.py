"""`inspect` and `import adapterdoc.cli` import no ML stack, work where torch is not installed, and read no
tensor data: a sparse 4 GiB file costs the same bytes and time as a tiny one."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

HEAVY = ("torch", "transformers", "peft", "accelerate", "safetensors.torch")
GiB = 1 << 30


def write_st(path: Path, tensors: dict[str, tuple[str, list[int], int]], *, sparse: bool = False) -> int:
    """A valid safetensors file with tensors (dtype, shape, nbytes) laid out in order; returns the data size.
    With ``sparse`` the data section is made with ftruncate (no bytes written)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        if sparse:
            os.ftruncate(f.fileno(), 8 + len(text) + pos)
        else:
            f.write(bytes(pos))
    return pos


def lora_file(path: Path, *, sparse_gib: int = 0) -> Path:
    """An adapter-like file; with ``sparse_gib`` its tensors add up to that many GiB (sparse)."""
    tensors: dict[str, tuple[str, list[int], int]] = {}
    n_modules = 8
    for i in range(n_modules):
        m = f"base_model.model.model.layers.{i}.self_attn.q_proj"
        if sparse_gib:
            cols = sparse_gib * GiB // (n_modules * 2 * 16 * 4)
            tensors[f"{m}.lora_A.weight"] = ("F32", [16, cols], 16 * cols * 4)
            tensors[f"{m}.lora_B.weight"] = ("F32", [cols, 16], 16 * cols * 4)
        else:
            tensors[f"{m}.lora_A.weight"] = ("F32", [16, 64], 16 * 64 * 4)
            tensors[f"{m}.lora_B.weight"] = ("F32", [64, 16], 16 * 64 * 4)
    write_st(path, tensors, sparse=bool(sparse_gib))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("notorch")
    small = lora_file(root / "small.safetensors")
    big = lora_file(root / "big.safetensors", sparse_gib=4)
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]})
    )
    lora_file(adapter / "adapter_model.safetensors")
    sharded = root / "sharded"
    sharded.mkdir()
    write_st(sharded / "a.safetensors", {"x.weight": ("F16", [4], 8)})
    write_st(sharded / "b.safetensors", {"y.weight": ("BF16", [2, 2], 8)})
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x.weight": "a.safetensors", "y.weight": "b.safetensors"}})
    )
    bin_adapter = root / "bin_adapter"
    bin_adapter.mkdir()
    (bin_adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 16}))
    (bin_adapter / "adapter_model.bin").write_bytes(b"PK\x03\x04 not really")
    corrupt = root / "corrupt.safetensors"
    corrupt.write_bytes(small.read_bytes()[:-1])
    return {
        "small": small,
        "big": big,
        "adapter": adapter,
        "sharded": sharded,
        "bin_adapter": bin_adapter,
        "corrupt": corrupt,
    }


# A child interpreter: optionally make the ML stack uninstallable, run the CLI in-process, then report which
# heavy modules ended up imported, and which .safetensors files were opened or mapped (audit hooks).
CHILD = textwrap.dedent(
    """
    import json, sys
    block, args, report, heavy_names = json.loads(sys.argv[1])
    if block:
        class _NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "transformers", "peft", "accelerate"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, _NotInstalled())
    events = {"open": [], "mmap": 0}
    def _hook(event, a):
        if event == "open" and isinstance(a[0], str) and a[0].endswith(".safetensors"):
            events["open"].append(a[0])
        elif event == "mmap.__new__":
            events["mmap"] += 1
    sys.addaudithook(_hook)
    import adapterdoc.cli
    code = 0
    if args:
        try:
            adapterdoc.cli.main(args)
        except SystemExit as e:
            code = e.code
    heavy = sorted(m for m in sys.modules if m in heavy_names or m.split(".")[0] in heavy_names)
    with open(report, "w") as f:
        json.dump({"code": code, "heavy": heavy, **events}, f)
    """
)


def run_child(tmp_path: Path, args: list[str], *, block: bool = False) -> tuple[dict[str, Any], Any]:
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERDOC_")}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([block, args, str(report), HEAVY])],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert report.exists(), proc.stderr
    return json.loads(report.read_text()), proc


def test_import_cli_imports_no_ml_stack(tmp_path: Path) -> None:
    rep, _ = run_child(tmp_path, [])
    assert rep["heavy"] == []


@pytest.mark.parametrize("which", ["small", "adapter", "sharded", "corrupt"])
@pytest.mark.parametrize("as_json", [False, True])
def test_inspect_imports_no_ml_stack(
    tmp_path: Path, files: dict[str, Path], which: str, as_json: bool
) -> None:
    args = ["inspect", *(["--json"] if as_json else []), str(files[which])]
    rep, proc = run_child(tmp_path, args)
    assert rep["heavy"] == [], rep
    assert rep["code"] == (3 if which == "corrupt" else 0), proc.stderr
    assert rep["mmap"] == 0


def test_inspect_runs_where_torch_is_not_installed(tmp_path: Path, files: dict[str, Path]) -> None:
    rep, proc = run_child(tmp_path, ["inspect", "--json", str(files["adapter"])], block=True)
    assert rep["code"] == 0 and rep["heavy"] == []
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["lora"]["modules"] == 8
    # a damaged .bin is read without torch too (the restricted unpickler): a one-line refusal, no traceback
    rep, proc = run_child(tmp_path, ["inspect", str(files["bin_adapter"])], block=True)
    assert rep["code"] == 3 and rep["heavy"] == []
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("adapterdoc: error: ")
    assert "weights_only" in proc.stderr and "Traceback" not in proc.stderr


def test_console_script_does_not_import_torch(tmp_path: Path, files: dict[str, Path]) -> None:
    """`python -X importtime -m adapterdoc inspect FILE`: no ML module in the import log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERDOC_")}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "adapterdoc", "inspect", str(files["small"])],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert proc.returncode == 0
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "adapterdoc.inspection" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "transformers", "peft", "accelerate")}


# --------------------------------------------------------------------------- no tensor data is read

RCHAR_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from adapterdoc.inspection import inspect
    def rchar():
        with open("/proc/self/io") as f:
            return int(dict(line.split(": ") for line in f.read().splitlines())["rchar"])
    out = {}
    inspect(sys.argv[1])  # warm up lazy imports
    for name, path in (("small", sys.argv[1]), ("big", sys.argv[2])):
        r0, t0 = rchar(), time.perf_counter()
        report = inspect(path)
        out[name] = {"read": rchar() - r0, "s": time.perf_counter() - t0, "bytes": report.bytes}
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_sparse_4gib_file_reads_only_its_header(files: dict[str, Path]) -> None:
    """Bytes read by the process (rchar) while inspecting a 4 GiB file ≈ its header, as for a tiny file."""
    big, small = files["big"], files["small"]
    assert big.stat().st_size > 4 * GiB - GiB // 8
    assert big.stat().st_blocks * 512 < 1 << 20  # really sparse: nothing to read but the header
    proc = subprocess.run(
        [sys.executable, "-c", RCHAR_CHILD, str(small), str(big)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = json.loads(proc.stdout)
    with big.open("rb") as f:
        (n_big,) = struct.unpack("<Q", f.read(8))
    assert out["big"]["bytes"] == big.stat().st_size
    # the process read the 8-byte prefix, the header, and a little bookkeeping (/proc itself); not the data
    assert out["big"]["read"] <= 8 + n_big + 64 * 1024, out
    assert out["big"]["read"] - out["small"]["read"] < 64 * 1024, out
