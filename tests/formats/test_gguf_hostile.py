"""The hostile GGUF corpus (``fixtures/make_hostile_gguf.py``): verify's verdict is llama.cpp's on every file (an
error finding or exit 3 exactly where llama.cpp refuses, aborts, or loads what cannot work), and no command ends
in a traceback or exit 4 on any of them. ``test_gguf_hostile_oracle.py`` checks the corpus's verdicts against
llama.cpp itself."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.errors import AdapterdocError
from adapterdoc.formats import gguf as fmt
from adapterdoc.formats.gguf.header import read_header
from adapterdoc.formats.gguf.load_rules import verify_gguf

ROOT = Path(__file__).resolve().parents[2]
ERROR_PREFIX = "adapterdoc: error: "


def load_generator() -> Any:
    name = "adapterdoc_fixtures_make_hostile_gguf"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "fixtures" / "make_hostile_gguf.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


GEN = load_generator()
NAMES = GEN.case_names()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("hostile_gguf")
    cases = {c.name: c for c in GEN.generate(folder)}
    return {"cases": cases, "base": GEN.base_path(folder), "config": GEN.config_dir(folder)}


def errors_of(path: Path, base: Path | None) -> list[str] | None:
    """The codes of verify's error findings, or ``None`` for exit 3 (one line)."""
    try:
        found = verify_gguf(path, base)
    except AdapterdocError as e:
        assert "\n" not in str(e) and str(e).strip()
        return None
    return [f.code for f in found if f.severity == "error"]


@pytest.mark.parametrize("name", NAMES)
def test_gguf_hostile_verify_verdict(corpus: dict[str, Any], name: str) -> None:
    """An error (or exit 3) exactly where llama.cpp does not load the file, or loads what cannot work."""
    case = corpus["cases"][name]
    errors = errors_of(Path(case.path), corpus["base"])
    failed = errors is None or bool(errors)
    assert failed == case.must_fail, (case.reason, errors)


