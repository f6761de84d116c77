"""The built-in training's configuration, owned here and nowhere else.

:class:`TrainConfig` *is* the task file's ``training:`` section (``spotwise.taskspec`` uses it as
is), :class:`ModelConfig` its ``model:`` and :class:`CheckpointConfig` its ``checkpoint:``: one
model per concept, so a knob is declared, bounded and documented once, and the orchestrator hands
the section to the runtime without copying it field by field.

The models are strict (an unknown key is an error, not ignored), frozen, and refuse NaN and
infinity: a ``lr: .nan`` would train nothing, and ``1e400`` (YAML reads it as infinity) once stored
made every later read of the job fail. Validation errors name the field (``training.model.n_heads``
in a task file), which is how :mod:`spotwise.taskspec` reports every problem of a file at once.

This is also part of the contract with the job process: :mod:`spotwise.runtime.job` sends a
``TrainConfig`` as JSON (``model_dump(mode="json")``) and validates it again on the other side,
so it must round-trip. Nothing here imports torch, Ray, the engine or the service.

Not to be confused with :class:`~spotwise.runtime.loop.TrainSpec`, the Ray-free loop's input:
that one is *how* to train any model (callables for model, batches, loss and optimizer, plus the
loop's mechanics), this one is *what* to train with the built-in model and data, declaratively;
:func:`spotwise.runtime.builtin.gpt_spec` turns the second into the first.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_STORAGE = "file://${SPOTWISE_HOME}/checkpoints"


class StrictModel(BaseModel):
    """Unknown keys refused, values frozen, numbers finite (the shared base of config sections)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelConfig(StrictModel):
    """The built-in GPT-style model (byte-level); the task file's ``training.model``."""

    d_model: int = Field(default=256, ge=16, le=8192)
    n_layers: int = Field(default=4, ge=1, le=128)
    n_heads: int = Field(default=4, ge=1, le=128)
    seq_len: int = Field(default=128, ge=8, le=8192)
    # fixed by the model, not knobs (and so not task-file keys): bytes, and the usual MLP width
    vocab_size: ClassVar[int] = 256
    mlp_ratio: ClassVar[int] = 4

    @model_validator(mode="after")
    def _heads(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        return self


class CheckpointConfig(StrictModel):
    """Where and how often to checkpoint; the task file's ``training.checkpoint``.

    ``storage`` is checked for what no node could use (a host in a ``file://`` URI, a bucket name
    the cloud refuses) before anything launches. It is where the task *asks* for checkpoints; the
    runtime writes to :attr:`~spotwise.runtime.api.TrainJob.storage_uri`, the run's own location
    the orchestrator resolved from it (or from ``--storage``). ``keep_last >= 2``: a save in
    progress never replaces the last good checkpoint.
    """

    storage: str = DEFAULT_STORAGE
    interval_steps: int = Field(default=20, ge=1)      # steps between periodic checkpoints
    keep_last: int = Field(default=2, ge=2)

    @field_validator("storage")
    @classmethod
    def _storage(cls, v: str) -> str:
        from spotwise.runtime.storage import BadStorageUri, check_uri

        try:
            return check_uri(v)
        except BadStorageUri as e:
            raise ValueError(str(e)) from None


class TrainConfig(StrictModel):
    """What to train and how; the task file's ``training:``. ``batch_size`` is the global batch
    in sequences per step; ``precision`` is resolved per device by
    :func:`spotwise.runtime.parallel.resolve_precision` (auto: bf16 compute on GPUs and on CPUs
    with native bf16, fp32 elsewhere, since bf16 on an AVX2-only CPU is ~12x slower)."""

    entrypoint: Literal["tiny-gpt"] = "tiny-gpt"
    model: ModelConfig = Field(default_factory=ModelConfig)
    steps: int = Field(default=200, ge=1)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=3e-4, gt=0)
    seed: int = 0
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    # fixed for the built-in entrypoint (no task file or caller sets them); a field, and so a
    # task-file key, the day one needs to vary
    weight_decay: ClassVar[float] = 0.0
    grad_clip: ClassVar[float] = 1.0
    dataset: ClassVar[str] = "stdlib"     # byte-level text of Python's own standard library
