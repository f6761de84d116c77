"""A run's last committed checkpoint copied between two clouds' stores (S3 on moto_server, GCS on
gcp-storage-emulator), through the real clients: training resumes from the copy exactly, the
marker goes last so a copy cut short is never loaded, and copying is idempotent."""

import pytest

from spotwise.runtime.api import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import committed_steps, latest_committed, run_storage
from spotwise.runtime.checkpoint.copy import copy_latest
from spotwise.runtime.training.loop import LocalSession, run_loop

from ..fakes import EnvPatch

TINY = ModelConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2)


def cfg(steps):
    return TrainConfig(model=TINY, steps=steps, batch_size=4, checkpoint=CheckpointConfig(interval_steps=2, keep_last=2))


@pytest.fixture
def both(moto, gcs, request):
    """An S3 bucket and a GCS bucket, and the environment that reaches both emulators."""
    name = "xc-" + request.node.name.replace("_", "-")[:40].strip("-")
    moto.client("s3").create_bucket(Bucket=name)
    gcs.create_bucket(name)
    return name, {**moto.env(), **gcs.env()}


def test_a_run_resumes_exactly_from_its_checkpoint_copied_to_another_clouds_store(pg1, both, tmp_path):
    bucket, env = both
    with EnvPatch(env):
        s3 = run_storage(f"s3://{bucket}/runs", "job")
        gs = run_storage(f"gs://{bucket}/runs", "job")
        run_loop(gpt_spec(cfg(4)), LocalSession(), s3)          # steps 2 and 4 committed on "AWS"
        got = copy_latest(s3, gs)
        assert got is not None and got.step == 4 and got.objects >= 4 and got.bytes > 0
        assert committed_steps(gs) == [4]                       # only the newest: the resume point
        assert sorted(k.split("/", 2)[2] for k in gs.list("checkpoints/")) == \
               sorted(k.split("/", 2)[2] for k in s3.list("checkpoints/step_000000004/"))
        assert copy_latest(s3, gs) is None                      # already there: nothing moves
        s = LocalSession()
        done = run_loop(gpt_spec(cfg(7)), s, gs)                # continues on "GCP"
        assert copy_latest(s3, gs) is None                      # the destination is newer
    ref = run_loop(gpt_spec(cfg(7)), LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    assert s.resumes == [(4, 1)]
    assert done.model_sha256 == ref.model_sha256


class CutShort:
    """A destination store whose uploads fail from the ``fail_at``-th on (a launcher that died, a
    network that went): what it holds afterwards is what a real cut-short copy leaves."""

    def __init__(self, inner, fail_at: int) -> None:
        self.inner, self.fail_at, self.puts = inner, fail_at, []
        self.uri = inner.uri

    def put_file(self, local, key):
        if len(self.puts) >= self.fail_at:
            raise ConnectionError("connection reset")
        self.puts.append(key)
        self.inner.put_file(local, key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_copy_cut_short_is_never_loaded_and_the_next_try_completes_it(pg1, both):
    bucket, env = both
    with EnvPatch(env):
        gs = run_storage(f"gs://{bucket}/runs", "job")
        s3 = run_storage(f"s3://{bucket}/runs", "job")
        run_loop(gpt_spec(cfg(2)), LocalSession(), gs)
        n = len(gs.list("checkpoints/step_000000002/"))
        full = CutShort(s3, fail_at=10_000)
        assert copy_latest(gs, full) is not None
        assert full.puts[-1] == "checkpoints/step_000000002/COMMITTED"   # the marker last
        s3.delete_prefix("checkpoints/")
        cut = CutShort(s3, fail_at=n - 1)                                 # everything but the marker
        with pytest.raises(ConnectionError):
            copy_latest(gs, cut)
        assert len(s3.list("checkpoints/")) == n - 1 and latest_committed(s3) is None   # torn: not a resume point
        again = copy_latest(gs, s3)
        assert again is not None and again.step == 2 and latest_committed(s3).step == 2


def test_the_copy_keeps_the_destinations_last_k_and_prunes_older_ones(tmp_path):
    from spotwise.runtime.storage.base import open_storage

    src, dst = open_storage(f"file://{tmp_path}/a"), open_storage(f"file://{tmp_path}/b")
    for store, steps in ((dst, (2, 4)), (src, (6,))):
        for s in steps:
            store.put_bytes(f"checkpoints/step_{s:09d}/__0_0.distcp", b"x" * s)
            store.put_bytes(f"checkpoints/step_{s:09d}/COMMITTED", b"{}")
    dst.put_bytes("checkpoints/step_000000003/__0_0.distcp", b"torn")   # torn, older than the kept
    got = copy_latest(src, dst, keep_last=2)
    assert got is not None and (got.step, got.objects, got.bytes) == (6, 2, 8)
    assert committed_steps(dst) == [4, 6]
    assert not dst.list("checkpoints/step_000000002/") and not dst.list("checkpoints/step_000000003/")
    assert copy_latest(open_storage(f"file://{tmp_path}/empty"), dst) is None    # nothing committed: nothing to copy