EXPECTED = {
    # the rule each file breaks → the one error code verify gives (None: exit 3, the header cannot be read)
    "array_nested_5000": None,
    "array_of_arrays": None,
    "key_empty": ["AD863"],
    "key_duplicate": ["AD863"],
    "alignment_u64": ["AD863"],
    "alignment_48": ["AD863"],
    "tensor_name_64": ["AD864", "AD854", "AD854"],  # (both halves then lack their partner's name)
    "ne_negative": ["AD864", "AD857"],
    "type_999": ["AD864"],
    "type_removed_q4_2": ["AD864"],
    "type_q8_0_row_48": ["AD864", "AD856"],
    "offset_misaligned": ["AD865"],
    "offset_swapped": ["AD865"],
    "offset_gap": ["AD865"],
    "header_only": ["AD859"],
    "alpha_nan": ["AD866"],
    "alpha_inf": ["AD866"],
    "alora_tokens_not_array": ["AD867"],
    "alora_tokens_int32": ["AD867"],
    "rank_zero_pair": ["AD868"],
    "lora_a_dims0": ["AD856"],
    "arch_missing": ["AD852"],
    "general_type_array_of_2": ["AD850"],
    "valid_general_type_array_of_1": [],
    "valid_alpha_array_of_1": [],
    "valid_norm_scalar_dims0": [],
    "valid_non_utf8_value": [],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gguf_hostile_codes(corpus: dict[str, Any], name: str) -> None:
    case = corpus["cases"][name]
    assert errors_of(Path(case.path), corpus["base"]) == EXPECTED[name], case.reason


def test_gguf_hostile_messages_quote_llama_cpp(corpus: dict[str, Any]) -> None:
    """Each container finding says what llama.cpp does and which rule, naming the tensor or key."""
    cases = corpus["cases"]

    def first(name: str, code: str) -> Any:
        return next(f for f in verify_gguf(Path(cases[name].path), None) if f.code == code)

    f = first("offset_misaligned", "AD865")
    assert "has offset 4, expected 0" in f.message and f.key == "blk.0.attn_q.weight.lora_a" and f.hint
    f = first("type_999", "AD864")
    assert "ggml type 999" in f.message and "refuses" in f.message
    f = first("alpha_nan", "AD866")
    assert "nan" in f.message and "loads" in f.message
    f = first("arch_missing", "AD852")
    assert "arch mismatch" in f.message
    with pytest.raises(AdapterdocError, match="array of arrays") as e:
        read_header(cases["array_nested_5000"].path)
    assert e.value.key == "general.x"
    f = first("general_type_array_of_2", "AD850")
    assert "ARRAY of 2 STRING" in f.message and "aborts" in f.message


def test_gguf_hostile_names_stay_one_line(tmp_path: Path) -> None:
    """A key or tensor name with a newline is shown escaped: exit 3 and findings stay one line."""
    spec = GEN.valid()
    spec = GEN.replace(spec, kvs=[*spec.kvs, GEN.kv("bad\nkey", 13, b"")])
    (tmp_path / "k.gguf").write_bytes(spec.build())
    with pytest.raises(AdapterdocError) as e:
        read_header(tmp_path / "k.gguf")
    assert "\n" not in str(e.value) and "bad\\nkey" in str(e.value)


def test_gguf_describe_counts(corpus: dict[str, Any]) -> None:
    """inspect's facts: tensors, parameters (every element), dtypes, header bytes (where the data starts)."""
    d = fmt.describe(Path(corpus["cases"]["valid"].path))
    header = read_header(corpus["cases"]["valid"].path)
    r = GEN.RANK
    assert d["tensors"] == 8
    assert (
        d["parameters"] == 2 * (2 * 64 * r + 32 * r + 64 * r) == sum(t.numel for t in header.tensors.values())
    )
    assert d["dtypes"] == {"F32": 8}
    assert d["header_bytes"] == header.data_start and d["header_bytes"] % 32 == 0 and d["header_bytes"] > 0
    assert d["model"] is False and d["problems"] == []
    base = fmt.describe(corpus["base"])
    assert base["model"] is True and base["tensors"] == 21 and base["dtypes"] == {"F32": 21}


@pytest.mark.parametrize("name", NAMES)
def test_gguf_hostile_describe_never_crashes(corpus: dict[str, Any], name: str) -> None:
    """describe (inspect's facts) is exit 3 or strict JSON-able facts with integer counts on every file."""
    case = corpus["cases"][name]
    try:
        d = fmt.describe(Path(case.path))
    except AdapterdocError as e:
        assert "\n" not in str(e)
        return
    json.dumps(d, allow_nan=False)
    assert all(isinstance(d[k], int) and d[k] >= 0 for k in ("tensors", "parameters", "header_bytes"))
    assert sum(d["dtypes"].values()) == d["tensors"]
    assert fmt.describe_lines(Path(case.path))


def test_gguf_is_model_file(corpus: dict[str, Any], tmp_path: Path) -> None:
    cases = corpus["cases"]
    assert fmt.is_model_file(corpus["base"])
    assert fmt.detect(corpus["base"]) is None
    assert not fmt.is_model_file(cases["valid"].path)
    # LoRA tensors with general.type = model: a mislabelled adapter (verify's AD850), not a model
    assert not fmt.is_model_file(cases["general_type_model"].path)
    assert not fmt.is_model_file(cases["bad_magic"].path)
    assert not fmt.is_model_file(cases["array_nested_5000"].path)
    assert not fmt.is_model_file(tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_gguf_hostile_to_peft(corpus: dict[str, Any], name: str, tmp_path: Path) -> None:
    """GGUF → PEFT (convert, and the PEFT view verify reads) is exit 3 or a PEFT folder: exit 3 wherever the file
    alone shows llama.cpp would not load it, and never a slice past the end of the file."""
    pytest.importorskip("numpy")
    case = corpus["cases"][name]
    base_free = errors_of(Path(case.path), None)
    try:
        fmt.to_peft(Path(case.path), tmp_path / "out", base=str(corpus["config"]), outtype=None)
    except AdapterdocError as e:
        assert "\n" not in str(e)
        return
    assert not fails_alone(base_free), f"converted a file that verify fails on its own: {base_free}"
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config.get("alora_invocation_tokens") == ([5] if name == "valid_alora_tokens" else None)


RESCUED = {"AD858"}
"""What convert reads although llama.cpp does not load it: an alpha of another number type (a UINT32 8 is 8)."""


def fails_alone(base_free: list[str] | None) -> bool:
    """verify fails the file without a base (exit 3, or an error convert does not rescue)."""
    return base_free is None or not set(base_free) <= RESCUED


@pytest.mark.parametrize("name", ["provenance_not_json", "provenance_list", "provenance_wrong_shape"])
def test_gguf_malformed_provenance_falls_back(corpus: dict[str, Any], name: str, tmp_path: Path) -> None:
    """adapterdoc's own metadata that is not what it writes is ignored: llama.cpp's name map reads the file with
    --base, and without one the exit-3 line says why the base is needed."""
    pytest.importorskip("numpy")
    path = Path(corpus["cases"][name].path)
    got = fmt.to_peft(path, tmp_path / "a", base=str(corpus["config"]), outtype=None)
    assert "module paths from llama.cpp's name map" in got.notes
    with pytest.raises(
        AdapterdocError, match=r"adapterdoc\.peft\.source metadata is not what adapterdoc writes"
    ):
        fmt.to_peft(path, tmp_path / "b", base=None, outtype=None)


def _commands(case: Any, corpus: dict[str, Any], out: Path) -> dict[str, list[str]]:
    f, base, config = case.path, str(corpus["base"]), str(corpus["config"])
    return {
        "inspect": ["inspect", f],
        "inspect --json": ["inspect", f, "--json"],
        "verify --base gguf": ["verify", f, "--base", base],
        "verify --base gguf --json": ["verify", f, "--base", base, "--json"],
        "verify --base config": ["verify", f, "--base", config],
        "convert --to peft": ["convert", f, "--to", "peft", "--base", config, "--out", str(out / "peft")],
        "convert --to mlx": ["convert", f, "--to", "mlx", "--base", config, "--out", str(out / "mlx")],
    }


@pytest.mark.parametrize("name", NAMES)
def test_gguf_hostile_cli(cli, corpus: dict[str, Any], name: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Every command on every file: exit 0, 1 or 3 (never 4), no traceback, exit 3 is one line on stderr, --json
    is one JSON object; verify fails (1 or 3) where llama.cpp does not load the file; convert is exit 3 wherever
    the file alone shows llama.cpp would not load it."""
    case = corpus["cases"][name]
    base_free = errors_of(Path(case.path), None)
    for what, args in _commands(case, corpus, tmp_path).items():
        r = cli(*args)
        said = f"{what}: exit {r.exit_code}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
        assert r.exit_code in (0, 1, 3), said
        assert "Traceback" not in r.stdout + r.stderr, said
        if r.exit_code == 3:
            assert r.stderr.startswith(ERROR_PREFIX) and r.stderr.count("\n") == 1, said
        if what.endswith("--json"):
            assert isinstance(json.loads(r.stdout), dict), said
        if what.startswith("verify") and case.must_fail:
            assert r.exit_code in (1, 3), said
        if (
            what.startswith("verify") and not case.must_fail
        ):  # llama.cpp loads it and it works: the whole doctor
            assert r.exit_code == 0, (
                said
            )  # (its PEFT view too) passes it, against the model GGUF or the config
        if what.startswith("convert") and fails_alone(base_free):
            assert r.exit_code == 3, said
