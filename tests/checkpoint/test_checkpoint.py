"""open_checkpoint: a file, a PEFT adapter directory (.safetensors or .bin), a sharded directory with its index,
and a repo id resolved from a local Hugging Face cache built with huggingface_hub's own layout."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from adapterdoc.checkpoint import open_checkpoint, safe_shard_name
from adapterdoc.cli import main
from adapterdoc.errors import AdapterdocError, ConfigError, HeaderError, InputNotFoundError

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
CONFIG = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": "org/base",
    "r": 4,
    "lora_alpha": 8,
    "target_modules": ["q_proj"],
}


def lora_tensors(r: int = 4) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {A: torch.randn(r, 16, generator=g), B: torch.randn(16, r, generator=g)}


def make_adapter(path: Path, *, bin_format: bool = False, config: dict[str, Any] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps(config or CONFIG))
    if bin_format:
        torch.save(lora_tensors(), path / "adapter_model.bin")
    else:
        save_file(lora_tensors(), str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    return path


SHARD_1 = "model-00001-of-00002.safetensors"
SHARD_2 = "model-00002-of-00002.safetensors"


def make_sharded(path: Path, weight_map: dict[str, str] | None = None, *, extra: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {"model.embed_tokens.weight": torch.zeros(8, 4)}, str(path / SHARD_1), metadata={"format": "pt"}
    )
    second = {"model.norm.weight": torch.ones(4), "lm_head.weight": torch.zeros(8, 4)}
    if extra:
        second["stray.weight"] = torch.zeros(2)
    save_file(second, str(path / SHARD_2), metadata={"format": "pt"})
    wm = weight_map or {
        "model.embed_tokens.weight": SHARD_1,
        "model.norm.weight": SHARD_2,
        "lm_head.weight": SHARD_2,
    }
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return path


def inspect_cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["inspect", *args], env={"ADAPTERDOC_DEBUG": None, "NO_COLOR": "1"})


def one_line_error(stderr: str) -> str:
    assert stderr.count("\n") == 1 and stderr.startswith("adapterdoc: error: "), repr(stderr)
    assert "Traceback" not in stderr
    return stderr


# --------------------------------------------------------------------------- files and adapters


def test_single_file(tmp_path: Path) -> None:
    p = tmp_path / "w.safetensors"
    save_file(lora_tensors(), str(p), metadata={"format": "pt"})
    ck = open_checkpoint(p)
    assert ck.kind == "file" and ck.weights_path == str(p) and ck.adapter_config is None
    assert set(ck.tensors) == {A, B} and ck.tensors[A].shape == (4, 16)
    assert ck.metadata == {"format": "pt"}
    assert set(ck.tensor_file.values()) == {str(p)}


def test_adapter_dir(tmp_path: Path) -> None:
    d = make_adapter(tmp_path / "ad")
    ck = open_checkpoint(d)
    assert ck.kind == "adapter" and ck.is_adapter
    assert ck.adapter_config is not None and ck.adapter_config.r == 4
    assert ck.weights_path == str(d / "adapter_model.safetensors")
    assert ck.tensors[B].shape == (16, 4) and ck.tensors[B].dtype == "F32"


def test_adapter_dir_bin_read_with_weights_only(tmp_path: Path) -> None:
    d = make_adapter(tmp_path / "ad", bin_format=True)
    ck = open_checkpoint(d)
    assert ck.kind == "adapter" and ck.weights_format == "bin"
    assert {k: (v.dtype, v.shape) for k, v in ck.tensors.items()} == {
        A: ("F32", (4, 16)),
        B: ("F32", (16, 4)),
    }
    result = inspect_cli("--json", str(d))
    assert result.exit_code in (0, 1)
    codes = {f["code"] for f in json.loads(result.stdout)["findings"]}
    assert "AD103" in codes  # pickle weights flagged


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    d = tmp_path / "evil"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps(CONFIG))
    marker = tmp_path / "PWNED"
    (d / "adapter_model.bin").write_bytes(pickle.dumps({A: _Payload(str(marker))}))
    before = (d / "adapter_model.bin").read_bytes()
    result = inspect_cli(str(d))
    assert result.exit_code == 3
    assert "weights_only" in one_line_error(result.stderr)
    assert not marker.exists()
    assert (d / "adapter_model.bin").read_bytes() == before


def test_dir_with_one_safetensors_file(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))
    ck = open_checkpoint(d)
    assert ck.kind == "file" and list(ck.tensors) == ["w"]


# --------------------------------------------------------------------------- sharded checkpoints


def test_sharded_dir(tmp_path: Path) -> None:
    d = make_sharded(tmp_path / "sh", extra=True)
    ck = open_checkpoint(d)
    assert ck.kind == "sharded" and ck.index_path == str(d / "model.safetensors.index.json")
    assert len(ck.headers) == 2
    assert ck.tensor_file["lm_head.weight"] == str(d / SHARD_2)
    assert ck.tensor_file["model.embed_tokens.weight"] == str(d / SHARD_1)
    assert ck.tensors["model.norm.weight"].shape == (4,)
    assert ck.extra_in_shards == [(str(d / SHARD_2), "stray.weight")]
    result = inspect_cli("--json", str(d))
    report = json.loads(result.stdout)
    assert report["tensors"] == 3 and len(report["files"]) == 2
    assert "AD104" in {f["code"] for f in report["findings"]}


def test_sharded_dir_with_shards_in_a_subfolder(tmp_path: Path) -> None:
    d = tmp_path / "sub"
    (d / "weights").mkdir(parents=True)
    save_file({"a": torch.zeros(2)}, str(d / "weights" / "part.safetensors"))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "weights/part.safetensors"}})
    )
    assert open_checkpoint(d).tensor_file["a"] == str(d / "weights" / "part.safetensors")


@pytest.mark.parametrize(
    "name",
    [
        "../outside.safetensors",
        "sub/../../outside.safetensors",
        "..",
        "..\\outside.safetensors",
        "C:\\weights\\x.safetensors",
        "C:x.safetensors",
        "\\\\server\\share\\x.safetensors",
        "",
    ],
)
def test_shard_names_outside_the_folder_are_refused(tmp_path: Path, name: str) -> None:
    outside = tmp_path / "outside.safetensors"
    save_file({"lm_head.weight": torch.zeros(8, 4)}, str(outside))
    d = make_sharded(tmp_path / "sh", {"model.embed_tokens.weight": SHARD_1, "lm_head.weight": name})
    index = d / "model.safetensors.index.json"
    before = index.read_bytes()
    with pytest.raises(ConfigError, match="outside the checkpoint folder"):
        open_checkpoint(d)
    result = inspect_cli(str(d))
    assert result.exit_code == 3
    one_line_error(result.stderr)
    assert index.read_bytes() == before


def test_absolute_shard_name_is_refused_even_when_inside(tmp_path: Path) -> None:
    d = make_sharded(tmp_path / "sh")
    wm = {
        "model.embed_tokens.weight": str(d / SHARD_1),
        "lm_head.weight": SHARD_2,
        "model.norm.weight": SHARD_2,
    }
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(ConfigError, match="outside"):
        open_checkpoint(d)


def test_safe_shard_name_keeps_plain_names(tmp_path: Path) -> None:
    index = str(tmp_path / "model.safetensors.index.json")
    assert safe_shard_name(index, "a.safetensors") == str(tmp_path / "a.safetensors")
    assert safe_shard_name(index, "./x/./a.safetensors") == str(tmp_path / "x" / "a.safetensors")
    assert safe_shard_name(index, "a..b.safetensors") == str(tmp_path / "a..b.safetensors")


def test_index_naming_a_missing_shard_or_tensor(tmp_path: Path) -> None:
    d = make_sharded(tmp_path / "a", {"model.embed_tokens.weight": SHARD_1, "x": "model-00009.safetensors"})
    with pytest.raises(InputNotFoundError, match="does not exist"):
        open_checkpoint(d)
    d = make_sharded(tmp_path / "b", {"model.embed_tokens.weight": SHARD_1, "ghost.weight": SHARD_2})
    with pytest.raises(HeaderError) as e:
        open_checkpoint(d)
    assert e.value.key == "ghost.weight"


def test_several_indexes(tmp_path: Path) -> None:
    d = make_sharded(tmp_path / "sh")
    (d / "other.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    assert open_checkpoint(d).index_path == str(d / "model.safetensors.index.json")
    (d / "model.safetensors.index.json").rename(d / "third.safetensors.index.json")
    with pytest.raises(AdapterdocError, match="several shard indexes"):
        open_checkpoint(d)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        open_checkpoint(tmp_path / "nope.safetensors")
    result = inspect_cli(str(tmp_path / "nope.safetensors"))
    assert result.exit_code == 3
    one_line_error(result.stderr)


# --------------------------------------------------------------------------- the Hugging Face cache


def _blob(cache_repo: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    blob = cache_repo / "blobs" / digest
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
    return digest


def add_snapshot(
    hub: Path, repo_id: str, commit: str, files: dict[str, bytes], refs: tuple[str, ...] = ()
) -> Path:
    """huggingface_hub's cache layout: models--org--name/{blobs/<sha256>, refs/<name> (a commit hash),
    snapshots/<commit>/<file> -> ../../blobs/<sha256> (relative symlinks)}."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    for rel, data in files.items():
        digest = _blob(repo, data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(repo / "blobs" / digest, link.parent), link)
    for ref in refs:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snap


