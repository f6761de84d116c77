"""Run under torchrun by test_grad_memory.py: one optimizer step of the Llama (``debug`` made wider
and shorter, so gradients outweigh activations) in 4 micro-batches, two ways on every rank: the
product's :func:`~spotwise.runtime.training.loop.forward_backward_step` and the full-gradient way
(gradient sync off for all but the last micro-batch, so FSDP2 keeps each parameter's unsharded
gradient until then; what the loop did before issue 49). Rank 0 prints one JSON line: each way's
peak bytes, and the bytes of the full model's parameters.

Peak memory on CPU, where torch has no allocator statistics: :class:`PeakBytes` counts every
tensor storage created under it, from creation until it is freed (a weak reference's callback),
and keeps the maximum of the sum. torch's own trackers (``torch.distributed._tools``'s
``MemTracker``, ``FSDPMemTracker``) work the same way but refuse a module called more than once
per step, which is what gradient accumulation is."""

import json
import os
import sys
import weakref

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from spotwise.runtime.training.standalone import end_process


class PeakBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once among those created under this mode."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.refs: dict[int, weakref.ref] = {}
        self.now = self.peak = 0

    def _freed(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)
        self.refs.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:            # a view allocates nothing; neither does an op writing into its input
            return out
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                 if isinstance(t, torch.Tensor) and not t.is_meta}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.is_meta:
                continue
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in self.live or key in given or st.nbytes() == 0:
                continue
            self.live[key] = st.nbytes()
            self.refs[key] = weakref.ref(st, lambda _r, k=key: self._freed(k))
            self.now += st.nbytes()
            self.peak = max(self.peak, self.now)
        return out


def peak(way: str) -> int:
    from spotwise.runtime.config import TrainConfig
    from spotwise.runtime.training.builtin import llama_spec
    from spotwise.runtime.training.loop import _split, forward_backward_step
    from spotwise.runtime.training.parallel import parallelize

    cpu = torch.device("cpu")
    cfg = TrainConfig(entrypoint="llama", batch_size=16, grad_accum=4, precision="fp32",
                      model={"flavor": "debug", "dim": 256, "ffn_dim": 768, "n_layers": 8, "seq_len": 16})
    spec = llama_spec(cfg)
    model = parallelize(spec.model_fn(), device=cpu, precision="fp32")
    rank, world = dist.get_rank(), dist.get_world_size()
    micro = _split(spec.batch_fn(0, rank, world), spec.grad_accum)
    with PeakBytes() as mem:
        if way == "sharded":
            forward_backward_step(spec, model, micro, cpu)
        else:
            for i, mb in enumerate(micro):
                model.set_requires_gradient_sync(i == len(micro) - 1)
                (spec.loss_fn(model, mb) / spec.grad_accum).backward()
    return mem.peak


def main() -> int:
    dist.init_process_group("gloo")
    out: dict = {"world": dist.get_world_size(), **{way: peak(way) for way in sys.argv[1:]}}
    from spotwise.runtime.config import TrainConfig
    from spotwise.runtime.training.builtin import llama_spec

    cfg = TrainConfig(entrypoint="llama", model={"flavor": "debug", "dim": 256, "ffn_dim": 768, "n_layers": 8, "seq_len": 16})
    with torch.device("meta"):
        out["param_bytes"] = sum(p.numel() * 4 for p in llama_spec(cfg).model_fn().parameters())
    if dist.get_rank() == 0:
        print(json.dumps(out))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    end_process(main())
