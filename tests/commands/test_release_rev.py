"""The README's pre-commit and Action examples pin a ``rev`` that exists (issue 25): the release tag of the
package's version, made by the README's release steps, and (in a clone that has tags) a tag ``git tag`` lists.

A ``git clone`` of a repository, local or not, shallow or not, gets the tags of the commits it fetches, so CI's
fresh clone of main sees the release tag once it is on main; a checkout with no tags at all (an export, a tagless
mirror) skips the last check and says so."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _version() -> str:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def _pinned() -> list[str]:
    revs = re.findall(r"^\s*rev:\s*(\S+)", README, re.M)
    uses = re.findall(r"uses:\s*\S+/adapterdoc@(\S+)", README)
    assert revs and uses, "the README's pre-commit and Action examples"
    return revs + uses


def test_the_examples_pin_the_versions_release_tag() -> None:
    tag = f"v{_version()}"
    assert set(_pinned()) == {tag}


def test_the_release_steps_make_that_tag() -> None:
    steps = re.search(r"^- Releasing:.*?(?=^- |\Z)", README, re.M | re.S)
    assert steps, "a 'Releasing:' item in the README's Development section"
    assert "git tag -a vX.Y.Z" in steps.group(0) and "git push origin vX.Y.Z" in steps.group(0)


def test_the_pinned_rev_is_a_tag_of_this_clone() -> None:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tags = subprocess.run(
        [git, "-C", str(ROOT), "tag", "--list"], capture_output=True, text=True
    ).stdout.split()
    if not tags:
        pytest.skip("this clone has no tags at all (the release tag is made on main by the release steps)")
    for rev in set(_pinned()):
        assert rev in tags, f"{rev} is pinned in the README but is not a tag here ({', '.join(tags[:10])})"
        ok = subprocess.run([git, "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"])
        assert ok.returncode == 0, rev
