"""Shared test fixtures: tiny reference models built once per session, a CLI runner."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest

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
