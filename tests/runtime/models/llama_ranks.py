"""Run under torchrun by test_llama.py: build the debug Llama on N ranks, check each rank holds
only its shard of every block parameter, and print the full weights' sha256 and the held-out loss
over :func:`eval_tokens` (rank 0)."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from spotwise.runtime.training.builtin import llama_spec
from spotwise.runtime.config import TrainConfig
from spotwise.runtime.training.loop import full_model_sha256
from spotwise.runtime.training.evaluate import eval_loss
from spotwise.runtime.training.parallel import parallelize
from spotwise.runtime.training.standalone import end_process


def eval_tokens():
    """7 windows of 32 (+ a few tokens): an odd count, so two ranks hold unequal shares."""
    import numpy as np

    return np.random.default_rng(7).integers(0, 256, size=7 * 32 + 5)


def main() -> int:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    spec = llama_spec(TrainConfig(entrypoint="llama", model={"flavor": "debug"}, seed=int(sys.argv[1])))
    model = parallelize(spec.model_fn(), device=torch.device("cpu"), precision="fp32")
    local = 0
    for p in model.blocks.parameters():
        assert isinstance(p, DTensor) and p.placements == (Shard(0),), p
        assert p.to_local().shape[0] <= -(-p.shape[0] // world)
        local += p.to_local().numel()
    total = sum(p.numel() for p in model.blocks.parameters())
    sha = full_model_sha256(model)
    ev = eval_loss(model, eval_tokens(), 32, device=torch.device("cpu"), rank=dist.get_rank(), world=world, batch=2)
    if dist.get_rank() == 0:
        print(json.dumps({"sha": sha, "world": world, "local": local, "total": total, "eval": ev}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    end_process(main())
