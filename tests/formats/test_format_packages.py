"""A format package's submodules never shadow its contract: importing ``adapterdoc.formats.mlx.X`` sets the package
attribute ``X``, so a submodule named like a contract function (``check``, ``detect``) would replace that function
with a module once anything imported it (found when ``formats/mlx_check.py`` moved to ``formats/mlx/check.py``)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from adapterdoc import formats

CONTRACT = ("detect", "to_peft", "from_peft", "check", "describe")


@pytest.mark.parametrize("name", [f for f in formats.FORMATS if f != "peft"])
def test_every_submodule_imported_the_contract_is_still_functions(name: str) -> None:
    pytest.importorskip("numpy")
    pytest.importorskip("gguf")
    pkg = formats.module(name)
    subs = [m.name for m in pkgutil.iter_modules(pkg.__path__)]
    assert subs, "a format package has submodules"
    for sub in subs:
        importlib.import_module(f"{pkg.__name__}.{sub}")
    for fn in CONTRACT:
        if hasattr(pkg, fn):
            assert callable(getattr(pkg, fn)) and not isinstance(getattr(pkg, fn), type(pkg)), f"{name}.{fn}"
    assert not set(subs) & set(CONTRACT)
