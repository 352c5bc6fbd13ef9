"""Sharded training (FSDP2, ``torch.distributed.fsdp.fully_shard``) under ``accelerate launch --use_fsdp``.

On accelerators accelerate shards the model itself at ``prepare`` (its FSDP plugin, ``fsdp_version: 2``). On CPU
processes (gloo) accelerate runs plain data parallel whatever the config says, so the loop shards here with the same
rule: every block named by ``FSDP_TRANSFORMER_CLS_TO_WRAP`` (else the model's ``_no_split_modules``: its decoder
layers) is a unit of its own, then the root. Parameters become ``DTensor`` shards: anything that reads them whole
(the adapter, a checkpoint, the replica checksum) gathers them with :func:`full` on every process, in the same order.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

from adapterdoc.errors import AdapterdocError

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from torch import nn
    from torch.distributed.checkpoint.state_dict import OptimizerStateType, ValueType
    from torch.distributed.tensor import DTensor

ACCELERATE, OWN = "accelerate", "fully_shard"


def mode(acc: Accelerator) -> str | None:
    """How this run is sharded: by accelerate (``accelerate``), by the loop on CPU processes (``fully_shard``), or
    not at all (``None``: one process, or no FSDP asked)."""
    from accelerate.utils import DistributedType

    if acc.distributed_type == DistributedType.FSDP:
        if not getattr(acc, "is_fsdp2", False):
            raise AdapterdocError(
                "accelerate",
                "FSDP version 1 is not supported by adapterdoc train: set `fsdp_version: 2` in the accelerate config "
                "(or pass --fsdp_version 2)",
            )
        return ACCELERATE
    asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    return OWN if asked and acc.num_processes > 1 else None


def shard(model: nn.Module, acc: Accelerator) -> nn.Module:
    """``fully_shard`` every transformer block of ``model`` and then ``model`` itself over this run's processes
    (CPU, gloo); the model, sharded in place."""
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6 keeps it under _composable
        from torch.distributed._composable.fsdp import fully_shard  # type: ignore[attr-defined]  # its old home

    mesh = init_device_mesh("cpu", (acc.num_processes,))
    names = _block_classes(model)
    blocks = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if not blocks:
        raise AdapterdocError(
            "FSDP",
            f"no module of {type(model).__name__} is one of {sorted(names) or 'its _no_split_modules'} to shard; "
            "set fsdp_transformer_layer_cls_to_wrap in the accelerate config",
        )
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _block_classes(model: nn.Module) -> set[str]:
    named = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "")
    if named.strip():
        return {n.strip() for n in named.split(",") if n.strip()}
    found: set[str] = set()
    for m in model.modules():
        found.update(getattr(m, "_no_split_modules", None) or ())
    return found


def is_sharded(t: torch.Tensor) -> bool:
    return hasattr(t, "full_tensor")


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a ``DTensor`` shard (a collective: every process calls it), else ``t``."""
    return cast("DTensor", t).full_tensor() if is_sharded(t) else t


def full_trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name, whole and on the CPU (every process gathers; all get the same)."""
    return {
        n: full(p.detach()).to("cpu", copy=True).contiguous()
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> OptimizerStateType:
    """The optimizer's state, whole and keyed by parameter name (``torch.distributed.checkpoint``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, _raw(optimizer), options=opts)


def load_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tensors: dict[str, torch.Tensor],
    opt_state: OptimizerStateType,
) -> None:
    """Put a checkpoint's whole trainable tensors and optimizer state back into the sharded model and optimizer."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, cast("dict[str, ValueType]", tensors), options=opts)
    set_optimizer_state_dict(
        model, _raw(optimizer), opt_state, options=StateDictOptions(full_state_dict=True)
    )


def _raw(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)
