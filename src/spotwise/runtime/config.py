"""The built-in training's configuration, owned here and nowhere else.

:class:`TrainConfig` *is* the task file's ``training:`` section (``spotwise.taskspec`` uses it as
is), :class:`ModelConfig` its ``model:`` (tiny-gpt's; with ``entrypoint: llama`` the section is a
:class:`~spotwise.runtime.llama_config.LlamaConfig`) and :class:`CheckpointConfig` its ``checkpoint:``: one
model per concept, so a knob is declared, bounded and documented once, and the orchestrator hands
the section to the runtime without copying it field by field.

The models are strict (an unknown key is an error, not ignored), frozen, and refuse NaN and
infinity: a ``lr: .nan`` would train nothing, and ``1e400`` (YAML reads it as infinity) once stored
made every later read of the job fail. Validation errors name the field (``training.model.n_heads``
in a task file), which is how :mod:`spotwise.taskspec` reports every problem of a file at once.

This is also part of the contract with the job process: :mod:`spotwise.runtime.node.job` sends a
``TrainConfig`` as JSON (``model_dump(mode="json")``) and validates it again on the other side,
so it must round-trip. Nothing here imports torch, Ray, the engine or the service.

Not to be confused with :class:`~spotwise.runtime.training.loop.TrainSpec`, the Ray-free loop's input:
that one is *how* to train any model (callables for model, batches, loss and optimizer, plus the
loop's mechanics), this one is *what* to train with the built-in model and data, declaratively;
:func:`spotwise.runtime.training.builtin.builtin_spec` (``gpt_spec`` / ``llama_spec``) turns the second into the first.
"""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from spotwise.runtime.llama_config import LlamaConfig
from spotwise.runtime.optim_config import OptimizerConfig

DEFAULT_STORAGE = "file://${SPOTWISE_HOME}/checkpoints"
CLOUD_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")   # a key of a per-cloud checkpoint storage mapping
#: the default entrypoint: the byte-level GPT
BUILTIN_ENTRYPOINT = "tiny-gpt"
LLAMA_ENTRYPOINT = "llama"
#: every built-in model, by entrypoint name (each has its own ``training.model`` schema)
BUILTIN_ENTRYPOINTS = (BUILTIN_ENTRYPOINT, LLAMA_ENTRYPOINT)
#: ``package.module:function`` (dotted module path, one function name)
ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
ENTRYPOINT_ALLOWED = (f"{BUILTIN_ENTRYPOINT!r} or {LLAMA_ENTRYPOINT!r} (the built-in models) or "
                      "'package.module:function', a function of yours that takes training.config and returns a "
                      "spotwise.train.TrainSpec")
TRAIN_FUNC_ALLOWED = ("'package.module:function', an unmodified Ray Train function of yours (it calls "
                      "ray.train.report and ray.train.get_checkpoint) that takes training.config as its config")
#: keys of ``training:`` that only the built-in model reads: with your own entrypoint they would be
#: silently ignored, so they are refused (put them in ``training.config`` and read them in make_spec)
BUILTIN_ONLY = ("model", "batch_size", "lr", "seed", "warmup_steps", "eval", "init_from", "optimizer")
#: keys the loop reads, which a Ray Train function (it owns its loop) never sees: refused with one.
#: (``data`` too: a make_spec reads it through ``spotwise.train.token_batches``, which a Ray Train
#: function's workers have no run to bind to)
TRAIN_FUNC_REFUSED = ("precision", "grad_accum", "activation_checkpointing", "data", "max_nonfinite_steps",
                      "deterministic", "compile")
#: keys only the llama entrypoint reads (tiny-gpt trains at a constant learning rate)
LLAMA_ONLY = ("warmup_steps",)
MAX_CONFIG_BYTES = 1 << 20


