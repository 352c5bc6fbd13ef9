"""Shared test fixtures: tiny reference models built once per session, a CLI runner."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest

# The repository root on sys.path, so that a test module may import a helper from another room's folder as
# ``tests.<room>.<module>`` whether pytest runs from the root (``python -m pytest``), as the ``pytest`` script, or on
# one file.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session")
def tiny_model() -> Callable[..., Any]:
    """``tiny_model(layout, seed=0)``: a fresh deep copy of a cached tiny model (mutate freely)."""
    import copy

    from adapterdoc.ml.tiny import build_tiny

    cache: dict[tuple[str, int], Any] = {}

    def get(layout: str, seed: int = 0) -> Any:
        if (layout, seed) not in cache:
            cache[(layout, seed)] = build_tiny(layout, seed)
        return copy.deepcopy(cache[(layout, seed)])

    return get


@pytest.fixture
def cli() -> Callable[..., Any]:
    """Run the CLI in-process: ``cli("inspect", path, "--json")`` → click Result (stdout/stderr split)."""
    from click.testing import CliRunner

    from adapterdoc.cli import main

    def run(*args: str, env: dict[str, str] | None = None) -> Any:
        runner = CliRunner()
        return runner.invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)

    return run


class WheelVenv:
    """A fresh virtualenv with adapterdoc's wheel installed (not editable), seeing the running interpreter's
    packages (torch and friends) through a ``.pth`` file: no network, and it works whether the tests run from a
    global install or inside a virtualenv (``--system-site-packages`` would see the base interpreter instead)."""

    def __init__(self, root: Any, wheel: Any) -> None:
        import subprocess
        import sys
        from pathlib import Path

        self.root, self.wheel = Path(root), Path(wheel)
        subprocess.run([sys.executable, "-m", "venv", str(self.root)], check=True, capture_output=True)
        self.bin = self.root / "bin"
        self.python = self.bin / "python"
        self.purelib = Path(self.run_py("import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
        (self.purelib / "_adapterdoc_tests_parent_env.pth").write_text(
            "".join(f"import site; site.addsitedir({d!r})\n" for d in _parent_site_dirs()), encoding="utf-8"
        )
        # --ignore-installed: the parent's adapterdoc (an editable install, same version) must not count as
        # "already satisfied", or the venv would run the parent's code instead of the wheel's
        pip = [
            str(self.python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
        ]
        subprocess.run([*pip, str(self.wheel)], check=True, capture_output=True)

    @property
    def env(self) -> dict[str, str]:
        """The environment for commands in the venv: its bin/ first, no PYTHONPATH (which would shadow the wheel)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        return env

    def run_py(self, code: str, **kw: Any) -> str:
        import subprocess

        kw.setdefault("cwd", self.root)
        res = subprocess.run(
            [str(self.python), "-c", code], capture_output=True, text=True, env=self.env, check=True, **kw
        )
        return res.stdout


def _parent_site_dirs() -> list[str]:
    import site

    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """adapterdoc's wheel (built offline from this source tree by scripts/build_wheel.py) in a fresh venv."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    dist = tmp_path_factory.mktemp("dist")
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "build_wheel.py"), str(dist)],
        capture_output=True,
        text=True,
        check=True,
    )
    return WheelVenv(tmp_path_factory.mktemp("wheel-venv") / "env", out.stdout.strip().splitlines()[-1])


class LightVenv(WheelVenv):
    """The light install: a fresh venv (no pip) holding adapterdoc and only its base dependencies (the closure
    of ``[project] dependencies``, no extra: no torch, transformers, PEFT or numpy), each linked from where the
    running interpreter has it, adapterdoc from this source tree: ``pip install adapterdoc``, with no network
    and in well under a second."""

    def __init__(self, root: Any) -> None:
        import subprocess
        import sys
        from pathlib import Path

        self.root = Path(root)
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(self.root)], check=True, capture_output=True
        )
        self.bin = self.root / "bin"
        self.python = self.bin / "python"
        self.purelib = Path(self.run_py("import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
        links = {"adapterdoc": Path(__file__).resolve().parents[1] / "adapterdoc"}
        for dist in light_closure():
            base = Path(str(dist.locate_file("")))
            for top in {Path(str(f)).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
                links.setdefault(top, base / top)
        for top, src in links.items():
            if src.exists():
                (self.purelib / top).symlink_to(src, target_is_directory=src.is_dir())


def light_closure() -> list[Any]:
    """The installed distributions ``[project] dependencies`` pull in (no extras), each once."""
    import importlib.metadata as md
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    todo = [Requirement(d) for d in project["dependencies"]]
    seen: dict[str, Any] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen[name] = md.distribution(req.name)
        todo += [Requirement(r) for r in seen[name].requires or ()]
    return list(seen.values())


@pytest.fixture(scope="session")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> LightVenv:
    """The light install (no ML extra) of this source tree, built once per session."""
    return LightVenv(tmp_path_factory.mktemp("light-venv") / "env")


ORACLES_ROOT = os.environ.get("ADAPTERDOC_ORACLES", "/opt/adapterdoc-oracles")
"""Where ``.ci/oracles/NAME.sh`` builds each oracle environment (see .ci/oracles/README.md)."""


def oracles_required() -> bool:
    """In CI (or with ADAPTERDOC_REQUIRE_ORACLES=1) a missing oracle environment is a failure, not a skip."""
    return bool(os.environ.get("CI")) or os.environ.get("ADAPTERDOC_REQUIRE_ORACLES") == "1"


@pytest.fixture(scope="session")
def oracle_env() -> Callable[[str], Any]:
    """``oracle_env("vllm")`` → the ``bin/python`` of that oracle's environment; skips (fails in CI) without it."""
    from pathlib import Path

    def get(name: str) -> Path:
        python = Path(ORACLES_ROOT) / name / "bin" / "python"
        if not python.exists():
            why = f"oracle environment {name!r} is not built (bash .ci/oracles/{name}.sh)"
            if oracles_required():
                pytest.fail(why)
            pytest.skip(why)
        return python

    return get