COMMIT_1 = "1" * 40
COMMIT_2 = "2" * 40


@pytest.fixture()
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = make_adapter(tmp_path / "src")
    files = {n: (src / n).read_bytes() for n in ("adapter_config.json", "adapter_model.safetensors")}
    hub = tmp_path / "home" / "hub"
    add_snapshot(hub, "org/name", COMMIT_1, files, refs=("main",))
    # a second revision sharing the weights blob, with a different config
    files2 = {**files, "adapter_config.json": json.dumps({**CONFIG, "r": 4, "lora_alpha": 16}).encode()}
    add_snapshot(hub, "org/name", COMMIT_2, files2, refs=("v2",))
    sharded = make_sharded(tmp_path / "shsrc")
    add_snapshot(
        hub,
        "org/sharded",
        COMMIT_1,
        {p.name: p.read_bytes() for p in sharded.iterdir()},
        refs=("main",),
    )
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    return hub


def test_fake_cache_is_valid_for_huggingface_hub(hub: Path) -> None:
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    info = scan_cache_dir(hub)
    assert not info.warnings
    repos = {r.repo_id: r for r in info.repos}
    assert set(repos) == {"org/name", "org/sharded"}
    assert {r.commit_hash for r in repos["org/name"].revisions} == {COMMIT_1, COMMIT_2}
    got = try_to_load_from_cache("org/name", "adapter_model.safetensors", cache_dir=hub)
    assert isinstance(got, str) and got.endswith(f"snapshots/{COMMIT_1}/adapter_model.safetensors")


