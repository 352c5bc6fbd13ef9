"""PEFT's module-matching rules, torch-free: ``check_target_module_exists`` and the ``rank_pattern`` /
``alpha_pattern`` key rule. Tests compare them with PEFT's own functions so they cannot drift silently."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable


def module_name_matches(pattern_key: str, module: str) -> bool:
    """PEFT's ``rank_pattern``/``alpha_pattern`` key rule: ``(.*\\.)?(KEY)$`` matches the module name."""
    try:
        return re.match(rf"(.*\.)?({pattern_key})$", module) is not None
    except re.error:
        return False


def peft_selects(
    module: str,
    target_modules: str | Collection[str] | None,
    exclude_modules: str | Collection[str] | None = None,
    modules_to_save: Iterable[str] | None = None,
    layers_to_transform: int | Collection[int] | None = None,
    layers_pattern: str | Iterable[str] | None = None,
) -> bool:
    """PEFT's ``check_target_module_exists`` (peft.tuners.tuners_utils, 0.21) on one module name, torch-free.

    ``target_modules`` is a regex (full match) or a collection of names (exact or ``.name`` suffix);
    ``exclude_modules`` likewise; a ``modules_to_save`` entry keeps LoRA off every module under it; with a list of
    targets, ``layers_to_transform`` (an int or a list) keeps only modules in those layers, the layer index being
    the first number after ``layers_pattern`` (or after the second path segment when no pattern is given).
    """
    if exclude_modules:
        if isinstance(exclude_modules, str):
            if re.fullmatch(exclude_modules, module):
                return False
        elif module in exclude_modules or any(module.endswith(f".{e}") for e in exclude_modules):
            return False
    if modules_to_save and any(re.match(rf"(^|.*\.){m}($|\..*)", module) for m in modules_to_save):
        return False
    if target_modules is None:
        return False
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, module) is not None
    if module in target_modules:
        return True
    found = any(module.endswith(f".{t}") for t in target_modules)
    using_layers = layers_to_transform is not None and (
        len(layers_to_transform) != 0 if isinstance(layers_to_transform, list) else True
    )
    if not (using_layers and found) or layers_to_transform is None:
        return found
    match = None
    if not layers_pattern:
        match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", module)
    else:
        for pattern in [layers_pattern] if isinstance(layers_pattern, str) else layers_pattern:
            match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", module)
            if match is not None:
                break
    if match is None:
        return False
    index = int(match["idx"])
    return (
        index == layers_to_transform if isinstance(layers_to_transform, int) else index in layers_to_transform
    )


def pattern_key(keys: Iterable[str], name: str) -> str | None:
    """PEFT's ``get_pattern_key``: the first ``rank_pattern``/``alpha_pattern`` key matching ``name``."""
    for key in keys:
        if module_name_matches(key, name):
            return key
    return None
