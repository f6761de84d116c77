"""The ranks an offer gives a task, and whether the task's batch and model fit them: checked when
the run is planned, before anything launches or bills.

The runtime starts one rank per GPU (:func:`spotwise.runtime.training.trainer.fit`: ``nodes x GPUs
per node``; a CPU node is one rank), so the world size is the offer's, not the task's: the default
``batch_size: 8`` on two 8-GPU nodes is 16 ranks, and each rank's share of the batch is split into
``grad_accum`` micro-batches (:func:`spotwise.runtime.training.loop._split`). A batch those do not
divide, or a rank that does not fit its GPU's memory (:mod:`spotwise.runtime.memory`), used to fail
only once the nodes were up and billing, and Ray retried it as an ordinary failure. The planner
leaves such an offer out and says why (``launch --dry-run``); when no offer is left the task is
refused (exit 2) naming the field and the world sizes the offers would give.

Only the built-in models are checked: user code (an entrypoint's spec, a Ray Train function) owns
its batches and model.
"""

from __future__ import annotations

from spotwise.errors import InputError, Problem
from spotwise.pricing.integrity import GPU_MEMORY_GIB
from spotwise.pricing.offer import Offer
from spotwise.runtime.memory import GIB, USABLE, rank_memory
from spotwise.taskspec import TaskSpec


def ranks_per_node(offer: Offer) -> int:
    """Ranks the runtime starts on one node of ``offer``: one per GPU; a CPU node (the local
    cloud's ``cpu:1``) runs one, or, with ``local.emulated_gpus`` N (tests and benchmarks), N: the
    local cloud then sells its nodes with ``accelerator_count`` N."""
    return max(1, offer.accelerator_count)


def world_size(offer: Offer, nodes: int) -> int:
    return nodes * ranks_per_node(offer)


def gpu_memory_gib(offer: Offer) -> float | None:
    """One GPU's memory: the offer's own figure, else the accelerator's nominal one; None on CPU."""
    if offer.accelerator == "cpu":
        return None
    return offer.gpu_memory_gib or GPU_MEMORY_GIB.get(offer.accelerator)


def batch_problem(spec: TaskSpec, world: int) -> str | None:
    """Why ``training.batch_size`` cannot be split over ``world`` ranks x ``grad_accum``; None when it can."""
    t = spec.training
    if t.user_code or t.batch_size % (world * t.grad_accum) == 0:
        return None
    return (f"training.batch_size {t.batch_size} is not divisible by {world} ranks x training.grad_accum "
            f"{t.grad_accum} (each rank's share of the batch is split into grad_accum equal micro-batches)")


def memory_problem(spec: TaskSpec, offer: Offer, world: int) -> str | None:
    """Why a rank of the task does not fit one GPU of ``offer`` (the estimate and the GPU's memory);
    None when it fits, on CPU, or for user code."""
    gib = gpu_memory_gib(offer)
    est = rank_memory(spec.training, world)
    if gib is None or est is None or est.total <= USABLE * gib * GIB:
        return None
    hint = "" if spec.training.activation_checkpointing else "; training.activation_checkpointing: true cuts activations"
    return (f"a rank needs about {est.describe()}, over {USABLE:.0%} of one {offer.accelerator}'s {gib:g} GiB "
            f"at {world} ranks{hint}")


def why_not(spec: TaskSpec, offer: Offer) -> str | None:
    """Why the task cannot run on ``offer`` at its world size, or None."""
    world = world_size(offer, spec.resources.nodes)
    return batch_problem(spec, world) or memory_problem(spec, offer, world)


def batch_error(spec: TaskSpec, worlds: list[int], source: str = "plan") -> InputError:
    """``training.batch_size`` refused for every world size in ``worlds``, naming them."""
    t, nodes = spec.training, spec.resources.nodes
    ws = sorted(set(worlds))
    shown = ", ".join(f"{w} ({nodes} node(s) x {w // nodes})" for w in ws)
    allowed = ", ".join(str(w * t.grad_accum) for w in ws)
    return InputError(Problem("training.batch_size", t.batch_size,
                              f"a multiple of the world size x training.grad_accum ({t.grad_accum}) of an offer that "
                              f"fits resources: the offers give world sizes {shown}, so a multiple of {allowed}"),
                      source=source)


def refusal(spec: TaskSpec, refused: dict[str, tuple[Offer, str]]) -> InputError:
    """The task's error when every offer was refused (``refused``: offer key -> (offer, why)): the
    field at fault, what was given, and the world sizes the offers would give."""
    t, nodes = spec.training, spec.resources.nodes
    batch = [why for _, why in refused.values() if why.startswith("training.batch_size")]
    if batch:
        return batch_error(spec, [world_size(o, nodes) for o, _ in refused.values()])
    o, why = next(iter(refused.values()))
    llama = t.llama
    given = (f"llama {llama.flavor}" if llama is not None and llama.flavor
             else t.model.model_dump(exclude_defaults=True) or "default")
    return InputError(Problem("training.model", given,
                              f"a model a rank can hold on the offers' GPUs; on {o.instance_type}: {why}"),
                      source="plan")