def check_json(value: Any, where: str = "") -> None:
    """Refuse what is not strict, finite JSON: string keys, no NaN or infinity, no other types.
    ``where`` is the path inside the value, for the message."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where or 'value'}: {value} is not a finite number (JSON has no NaN or infinity)")
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            check_json(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where or 'mapping'}: key {k!r} is not a string (JSON keys are strings)")
            check_json(v, f"{where}.{k}" if where else k)
        return
    raise ValueError(f"{where or 'value'}: a {type(value).__name__} is not JSON (allowed: mappings, lists, "
                     "strings, finite numbers, true/false, null)")


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

    ``storage`` is one URI for every cloud the run may land on, or a mapping from cloud name to
    that cloud's own store (``{aws: s3://b/p, gcp: gs://b/p}``): each cloud's nodes reach only
    their own cloud's storage with their own identity, so a run planned over several clouds keeps
    its checkpoints on each in that cloud's store, and the launcher copies the last committed one
    across when the run moves (:mod:`spotwise.engine.run.run_stores`). Which names are clouds, and
    that every cloud of the run has one, is checked when a launch resolves it.
    """

    storage: str | dict[str, str] = DEFAULT_STORAGE
    interval_steps: int = Field(default=20, ge=1)      # steps between periodic checkpoints
    keep_last: int = Field(default=2, ge=2)

    @field_validator("storage", mode="before")
    @classmethod
    def _storage(cls, v: Any) -> str | dict[str, str]:
        from spotwise.runtime.storage.base import BadStorageUri, check_uri

        if not isinstance(v, (str, dict)) or (isinstance(v, dict) and not all(isinstance(u, str) for u in v.values())):
            raise ValueError("a URI, or a mapping from cloud name to a URI (e.g. {aws: s3://b/p, gcp: gs://b/p})")
        if isinstance(v, dict):
            if not v:
                raise ValueError("a URI, or a mapping from cloud name to a URI (e.g. {aws: s3://b/p, gcp: gs://b/p})")
            out = {}
            for cloud, uri in v.items():
                if not CLOUD_NAME.match(cloud):
                    raise ValueError(f"{cloud!r}: a cloud name (aws, gcp, azure, ...) as each key")
                try:
                    out[cloud] = check_uri(uri)
                except BadStorageUri as e:
                    raise ValueError(f"{cloud}: {e}") from None
            return out
        try:
            return check_uri(v)
        except BadStorageUri as e:
            raise ValueError(str(e)) from None


class DataConfig(StrictModel):
    """A token file to train on; the task file's ``training.data``: the built-in models' batches, or
    a make_spec's through :func:`spotwise.train.token_batches`.

    ``uri`` names the token file that ``spotwise data tokenize`` wrote (``file:///abs/tokens.bin`` or
    ``s3://bucket/prefix/tokens.bin``), its ``meta.json`` beside it. Checked here without I/O like
    ``checkpoint.storage``; that the file is there, matches its meta and suits the model is checked
    before launch (:func:`spotwise.runtime.data.dataset.check_data`), and each node fetches it into a
    locked cache (:mod:`spotwise.runtime.data.cache`)."""

    uri: str
    # the sha256 of the token file the run must train on (its meta.json's): set by the orchestrator
    # at launch, so that a file tokenized again to the same URI mid-run is refused rather than
    # trained on after a resume; a task file may set it to pin one exact file
    sha256: str | None = None

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        from spotwise.runtime.storage.base import BadStorageUri, check_uri

        try:
            check_uri(v)
        except BadStorageUri as e:
            raise ValueError(f"the URI of a token file: {e}") from None
        name = v.rstrip("/").rsplit("/", 1)[-1]
        if v.endswith("/") or name in ("", "meta.json") or v.count("/") < 3:
            raise ValueError("the URI of the token file itself (e.g. s3://bucket/data/tokens.bin), not of its "
                             "directory or its meta.json")
        return v

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("64 lowercase hex digits: the sha256 in the token file's meta.json")
        return v


class EvalConfig(StrictModel):
    """The held-out loss; the task file's ``training.eval``: the mean next-token cross-entropy over
    the whole token file ``data`` (``spotwise data tokenize``'s output, as ``training.data``), at
    step 0, every ``every_steps`` steps and at the last step
    (:mod:`spotwise.runtime.training.evaluate`)."""

    data: str
    every_steps: int = Field(default=100, ge=1)

    @field_validator("data")
    @classmethod
    def _data(cls, v: str) -> str:
        return DataConfig._uri(v)