def test_repo_id_resolves_from_cache(hub: Path) -> None:
    ck = open_checkpoint("org/name")
    assert ck.kind == "adapter" and ck.repo_id == "org/name"
    assert ck.root.endswith(f"snapshots/{COMMIT_1}")
    assert ck.adapter_config is not None and ck.adapter_config.lora_alpha == 8
    ck2 = open_checkpoint(f"org/name@{COMMIT_2}")
    assert ck2.root.endswith(f"snapshots/{COMMIT_2}") and ck2.adapter_config.lora_alpha == 16
    assert open_checkpoint("org/name@v2").root == ck2.root
    sh = open_checkpoint("org/sharded")
    assert sh.kind == "sharded" and len(sh.tensors) == 3


@pytest.mark.parametrize("spec", ["org/missing", "org/name@" + "3" * 40, "org/name@nobranch"])
def test_uncached_repo_id_is_exit_3(hub: Path, spec: str) -> None:
    with pytest.raises(InputNotFoundError):
        open_checkpoint(spec)
    result = inspect_cli(spec)
    assert result.exit_code == 3
    assert spec in one_line_error(result.stderr)


def test_a_local_path_wins_over_a_repo_id(hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "cwd"
    make_adapter(local / "org" / "name", config={**CONFIG, "lora_alpha": 3})
    monkeypatch.chdir(local)
    assert open_checkpoint("org/name").adapter_config.lora_alpha == 3


def test_cli_subprocess_resolves_cache(hub: Path, tmp_path: Path) -> None:
    """The real command in a fresh interpreter, with HF_HUB_CACHE/HF_HOME pointing at the fake cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ADAPTERDOC_"))}
    env.update(HF_HUB_CACHE=str(hub), HF_HOME=str(tmp_path / "home"))
    blobs_before = {p.name: p.read_bytes() for p in (hub / "models--org--name" / "blobs").iterdir()}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "adapterdoc", "inspect", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
            cwd=tmp_path,
        )

    main_rev = run("--json", "org/name")
    assert main_rev.returncode == 0, main_rev.stderr
    report = json.loads(main_rev.stdout)
    assert report["lora"]["alpha"] == 8 and report["tensors"] == 2
    assert COMMIT_1 in report["files"][0]["path"]
    pinned = run("--json", f"org/name@{COMMIT_2}")
    assert pinned.returncode == 0 and json.loads(pinned.stdout)["lora"]["alpha"] == 16
    missing = run("org/not-cached")
    assert missing.returncode == 3 and missing.stdout == ""
    assert "org/not-cached" in one_line_error(missing.stderr)
    assert {p.name: p.read_bytes() for p in (hub / "models--org--name" / "blobs").iterdir()} == blobs_before
