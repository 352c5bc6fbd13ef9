"""Build adapterdoc's wheel from a clean copy of the source tree, offline; print the wheel's path.

``python scripts/build_wheel.py OUT_DIR``. The package (``adapterdoc/``, ``pyproject.toml``, ``README.md``) is copied
to a temporary folder first, so no ``build/`` or ``*.egg-info`` of an earlier build can leak into the wheel and
nothing is written into the source tree. The build uses the running interpreter's setuptools
(``--no-build-isolation``, no index asked) when it is recent enough to build wheels by itself, else pip's isolated
build. Used by ``.ci/run`` and the packaging tests.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "adapterdoc")
"""Everything the build backend reads (the package, its metadata and the long description)."""
JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def build_wheel(out_dir: str | Path, root: Path = ROOT) -> Path:
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="adapterdoc-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in SOURCES:
            p = root / name
            if p.is_dir():
                shutil.copytree(p, src / name, ignore=JUNK)
            else:
                shutil.copy2(p, src / name)
        before = set(out.glob("adapterdoc-*.whl"))
        cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out)]
        if _setuptools_builds_wheels(root):
            cmd += ["--no-build-isolation", "--no-index"]
        subprocess.run([*cmd, str(src)], check=True)
    built = sorted(set(out.glob("adapterdoc-*.whl")) - before) or sorted(out.glob("adapterdoc-*.whl"))
    if not built:
        raise SystemExit(f"build_wheel: no wheel appeared in {out}")
    return built[-1]


def _setuptools_builds_wheels(root: Path = ROOT) -> bool:
    """The installed setuptools satisfies pyproject's ``setuptools>=X`` and builds wheels by itself (>= 70.1; older
    ones need the ``wheel`` package). Otherwise pip's isolated build fetches a suitable one from the index."""
    import re
    from importlib.metadata import PackageNotFoundError, version

    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    m = re.search(r'"setuptools\s*>=\s*([0-9.]+)"', pyproject)
    needed = max(_version(m.group(1)) if m else (0,), (70, 1))
    try:
        return _version(version("setuptools")) >= needed
    except (PackageNotFoundError, ValueError):
        return False


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/build_wheel.py OUT_DIR", file=sys.stderr)
        return 2
    print(build_wheel(argv[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
