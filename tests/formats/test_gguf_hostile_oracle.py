"""llama.cpp's own loader as the oracle for the hostile GGUF corpus (``-m oracle``; environment:
.ci/oracles/llama_cpp.sh): for every file of ``fixtures/make_hostile_gguf.py`` (and adapterdoc's own conversions of
a real PEFT adapter), what ``llama_adapter_lora_init`` does on the tiny Llama's GGUF (loads, refuses with the reason
in its log, or aborts the process) is the verdict the corpus states, and verify agrees: an error finding (or exit 3)
exactly where llama.cpp does not load the file, or loads one whose outputs are NaN (those are run, and are)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.formats import gguf as fmt
from tests.formats.gguf_helpers import generic_model, peft_adapter
from tests.formats.test_gguf_hostile import GEN, errors_of
from tests.formats.test_gguf_oracle import _base, drive, llama  # noqa: F401

pytestmark = [pytest.mark.oracle, pytest.mark.ml]


def llama_cpp_verdicts(python: Path, base_gguf: Path, paths: list[Path]) -> dict[str, dict[str, Any]]:
    """``{file name: {"outcome": loads|refuses|aborts, "errors": [...]}}`` from the driver's ``load`` (one process
    for all files; where one aborts the process, the rest run in a new one)."""
    rows: dict[str, dict[str, Any]] = {}
    todo = list(paths)
    while todo:
        r = drive(python, "load", base_gguf, *todo, ok=False)
        done = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        for row in done:
            outcome = GEN.LOADS if row["loaded"] else GEN.REFUSES
            rows[Path(row["path"]).name] = {"outcome": outcome, "errors": row["errors"]}
        todo = todo[len(done) :]
        if r.returncode != 0:
            assert todo and r.returncode < 0, (r.returncode, r.stdout[-1000:], r.stderr[-3000:])
            signame = signal.Signals(-r.returncode).name
            rows[todo[0].name] = {"outcome": GEN.ABORTS, "errors": [signame, r.stderr[-600:]]}
            todo = todo[1:]
    return rows


def test_gguf_hostile_corpus_is_llama_cpps_verdict(llama, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    import numpy as np

    model = generic_model("llama")
    base_dir, base_gguf = _base(llama, tmp_path, model)
    cases = {c.name: c for c in GEN.generate(tmp_path / "corpus")}
    adapter = peft_adapter(model, tmp_path / "peft", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    ours = {}
    for outtype in ("f32", "f16", "bf16"):
        ours[outtype] = tmp_path / f"ours-{outtype}.gguf"
        fmt.from_peft(adapter, ours[outtype], base=str(base_dir), outtype=outtype)
    paths = [Path(c.path) for c in cases.values()] + list(ours.values())
    got = llama_cpp_verdicts(llama["python"], base_gguf, paths)
    wrong = []
    for name, c in cases.items():
        row = got[Path(c.path).name]
        if row["outcome"] != c.llama_cpp:
            wrong.append(
                f"{name}: llama.cpp {row['outcome']}, the corpus says {c.llama_cpp} ({row['errors']})"
            )
        elif c.phrase and not any(c.phrase in e for e in row["errors"]):
            wrong.append(f"{name}: llama.cpp's log lacks {c.phrase!r}: {row['errors']}")
        errors = errors_of(Path(c.path), base_gguf)
        failed = errors is None or bool(errors)
        if failed != (row["outcome"] != GEN.LOADS or not c.working):
            wrong.append(
                f"{name}: llama.cpp {row['outcome']} (working: {c.working}), verify's errors {errors}"
            )
    for outtype, path in ours.items():
        assert got[path.name]["outcome"] == GEN.LOADS, (outtype, got[path.name])
        assert errors_of(path, base_gguf) == [], outtype
    assert not wrong, "\n".join(wrong)
    # what loads but cannot work: llama.cpp's own logits with it are not finite, or it dies computing them, or they
    # are the base's own (an adapter that changes nothing); the valid file's are finite and differ from the base's
    plain = tmp_path / "base-logits.npy"
    drive(llama["python"], "logits", base_gguf, "-", "1,5,9,3", plain)
    for name in ["valid", *(n for n, c in cases.items() if not c.working)]:
        out = tmp_path / f"{name}.npy"
        r = drive(llama["python"], "logits", base_gguf, cases[name].path, "1,5,9,3", out, ok=False)
        works = (
            r.returncode == 0
            and bool(np.isfinite(np.load(out)).all())
            and not np.array_equal(np.load(out), np.load(plain))
        )
        assert works == cases[name].working, (name, r.returncode, r.stderr[-800:])
