"""The held-out loss: mean next-token cross-entropy over a whole token file, the same at any world size.

Window ``i`` is tokens ``[i*seq_len, (i+1)*seq_len + 1)`` for every ``i`` where that range fits
(so consecutive windows share one token: every token but the first is a target exactly once);
its first ``seq_len`` tokens are the input, its last ``seq_len`` the targets, and the loss is the
mean over all targets of all windows, each token's cross-entropy taken from fp32 logits.

Rank ``r`` of ``world`` takes windows ``r, r + world, ...`` in batches; every rank runs the same
number of forward passes (FSDP gathers each block's parameters collectively, so a rank with no
window left runs one more on window 0 and counts nothing of it). The per-rank sums are float64 and
summed over the ranks in float64, so the number differs between world sizes only by float64
rounding of the sums (the per-token losses themselves do not depend on the world size).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

EVAL_BATCH = 8


def n_windows(n_tokens: int, seq_len: int) -> int:
    """How many windows of ``seq_len + 1`` tokens, stepped by ``seq_len``, fit in ``n_tokens``."""
    return max(0, (n_tokens - 1) // seq_len)


def window_batch(tokens: Any, idx: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of the windows ``idx``: int64 tensors ``[len(idx), seq_len]``."""
    starts = idx.astype(np.int64) * seq_len
    rows = torch.from_numpy(np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)[None, :]], dtype=np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


@torch.no_grad()
def eval_loss(model: nn.Module, tokens: Any, seq_len: int, *, device: torch.device, rank: int = 0,
              world: int = 1, batch: int = EVAL_BATCH) -> float:
    """The module docstring's loss of ``model`` (logits ``[b, t, vocab]`` from ids ``[b, t]``) over
    ``tokens`` (any 1-d array of ids); called on every rank of the group, which all get the same
    value. ``ValueError`` when not one window fits."""
    n = n_windows(len(tokens), seq_len)
    if n == 0:
        raise ValueError(f"the eval file has {len(tokens)} tokens: at least seq_len + 1 ({seq_len + 1}) are needed")
    mine = np.arange(rank, n, world, dtype=np.int64)
    rounds = -(-(-(-n // world)) // batch)           # ceil(ceil(n / world) / batch): the same on every rank
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)     # (sum of losses, number of targets)
    try:
        for k in range(rounds):
            idx = mine[k * batch:(k + 1) * batch]
            real = len(idx) > 0
            x, y = window_batch(tokens, idx if real else np.zeros(1, dtype=np.int64), seq_len)
            logits = model(x.to(device))
            ce = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), reduction="none")
            if real:
                total[0] += ce.double().sum()
                total[1] += ce.numel()
    finally:
        model.train(was_training)
    if dist.is_initialized() and world > 1:
        dist.all_reduce(total)
    return float(total[0] / total[1])


def eval_due(spec: Any, step: int) -> bool:
    """Whether the loop measures the held-out loss after ``step`` (every ``eval_every``, and the last)."""
    if spec.eval_fn is None:
        return False
    return step >= spec.steps or (spec.eval_every is not None and step % spec.eval_every == 0)


def evaluate(spec: Any, session: Any, model: nn.Module, step: int, *, rank: int, world: int, device: torch.device,
             into: list[dict], train_loss: float | None = None) -> float:
    """Measure ``spec.eval_fn`` at ``step`` on every rank, append ``{step, loss, train_loss}`` to
    ``into`` and tell the session (``report_eval``, when it has one: rank 0's reaches the
    orchestrator). ``train_loss``: this rank's loss of the step just trained, averaged here over
    all ranks (every rank's micro-batches, not rank 0's alone); None at step 0."""
    loss = float(spec.eval_fn(model, rank, world, device))
    if train_loss is not None and dist.is_initialized() and world > 1:
        t = torch.tensor([train_loss], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        train_loss = float(t.item() / world)
    into.append({"step": step, "loss": loss, "train_loss": train_loss})
    report = getattr(session, "report_eval", None)
    if report is not None:
        report(step, loss, train_loss)
    return loss


class EvalTokens:
    """``eval_fn`` over a token file (``training.eval.data``): fetched once per node into the data
    cache (sha256-checked against its meta.json), memory-mapped, ids checked below ``vocab_size``.
    Picklable (it travels to Ray workers); the file is opened on first use in each process."""

    def __init__(self, uri: str, *, seq_len: int, vocab_size: int) -> None:
        self.uri, self.seq_len, self.vocab_size = uri, seq_len, vocab_size
        self._tokens: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}

    def tokens(self) -> Any:
        if self._tokens is None:
            from spotwise.runtime.data.cache import fetch
            from spotwise.runtime.data.tokens import TokenFile

            self._tokens = TokenFile.open(fetch(self.uri).path, vocab_size=self.vocab_size).tokens
        return self._tokens

    def __call__(self, model: nn.Module, rank: int, world: int, device: torch.device) -> float:
        return eval_loss(model, self.tokens(), self.seq_len, device=device, rank=rank, world=world)