class TrainConfig(StrictModel):
    """What to train and how; the task file's ``training:``. ``batch_size`` is the global batch
    in sequences per step; ``precision`` is resolved per device by
    :func:`spotwise.runtime.training.parallel.resolve_precision` (auto: bf16 compute on GPUs and on CPUs
    with native bf16, fp32 elsewhere, since bf16 on an AVX2-only CPU is ~12x slower)."""

    entrypoint: str = BUILTIN_ENTRYPOINT
    # an unmodified Ray Train function (``package.module:train_func``) that owns its loop; instead
    # of ``entrypoint`` (never both). See spotwise.runtime.training.trainfunc
    train_func: str | None = None
    # free-form settings handed to a user entrypoint as ``make_spec(config)``: strict, finite JSON
    config: dict[str, Any] = Field(default_factory=dict)
    # how many times an exception raised by user code restarts the workers before the run fails
    # (a preemption or a lost node never counts: those are retried without limit)
    max_restarts_on_errors: int = Field(default=0, ge=0, le=100)
    # llama: start from the weights of a directory in the Hugging Face Llama layout (file://, s3://,
    # gs://, az://); its config.json is the architecture (spotwise.runtime.weights.config). A resumed
    # run resumes from its own checkpoint, never from here again
    init_from: str | None = None
    # the built-in model's section; its schema is the entrypoint's: ModelConfig for tiny-gpt,
    # LlamaConfig for llama (chosen by _model below, so errors name training.model.<field>)
    model: ModelConfig | LlamaConfig = Field(default_factory=ModelConfig, validate_default=True)
    steps: int = Field(default=200, ge=1)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=3e-4, gt=0)
    seed: int = 0
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    # micro-batches per optimizer step (each rank's share of batch_size is split this many ways;
    # the update equals one step on the whole batch). For a user entrypoint: replaces the spec's
    grad_accum: int = Field(default=1, ge=1, le=1024)
    # recompute each block's activations in backward (less memory, ~1/3 more compute)
    activation_checkpointing: bool = False
    # torch.compile each block before sharding (torchtitan's order: checkpointing, compile, FSDP)
    compile: bool = False
    # llama: linear warmup over this many steps, then cosine decay to min_lr_ratio * lr at ``steps``
    warmup_steps: int = Field(default=0, ge=0)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    # a token file to train on (spotwise data tokenize); None: the built-in stdlib bytes
    data: DataConfig | None = None
    # the built-in models: a held-out token file and how often to measure the loss on it
    eval: EvalConfig | None = None
    # the built-in models' optimizer (spotwise.runtime.optim_config: AdamW, torchtitan's defaults)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    # this many steps in a row with a non-finite loss or gradient norm (each one skipped) end the
    # run without overwriting its checkpoints (spotwise.runtime.training.optim.NonFiniteGuard)
    max_nonfinite_steps: int = Field(default=5, ge=1, le=100000)
    # torch's deterministic algorithms and what CUDA needs (spotwise.runtime.training.determinism);
    # null: on for CPU runs, off on GPUs (it costs flash attention there)
    deterministic: bool | None = None
    # fixed for the built-in entrypoint (no task file or caller sets them); a field, and so a
    # task-file key, the day one needs to vary
    grad_clip: ClassVar[float] = 1.0
    dataset: ClassVar[str] = "stdlib"     # without ``data``: byte-level text of Python's own standard library
    min_lr_ratio: ClassVar[float] = 0.1   # llama's cosine ends at this fraction of lr

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: str) -> str:
        if v not in BUILTIN_ENTRYPOINTS and not ENTRYPOINT_RE.match(v):
            raise ValueError(ENTRYPOINT_ALLOWED)
        return v

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any, info: ValidationInfo) -> Any:
        """Validate ``training.model`` with the entrypoint's schema (``entrypoint`` is declared,
        and so validated, first). The nested model's errors keep their path
        (``training.model.n_kv_heads``); an omitted section is the entrypoint's default."""
        entrypoint = info.data.get("entrypoint", BUILTIN_ENTRYPOINT)
        if entrypoint != LLAMA_ENTRYPOINT:
            if isinstance(v, LlamaConfig):
                raise ValueError(f"a llama model section with entrypoint {entrypoint!r}: set entrypoint llama")
            return v if isinstance(v, ModelConfig) else ModelConfig.model_validate(v)
        if isinstance(v, ModelConfig):
            if v != ModelConfig():
                raise ValueError("a tiny-gpt model section (d_model, ...) with entrypoint llama: give "
                                 "training.model.flavor (debug, 125m, 1b, 8b, llama3.2-1b, llama3.1-8b) or llama dimensions")
            v = {}
        return LlamaConfig.model_validate(v)

    @field_validator("init_from")
    @classmethod
    def _init_from(cls, v: str | None, info: ValidationInfo) -> str | None:
        from spotwise.runtime.storage.base import BadStorageUri, check_uri

        if v is None:
            return v
        if info.data.get("entrypoint") != LLAMA_ENTRYPOINT:
            raise ValueError(f"weights in the Hugging Face Llama layout load into entrypoint {LLAMA_ENTRYPOINT!r} only")
        try:
            return check_uri(v.rstrip("/"))
        except BadStorageUri as e:
            raise ValueError(f"the URI of a directory with config.json and *.safetensors: {e}") from None

    @field_validator("train_func")
    @classmethod
    def _train_func(cls, v: str | None) -> str | None:
        if v is not None and not ENTRYPOINT_RE.match(v):
            raise ValueError(TRAIN_FUNC_ALLOWED)
        return v

    @field_validator("config")
    @classmethod
    def _config(cls, v: dict[str, Any]) -> dict[str, Any]:
        import json

        check_json(v)
        if len(json.dumps(v)) > MAX_CONFIG_BYTES:
            raise ValueError(f"at most {MAX_CONFIG_BYTES >> 20} MiB of JSON (put data in the workdir instead)")
        return v

    @property
    def learning_rate(self) -> float:
        """The peak learning rate: ``optimizer.lr`` when given, else ``lr``."""
        return self.optimizer.lr if self.optimizer.lr is not None else self.lr

    @property
    def user_code(self) -> bool:
        """Whether this trains code of the user's (an entrypoint or a Ray Train function) rather
        than a built-in model."""
        return self.entrypoint not in BUILTIN_ENTRYPOINTS or self.train_func is not None

    @property
    def llama(self) -> LlamaConfig | None:
        """The llama section when this trains the built-in llama, else None."""
        return self.model if isinstance(self.model, LlamaConfig) and not self.user_code else None

    @property
    def user_ref(self) -> tuple[str, str]:
        """``(field, "package.module:function")`` of the user's code: ``train_func`` or ``entrypoint``."""
        if self.train_func is not None:
            return "training.train_func", self.train_func
        return "training.entrypoint", self.entrypoint

    def _given(self, keys: tuple[str, ...]) -> list[str]:
        fields = type(self).model_fields
        return [k for k in keys if k in self.model_fields_set
                and getattr(self, k) != fields[k].get_default(call_default_factory=True)]

    @model_validator(mode="after")
    def _fits_entrypoint(self) -> TrainConfig:
        if self.train_func is not None and self.entrypoint != BUILTIN_ENTRYPOINT:
            raise ValueError(f"training.entrypoint ({self.entrypoint!r}) and training.train_func "
                             f"({self.train_func!r}) are both set: set one (entrypoint returns a TrainSpec that "
                             "spotwise's loop trains; train_func is a Ray Train function that owns its loop)")
        if self.user_code:
            field, ref = self.user_ref
            given = self._given(BUILTIN_ONLY)
            if given:
                raise ValueError(f"{', '.join(given)}: only the built-in models ({', '.join(BUILTIN_ENTRYPOINTS)}) read "
                                 f"{'these' if len(given) > 1 else 'this'}; with {field.split('.')[1]} {ref!r} "
                                 "put such settings in training.config and read them in your function")
            refused = self._given(TRAIN_FUNC_REFUSED) if self.train_func is not None else []
            if self.train_func is not None and "interval_steps" in self.checkpoint.model_fields_set:
                refused.append("checkpoint.interval_steps")
            if refused:
                raise ValueError(f"{', '.join(refused)}: a Ray Train function owns its loop (its precision, "
                                 "micro-batches, data and when it reports a checkpoint); put such settings in "
                                 "training.config (a token file is read through spotwise.train.token_batches "
                                 "by an entrypoint's make_spec)")
        elif self.config:
            raise ValueError(f"training.config is for your own code ('package.module:function' as entrypoint or "
                             f"train_func); {self.entrypoint} is configured by training.model, steps, batch_size "
                             "and lr")
        else:
            self._fits_builtin()
        return self

    def _fits_builtin(self) -> None:
        """Checks that only a built-in model needs: keys the other built-in reads, and a batch
        that splits into ``grad_accum`` micro-batches (per rank too: the loop checks that)."""
        if self.entrypoint != LLAMA_ENTRYPOINT:
            given = self._given(LLAMA_ONLY)
            if given:
                raise ValueError(f"{', '.join(given)}: only entrypoint {LLAMA_ENTRYPOINT!r} reads this "
                                 f"({self.entrypoint} trains at a constant learning rate)")
        if self.optimizer.lr is not None and "lr" in self.model_fields_set:
            raise ValueError(f"training.lr ({self.lr}) and training.optimizer.lr ({self.optimizer.lr}) are both set: "
                             "set one (training.optimizer.lr is the newer spelling)")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}): "
                             "each micro-batch is an equal share of the batch")
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be <= steps ({self.steps})")

    def overrides(self) -> dict[str, Any]:
        """The :class:`~spotwise.runtime.training.spec.TrainSpec` fields this section sets for a user
        entrypoint: ``steps``, ``precision``, ``grad_accum``, ``activation_checkpointing`` and the checkpoint's ``interval_steps`` and
        ``keep_last``, each only when the task gave it (the spec's own value otherwise)."""
        out: dict[str, Any] = {}
        if "steps" in self.model_fields_set:
            out["steps"] = self.steps
        for key in ("precision", "grad_accum", "activation_checkpointing", "max_nonfinite_steps",
                    "deterministic", "compile"):
            if key in self.model_fields_set:
                out[key] = getattr(self, key)
        if "checkpoint" in self.model_fields_set:
            ck = self.checkpoint
            if "interval_steps" in ck.model_fields_set:
                out["checkpoint_interval"] = ck.interval_steps
            if "keep_last" in ck.model_fields_set:
                out["keep_last"] = ck.keep_last
        return out
