"""How a model is sharded and where it runs: FSDP2 with bf16 parameters and fp32 reductions.

One function per concern, composed by :func:`parallelize`:

* :func:`shard_units` picks the modules that become FSDP units (each transformer block), so
  only one block's full parameters exist at a time in forward/backward: those a spec's
  ``shard_blocks`` hook returns, else the modules of the classes the model declares unsplittable
  (a transformers-style ``_no_split_modules`` list of class names), else ``model.blocks`` or the
  modules of its top-level ``ModuleList``s;
* :func:`apply_fsdp` calls ``fully_shard`` on each unit and then the root (the root owns the
  embeddings and the head) with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``:
  compute in bf16, gradients reduced and optimizer state kept in fp32, which is what makes the
  run both fast on GPUs and bitwise reproducible (fp32 master weights);
* :func:`apply_activation_checkpointing` trades recompute for memory per unit;
* :func:`resolve_precision` turns the user's ``precision`` (``auto`` | ``bf16`` | ``fp32``) into
  what runs. ``auto`` is bf16 on CUDA and on CPUs with native bf16 matmuls (oneDNN's check:
  AVX512-BF16/AMX, or AVX512 emulation), fp32 elsewhere: on an AVX2-only CPU a bf16 matmul is
  about 12x slower than fp32 (measured: 7.7 vs 90 GFLOP/s on one AMD EPYC core), so bf16 there
  would turn a 2-minute local demo into a 20-minute one. ``bf16`` forces it anywhere.

FSDP2 only: FSDP1's optimizer-state reload and CPU-offload gather fail on CPU.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)

def device_for_rank() -> torch.device:
    """``cuda:<local rank>`` when CUDA is usable and the group is NCCL, else CPU."""
    if torch.cuda.is_available() and (not dist.is_initialized() or dist.get_backend() == "nccl"):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def shard_units(model: nn.Module, hook: Callable[[nn.Module], list[nn.Module]] | None = None) -> list[nn.Module]:
    """The modules to wrap one by one, by the first rule that applies:

    1. ``hook(model)`` (a ``TrainSpec.shard_blocks``): the user knows their model best;
    2. the model's own declaration, ``_no_split_modules`` (class names, as transformers models
       declare the layers that must stay whole): every module of those classes, the outermost of
       nested ones (a declaration that matches nothing falls through, with a warning);
    3. ``model.blocks`` when present, else every module in a top-level ``nn.ModuleList`` (the
       usual home of transformer layers).
    """
    if hook is not None:
        return check_units(model, hook(model))
    declared = getattr(model, "_no_split_modules", None)
    if declared:
        matched = by_class_names(model, set(declared))
        if matched:
            return matched
        log.warning("the model declares _no_split_modules %s but has none of them: sharding by blocks", declared)
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        return list(blocks)
    units: list[nn.Module] = []
    for child in model.children():
        if isinstance(child, nn.ModuleList):
            units.extend(child)
    return units


def by_class_names(model: nn.Module, names: set[str]) -> list[nn.Module]:
    """The submodules of ``model`` whose class name is in ``names``, in module order, skipping
    any inside another one (the root itself is never one: it is always sharded last)."""
    out: list[nn.Module] = []
    prefixes: list[str] = []
    for name, m in model.named_modules():
        if not name or type(m).__name__ not in names or any(name.startswith(p) for p in prefixes):
            continue
        out.append(m)
        prefixes.append(name + ".")
    return out


def check_units(model: nn.Module, units) -> list[nn.Module]:
    """``units`` (what a ``shard_blocks`` hook returned) as a list, when each is a distinct
    submodule of ``model`` other than the model itself (the root is sharded last on its own);
    else ``ValueError`` saying what was wrong."""
    if isinstance(units, nn.Module) or not hasattr(units, "__iter__"):
        raise ValueError(f"returned {type(units).__name__}: allowed is a list of submodules of the model")
    units = list(units)
    subs = {id(m) for name, m in model.named_modules() if name}
    for i, u in enumerate(units):
        if u is model:
            raise ValueError(f"item {i} is the model itself (the root is sharded last on its own): allowed is a "
                             "list of its submodules")
        if not isinstance(u, nn.Module) or id(u) not in subs:
            raise ValueError(f"item {i} ({type(u).__name__}) is not a submodule of the model: allowed is a list "
                             "of its submodules (e.g. list(model.layers))")
    if len({id(u) for u in units}) != len(units):
        raise ValueError("lists a module twice: allowed is a list of distinct submodules")
    return units


def apply_activation_checkpointing(units: list[nn.Module]) -> None:
    """Recompute each unit's activations in backward (non-reentrant, deterministic)."""
    from torch.utils.checkpoint import checkpoint

    for u in units:
        fwd = u.forward

        def wrapped(*args, _fwd=fwd, **kwargs):
            return checkpoint(_fwd, *args, use_reentrant=False, **kwargs)

        u.forward = wrapped


PRECISIONS = ("auto", "bf16", "fp32")


def cpu_has_native_bf16() -> bool:
    """oneDNN's own answer to "are bf16 kernels fast here" (False when it cannot tell)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 - a torch build without oneDNN: no fast bf16 path on CPU
        return False


def check_precision(precision: str) -> None:
    """Refuse anything but :data:`PRECISIONS`, naming the allowed values."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")


def resolve_precision(precision: str, device: torch.device) -> str:
    """``bf16`` or ``fp32``: what ``precision`` means on ``device`` (see the module docstring)."""
    check_precision(precision)
    if precision != "auto":
        return precision
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
        return "bf16"
    return "fp32"


def apply_fsdp(model: nn.Module, units: list[nn.Module], *, precision: str = "bf16") -> nn.Module:
    """``precision`` ``bf16``: bf16 parameters in compute, fp32 reductions and master weights;
    ``fp32``: everything in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if precision not in ("bf16", "fp32"):
        raise ValueError(f"apply_fsdp needs a resolved precision (bf16 or fp32); got {precision!r}")
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if precision == "bf16" else MixedPrecisionPolicy())
    for u in units:
        fully_shard(u, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def parallelize(model: nn.Module, *, device: torch.device, precision: str = "auto",
                activation_checkpointing: bool = False, compile: bool = False,
                shard_blocks: Callable[[nn.Module], list[nn.Module]] | None = None) -> nn.Module:
    """Move ``model`` to ``device`` and shard it over the default process group (which must be
    initialised; a world of 1 is fine). ``precision`` as in :func:`resolve_precision`; the units
    as :func:`shard_units` picks them (``shard_blocks``: the spec's hook)."""
    precision = resolve_precision(precision, device)
    model.to(device)
    units = shard_units(model, shard_blocks)
    if activation_checkpointing:
        apply_activation_checkpointing(units)
    if compile:
        for u in units:
            u.compile()
    return apply_fsdp(model, units, precision=precision)
