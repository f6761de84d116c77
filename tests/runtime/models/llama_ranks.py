"""Run under torchrun by test_llama.py: build the debug Llama on N ranks, check each rank holds
only its shard of every block parameter, and print the full weights' sha256 (rank 0)."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from spotwise.runtime.training.builtin import llama_spec
from spotwise.runtime.config import TrainConfig
from spotwise.runtime.training.loop import full_model_sha256
from spotwise.runtime.training.parallel import parallelize


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
    if dist.get_rank() == 0:
        print(json.dumps({"sha": sha, "world": world, "local": local, "total": total}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.exit(main())
