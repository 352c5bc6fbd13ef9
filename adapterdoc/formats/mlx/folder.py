"""An mlx-lm adapter folder opened header-only (:class:`MlxAdapter`), and the fields ``load_adapters`` needs from
its ``adapter_config.json`` (:func:`lora_parameters`): shared by the MLX format's reader, writer and checks."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from adapterdoc.errors import ConfigError, RefusedError, UnsupportedInputError
from adapterdoc.opened import MLX_WEIGHTS

if TYPE_CHECKING:
    from adapterdoc.st.header import Header

CONFIG = "adapter_config.json"
WEIGHTS = MLX_WEIGHTS
LEAVES = ("lora_a", "lora_b", "m")
"""The adapter parameters ``load_adapters`` accepts (``adapter_leaves``)."""


@dataclass
class MlxAdapter:
    """An mlx-lm adapter folder opened header-only: its config as parsed and the weights' header."""

    folder: str
    raw: dict[str, Any]
    """``adapter_config.json`` as parsed (unvalidated: :func:`lora_parameters` checks what it reads)."""
    header: Header


def open_mlx(src: str | os.PathLike[str]) -> MlxAdapter:
    """Open an mlx-lm adapter folder header-only; a config mlx-lm cannot read is refused naming the field."""
    from adapterdoc.st.header import read_header

    folder = os.fspath(src)
    cfg = os.path.join(folder, CONFIG)
    if not os.path.isfile(os.path.join(folder, WEIGHTS)):
        raise UnsupportedInputError(folder, f"is not an mlx-lm adapter folder (no {WEIGHTS})")
    if not os.path.isfile(cfg):
        raise ConfigError(folder, f"has {WEIGHTS} but no {CONFIG}: mlx-lm's load_adapters needs it (AD815)")
    try:
        raw = json.loads(Path(cfg).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(cfg, f"cannot read: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(cfg, "must be a JSON object")
    return MlxAdapter(folder, raw, read_header(os.path.join(folder, WEIGHTS)))


def lora_parameters(adapter: MlxAdapter) -> tuple[str, int, float, float, int]:
    """(fine_tune_type, rank, scale, dropout, num_layers), refusing what ``load_adapters`` would fail on."""
    raw = adapter.raw
    cfg = os.path.join(adapter.folder, CONFIG)
    kind = raw.get("fine_tune_type", "lora")
    if kind == "full":
        raise RefusedError(
            cfg, "fine_tune_type is `full`: the folder holds whole weights, not an adapter (AD807)"
        )
    if kind not in ("lora", "dora"):
        raise ConfigError(cfg, f"fine_tune_type {kind!r} is none of lora, dora, full (AD815)")
    params = raw.get("lora_parameters")
    missing = [f for f in ("num_layers",) if f not in raw]
    if not isinstance(params, dict):
        missing.append("lora_parameters")
    else:
        missing += [f"lora_parameters.{f}" for f in ("rank", "scale", "dropout") if f not in params]
    if missing:
        raise ConfigError(cfg, f"lacks {', '.join(missing)}: mlx-lm's load_adapters fails without it (AD815)")
    assert isinstance(params, dict)
    wrong = [why for why in (_field_error(f, raw, params) for f in _FIELDS) if why]
    if wrong:
        raise ConfigError(cfg, f"{'; '.join(wrong)}: mlx-lm's load_adapters fails on it (AD815)")
    return kind, params["rank"], float(params["scale"]), float(params["dropout"]), raw["num_layers"]


_FIELDS = ("num_layers", "rank", "scale", "dropout", "keys")
"""The fields ``load_adapters`` uses, in the order its messages name them."""


def _field_error(name: str, raw: dict[str, Any], params: dict[str, Any]) -> str | None:
    """What is wrong with one field mlx-lm reads (``None``: nothing): ``num_layers`` slices the layer list
    (an integer), ``rank`` is a tensor dimension (a positive integer), ``scale`` multiplies every delta (a finite
    number), ``dropout`` is ``nn.Dropout``'s probability (in [0, 1)), ``keys`` is tested with ``in`` (a list of
    module paths: a string would match its substrings)."""
    value = raw["num_layers"] if name == "num_layers" else params.get(name)
    if name == "num_layers" and not _integer(value):
        return f"num_layers must be an integer, got {value!r}"
    if name == "rank" and not (_integer(value) and value > 0):
        return f"lora_parameters.rank must be a positive integer, got {value!r}"
    if name == "scale" and not _number(value):
        return f"lora_parameters.scale must be a finite number, got {value!r}"
    if name == "dropout" and not (_number(value) and 0 <= value < 1):
        return f"lora_parameters.dropout must be a number in [0, 1), got {value!r}"
    if (
        name == "keys"
        and value is not None
        and not (isinstance(value, list) and all(isinstance(k, str) for k in value))
    ):
        return f"lora_parameters.keys must be a list of module paths, got {value!r}"
    return None


def _integer(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
