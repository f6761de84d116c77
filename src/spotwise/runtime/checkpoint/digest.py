"""``model_sha256``: one fingerprint for a model's weights, independent of how they were sharded.

Canonical byte stream (documented so other tools can reproduce it): for every entry of the full,
unsharded state dict, in ascending order of the key (Python string order), append

    key (UTF-8) + b"\\0" + str(dtype) (e.g. "torch.float32") + b"\\0"
    + ",".join(map(str, shape)) + b"\\0" + the tensor's raw bytes (contiguous, native byte order)

and hash the whole stream with SHA-256. Non-tensor entries are hashed as ``repr(value)`` in
place of the raw bytes with dtype ``"object"`` and an empty shape.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def model_sha256(state_dict: Mapping[str, object]) -> str:
    """SHA-256 hex digest of a full state dict (see the module docstring for the byte order).

    DTensor entries are gathered with ``full_tensor()`` (a collective: call on every rank).
    """
    h = hashlib.sha256()
    for key in sorted(state_dict):
        v = state_dict[key]
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(key.encode() + b"\0" + str(t.dtype).encode() + b"\0"
                     + ",".join(map(str, t.shape)).encode() + b"\0")
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(key.encode() + b"\0object\0\0" + repr(v).encode())
    return h.hexdigest()
