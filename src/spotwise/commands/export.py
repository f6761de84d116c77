"""``spotwise export JOB DIR [--step N] [--dtype bf16|fp16|fp32]``: a run's weights in the Hugging Face Llama layout.

The job's newest committed checkpoint (or step N) of the built-in Llama, written to DIR (a local
path, or file://, s3://, gs://, az://) as ``config.json`` and safetensors shards that
``transformers`` (``LlamaForCausalLM.from_pretrained``) and inference servers load, one tensor at
a time (:mod:`spotwise.runtime.weights.export`). The tiny GPT has no standard format: exit 2.
"""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option


@COMMANDS.register("export")
def register(app: typer.Typer) -> None:
    @app.command("export", help="Write a run's weights (its newest committed checkpoint, or --step N) in the "
                                "Hugging Face Llama layout (config.json + safetensors) to DIR: a path or "
                                "file://, s3://, gs://, az://.")
    def export(
        job_id: str = typer.Argument(..., help="a job id (see `spotwise status`)"),
        dest: str = typer.Argument(..., metavar="DIR", help="where to write: a local path or a storage URI"),
        step: Optional[int] = typer.Option(None, "--step", min=1, help="the checkpoint of this step (default: newest)"),
        dtype: str = typer.Option("bf16", "--dtype", help="bf16 | fp16 | fp32"),
        fmt: Format = format_option(),
    ) -> None:
        from spotwise.output import print_json, print_kv

        out = run_export(job_id, dest, step=step, dtype=dtype)
        if fmt is Format.json:
            print_json(out)
        else:
            print_kv({"job": job_id, "step": out["step"], "written to": out["dest"], "dtype": out["dtype"],
                      "files": ", ".join(out["files"])}, title="exported")


def run_export(job_id: str, dest: str, *, step: int | None = None, dtype: str = "bf16") -> dict:
    """Export ``job_id``'s weights to ``dest`` (see the module docstring); an :class:`InputError`
    naming the argument for an unknown job, a job of another model, a dtype, step or destination
    that does not exist."""
    from pathlib import Path

    from spotwise.engine.state import db
    from spotwise.engine.work.resume import latest_checkpoint
    from spotwise.errors import InputError, Problem
    from spotwise.runtime.checkpoint.layout import run_storage
    from spotwise.runtime.weights.export import DTYPES, export_run
    from spotwise.runtime.storage.base import BadStorageUri, check_uri, open_storage
    from spotwise.taskspec import parse_taskspec

    if dtype not in DTYPES:
        raise InputError(Problem("--dtype", dtype, ", ".join(DTYPES)), source="export")
    with db.session() as s:
        job = s.get(db.Job, job_id)
        raw = job.spec if job is not None else None
    if raw is None:
        raise InputError(Problem("JOB_ID", job_id, "the id of a job shown by `spotwise status`"), source="export")
    spec = parse_taskspec(raw, source=f"job {job_id}")
    cfg = spec.training.llama
    if cfg is None:
        what = spec.training.entrypoint if not spec.training.train_func else spec.training.train_func
        raise InputError(Problem("JOB_ID", job_id, f"a run of the built-in llama: {what!r} has no standard format "
                                                   "to export (the tiny GPT and your own models are yours to "
                                                   "convert from the checkpoint)"), source="export")
    uri = dest if "://" in dest else f"file://{Path(dest).expanduser().resolve()}"
    try:
        uri = check_uri(uri)
    except BadStorageUri as e:
        raise InputError(Problem("DIR", dest, f"a local path or a storage URI: {e}"), source="export") from None
    _, store_uri = latest_checkpoint(job_id, spec)
    try:
        got = export_run(run_storage(store_uri.split(", ")[0], job_id), cfg, open_storage(uri), step=step,
                         dtype=dtype)
    except ValueError as e:
        raise InputError(Problem("--step" if step is not None else "JOB_ID", step if step is not None else job_id,
                                 f"a committed checkpoint of the run ({e})"), source="export") from None
    return {"job_id": job_id, "dest": uri, **got}
