"""Resolve a ``--base`` argument without torch: a model folder, a ``config.json``, a cached ``org/name[@rev]``
or ``tiny:LAYOUT``; read its ``config.json`` and, when the registry describes it, its module tree.

The repo-id grammar (:data:`REPO_PATTERN`) is defined here once; the checkpoint opener and the ``hf://`` reader
build their patterns from it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.errors import ConfigError, InputNotFoundError, UnsupportedInputError

if TYPE_CHECKING:
    from adapterdoc.layouts.trees import Tree

REPO_PATTERN = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
"""A Hub repo id, ``org/name``."""
REPO_ID = re.compile(rf"^(?P<repo>{REPO_PATTERN})(?:@(?P<rev>[\w./-]+))?$")
"""``org/name[@revision]`` as a whole argument."""
TINY_PREFIX = "tiny:"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class BaseSpec:
    """A ``--base`` argument, resolved: where its config is and whether weights sit beside it."""

    spec: str
    kind: str
    """``dir``, ``config`` (a config.json file), ``repo`` (local Hugging Face cache) or ``tiny``."""
    root: str | None = None
    """The model directory (``dir``/``repo``/``config``: the folder holding config.json)."""
    config_path: str | None = None
    tiny_layout: str | None = None
    has_weights: bool = False
    """Whether real weights can be loaded (``--load``); the tiny bases always can (fixed seed)."""


def match_repo_id(spec: str) -> re.Match[str] | None:
    """The ``repo``/``rev`` match of a cache repo id, or ``None`` (paths starting with ``.`` or ``/`` never are)."""
    if spec.startswith((".", "/")):
        return None
    return REPO_ID.match(spec)


def resolve_cached_repo(repo_id: str, revision: str | None) -> str:
    """The snapshot folder of ``repo_id`` in the local Hugging Face cache; never touches the network."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    what = f"{repo_id}@{revision}" if revision else repo_id
    try:
        return snapshot_download(repo_id, revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError) as e:
        raise InputNotFoundError(
            what, "not a local path and not in the Hugging Face cache (adapterdoc never downloads)"
        ) from e
    except HFValidationError as e:
        raise UnsupportedInputError(what, f"not a valid repo id: {e}") from e
    except OSError as e:
        raise InputNotFoundError(what, f"cannot read the Hugging Face cache: {e}") from e


def resolve_base(spec: str) -> BaseSpec:
    """Resolve ``--base``: a model directory, a ``config.json``, ``tiny:LAYOUT`` or a cached ``org/name[@rev]``."""
    if spec.startswith(TINY_PREFIX):
        layout = spec[len(TINY_PREFIX) :]
        from adapterdoc.layouts import tiny_layouts

        have = tiny_layouts()
        if layout not in have:
            raise UnsupportedInputError(
                spec, f"no tiny reference model for {layout!r}; have: {', '.join(have)}"
            )
        return BaseSpec(spec, "tiny", tiny_layout=layout, has_weights=True)
    if os.path.isdir(spec):
        cfg = os.path.join(spec, "config.json")
        if not os.path.isfile(cfg):
            raise InputNotFoundError(
                spec, "is a directory without config.json (pass the base model's folder)"
            )
        return BaseSpec(spec, "dir", root=spec, config_path=cfg, has_weights=has_weights(spec))
    if os.path.isfile(spec):
        if not spec.endswith(".json"):
            raise UnsupportedInputError(
                spec, "a base must be a model directory, a config.json, or tiny:LAYOUT"
            )
        root = os.path.dirname(os.path.abspath(spec))
        return BaseSpec(spec, "config", root=root, config_path=spec, has_weights=False)
    if os.path.lexists(spec):
        raise InputNotFoundError(spec, "is a broken symlink")
    m = match_repo_id(spec)
    if m:
        snapshot = resolve_cached_repo(m["repo"], m["rev"])
        cfg = os.path.join(snapshot, "config.json")
        if not os.path.isfile(cfg):
            raise InputNotFoundError(spec, "the cached snapshot has no config.json")
        return BaseSpec(spec, "repo", root=snapshot, config_path=cfg, has_weights=has_weights(snapshot))
    raise InputNotFoundError(spec, "no such file or directory")


def folder_base(folder: str, missing: str) -> BaseSpec:
    """An opened checkpoint folder as a base; ``missing`` says why its config.json is needed when it has none."""
    cfg = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg):
        raise ConfigError(folder, f"has no config.json; {missing}")
    return BaseSpec(folder, "dir", root=folder, config_path=cfg, has_weights=has_weights(folder))


def has_weights(folder: str) -> bool:
    """Whether ``folder`` holds model weights (a known weights file or any ``.safetensors``)."""
    if any(os.path.exists(os.path.join(folder, f)) for f in WEIGHT_FILES):
        return True
    try:
        return any(f.endswith(".safetensors") for f in os.listdir(folder))
    except OSError:
        return False


def read_config_json(base: BaseSpec) -> dict[str, object]:
    """The base's ``config.json`` as a dict, torch-free; refuses what no path can use (remote code, no type)."""
    assert base.config_path is not None
    try:
        with open(base.config_path, "rb") as f:
            raw = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(base.config_path, f"cannot read the model config: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(base.config_path, "config.json must be a JSON object")
    if "auto_map" in raw:
        raise UnsupportedInputError(
            base.config_path,
            "the config needs trust_remote_code (auto_map); adapterdoc never runs repository code",
        )
    if "model_type" not in raw:
        raise ConfigError(base.config_path, "config.json has no `model_type`")
    return raw


def registry_view(base: BaseSpec) -> tuple[Tree | None, str | None, dict[str, object] | None]:
    """(the registry's module tree or ``None``, why not, the raw config) for a resolved base, torch-free.

    Tiny bases are built by transformers, so they have no tree and no raw config."""
    from adapterdoc.layouts.trees import Unmodeled, build_tree

    if base.kind == "tiny":
        return None, "tiny reference bases are built by transformers", None
    raw = read_config_json(base)
    try:
        return build_tree(raw), None, raw
    except Unmodeled as e:
        return None, str(e), raw


__all__ = [
    "REPO_ID",
    "REPO_PATTERN",
    "TINY_PREFIX",
    "BaseSpec",
    "folder_base",
    "has_weights",
    "match_repo_id",
    "read_config_json",
    "registry_view",
    "resolve_base",
    "resolve_cached_repo",
]
