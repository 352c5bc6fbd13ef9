"""The output-folder rule's options (:func:`adapterdoc.st.atomic.check_output_folder`): what each command's way of
using its folder changes, and what it never changes. The same paths on the command line:
``tests/commands/test_output_folders.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapterdoc.errors import InputNotFoundError, RefusedError
from adapterdoc.st.atomic import OUTPUT_MARKER, TEMP_PREFIX, check_output_folder, ensure_folder


def test_a_missing_path_is_made_below_the_nearest_folder(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "out"
    assert check_output_folder(out) == str(out)
    assert not (tmp_path / "a").exists()  # nothing is written


def test_without_make_parents_the_parent_must_exist(tmp_path: Path) -> None:
    out = tmp_path / "a" / "out"
    with pytest.raises(InputNotFoundError, match="the parent folder of --out does not exist"):
        check_output_folder(out, make_parents=False)
    (tmp_path / "a").mkdir()
    assert check_output_folder(out, make_parents=False) == str(out)


def test_a_previous_output_is_replaced_only_with_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / OUTPUT_MARKER).write_text("{}")
    with pytest.raises(RefusedError, match="pass --force"):
        check_output_folder(out, force=False)
    with pytest.raises(RefusedError, match=r"choose a new or empty folder\)"):
        check_output_folder(out)  # a command without --force
    assert check_output_folder(out, force=True) == str(out)


def test_writing_into_takes_the_callers_own_folder_without_force(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "progress.jsonl").write_text("")

    def ours(p: str) -> bool:
        return (Path(p) / "progress.jsonl").is_file()

    assert check_output_folder(out, force=False, ours=ours, into=True) == str(out)
    (out / "progress.jsonl").unlink()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RefusedError, match="is not empty"):
        check_output_folder(out, force=False, ours=ours, mark="progress.jsonl", into=True)
    with pytest.raises(
        RefusedError, match=r"did not write \(no progress.jsonl in it\); it holds 1 entry: notes.txt"
    ):
        check_output_folder(out, force=True, ours=ours, mark="progress.jsonl", into=True)


def test_writing_into_an_existing_folder_needs_only_that_folder_writable(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    (parent / "out").mkdir()
    parent.chmod(0o555)
    try:
        assert ensure_folder(str(parent / "out")) == str(parent / "out")
        with pytest.raises(RefusedError, match=r"folder is not writable \(mode 0555\); .* is made in it"):
            check_output_folder(parent / "out")  # built beside it and renamed: the parent is written
        with pytest.raises(RefusedError, match="is made in it"):
            ensure_folder(str(parent / "new"))
    finally:
        parent.chmod(0o755)


def test_a_folder_written_into_is_never_a_symlink(tmp_path: Path) -> None:
    """``train-smoke --out`` and ``roundtrip --keep`` wrote through a link to a folder before."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(RefusedError, match="is a symlink"):
        ensure_folder(str(tmp_path / "link"), option="--keep")
    assert list((tmp_path / "real").iterdir()) == []


def test_a_symlink_above_the_folder_is_fine(tmp_path: Path) -> None:
    """Only the output folder itself is never a link: a linked folder above it (``/tmp`` on macOS) is written in."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert check_output_folder(tmp_path / "link" / "out") == str(tmp_path / "link" / "out")
    assert ensure_folder(str(tmp_path / "link" / "out")) == str(tmp_path / "link" / "out")
    assert (tmp_path / "real" / "out").is_dir()


def test_the_option_is_named_in_the_messages(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(RefusedError, match="give a new or empty folder for --keep"):
        ensure_folder(str(tmp_path / "file"), option="--keep")
    with pytest.raises(RefusedError, match="choose another --keep"):
        ensure_folder(str(tmp_path / "file" / "out"), option="--keep")


def test_train_takes_a_folder_of_temp_leftovers_as_empty(tmp_path: Path) -> None:
    from adapterdoc.fit.outdir import NEW, plan_out

    out = tmp_path / "run"
    out.mkdir()
    (out / f"{TEMP_PREFIX}x").write_text("")
    assert plan_out(str(out), resume=False, force=False).mode == NEW
