"""Stage a (sharded) state dict to host memory, so training can go on while it is written.

:class:`HostStager` copies every tensor of a DCP state dict (plain tensors and FSDP2 DTensors,
nested in dicts/lists) into CPU buffers and returns a state dict of the same structure that owns
those copies: the live parameters and optimizer state may change right after ``stage`` returns.

* DTensors stay DTensors (same mesh, placements, global shape and stride) wrapping a CPU copy of
  the local shard, so DCP writes exactly the same shards as it would from the live state.
* Buffers are allocated once and reused by later stages (the caller guarantees the previous
  write has finished before staging again); on CUDA they are pinned so the device-to-host copy is
  a DMA and can be non-blocking (one ``synchronize`` at the end).
* Non-tensor leaves (optimizer hyper-parameters, ``step`` ints) are deep-copied.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class HostStager:
    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self.bytes_staged = 0

    def stage(self, state: Any) -> Any:
        """A host-memory copy of ``state`` (a nested dict/list of tensors and plain values)."""
        self.bytes_staged = 0
        cuda = [False]
        out = self._stage(state, "", cuda)
        if cuda[0]:
            torch.cuda.synchronize()
        return out

    def _copy(self, t: torch.Tensor, path: str, cuda: list[bool]) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            pin = t.is_cuda
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buf
        if t.is_cuda:
            cuda[0] = True
            buf.copy_(t.detach(), non_blocking=True)
        else:
            buf.copy_(t.detach())
        self.bytes_staged += buf.numel() * buf.element_size()
        return buf

    def _stage(self, obj: Any, path: str, cuda: list[bool]) -> Any:
        from torch.distributed.tensor import DTensor

        if isinstance(obj, DTensor):
            local = self._copy(obj.to_local(), path, cuda)
            # the constructor, not from_local: from_local would move the copy back to the mesh's device
            return DTensor(local, obj._spec, requires_grad=False)
        if isinstance(obj, torch.Tensor):
            return self._copy(obj, path, cuda)
        if isinstance(obj, dict):
            return {k: self._stage(v, f"{path}/{k}", cuda) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._stage(v, f"{path}/{i}", cuda) for i, v in enumerate(obj))
        return copy.deepcopy(obj)
