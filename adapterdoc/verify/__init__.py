"""`adapterdoc verify`: does an adapter load, fully and meaningfully, on this base (and server)?

The run is :mod:`.run` (options in :mod:`.options`, the base and its expected model in :mod:`.base` and
:mod:`.expected`); the findings come from :mod:`.keys`, :mod:`.config`, :mod:`.weights`, :mod:`.load` and the
profile chosen from :mod:`adapterdoc.engines`. The reports are :mod:`adapterdoc.report.verify_report`.

The names below are loaded on first use, so that the command line can read the profile registry at start-up
without importing the whole run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapterdoc.engines import PROFILES
    from adapterdoc.engines.served import SERVED_AS, served_layout, served_modules
    from adapterdoc.report.verify_report import OWN_BASE, VerifyReport, VerifyRun
    from adapterdoc.verify.config import infer_config
    from adapterdoc.verify.options import SCAN_MODES, VerifyOptions
    from adapterdoc.verify.run import MissingWeightsError, verify, verify_one, verify_own_bases

__all__ = [
    "OWN_BASE",
    "PROFILES",
    "SCAN_MODES",
    "SERVED_AS",
    "MissingWeightsError",
    "VerifyOptions",
    "VerifyReport",
    "VerifyRun",
    "infer_config",
    "served_layout",
    "served_modules",
    "verify",
    "verify_one",
    "verify_own_bases",
]


def __getattr__(name: str) -> Any:
    if name in ("OWN_BASE", "VerifyReport", "VerifyRun"):
        home = "adapterdoc.report.verify_report"
    elif name in ("VerifyOptions", "SCAN_MODES"):
        home = "adapterdoc.verify.options"
    elif name == "PROFILES":
        home = "adapterdoc.engines"
    elif name in ("SERVED_AS", "served_layout", "served_modules"):
        home = "adapterdoc.engines.served"
    elif name == "infer_config":
        home = "adapterdoc.verify.config"
    elif name in __all__:
        home = "adapterdoc.verify.run"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
