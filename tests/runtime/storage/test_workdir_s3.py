"""A cloud run's workdir as a content-addressed zip in the run's S3 storage (issue 31, item 1):
uploaded once, reused while unchanged, handed to Ray as the ``working_dir`` URI, and unpacked by
Ray's own code to the workdir's layout. Against a real ``moto_server`` subprocess on loopback."""

from __future__ import annotations

import io
import types
import uuid
import zipfile

import boto3
import pytest

from spotwise.engine.run.run_stores import RunStores, stage_code
from spotwise.runtime.storage.base import S3Storage
from spotwise.taskcode import UserCode, runtime_env, scan_workdir, stage_workdir

from ..fakes import EnvPatch


@pytest.fixture
def bucket(moto):
    with EnvPatch(moto.env()):
        s3 = boto3.client("s3")
        try:
            s3.create_bucket(Bucket="code-runs")
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        yield "code-runs"


@pytest.fixture
def workdir(tmp_path):
    wd = tmp_path / "code"
    (wd / "pkg").mkdir(parents=True)
    (wd / "pkg" / "__init__.py").write_text("")
    (wd / "pkg" / "train.py").write_text("def make_spec(config):\n    return None\n")
    return wd


def _code(path) -> UserCode:
    return UserCode(workdir=scan_workdir(path), pip=(), env={})


def test_the_workdir_zip_is_uploaded_once_and_reused_while_unchanged(bucket, moto, workdir, monkeypatch):
    (workdir / "pkg" / "version.py").write_text(f"V = {uuid.uuid4().hex!r}\n")     # content no run uploaded yet
    puts: list[str] = []
    put = S3Storage.put_file
    monkeypatch.setattr(S3Storage, "put_file", lambda self, local, key: (puts.append(key), put(self, local, key)))
    storage = f"s3://{bucket}/runs"
    with EnvPatch(moto.env()):
        first, uploaded = stage_workdir(_code(workdir), storage)
        sha = scan_workdir(workdir).sha256()
        assert uploaded and first.workdir_uri == f"{storage}/_code/{sha}.zip" and puts == [f"_code/{sha}.zip"]
        assert runtime_env(first)["working_dir"] == first.workdir_uri

        again, uploaded = stage_workdir(_code(workdir), storage)       # a second launch, same code
        assert not uploaded and again.workdir_uri == first.workdir_uri and len(puts) == 1

        (workdir / "pkg" / "train.py").write_text("def make_spec(config):\n    return 1\n")
        changed, uploaded = stage_workdir(_code(workdir), storage)
        assert uploaded and changed.workdir_uri != first.workdir_uri and len(puts) == 2

        body = boto3.client("s3").get_object(Bucket=bucket, Key=f"runs/_code/{sha}.zip")["Body"].read()
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        assert sorted(z.namelist()) == ["workdir/pkg/__init__.py", "workdir/pkg/train.py", "workdir/pkg/version.py"]


def test_ray_unpacks_it_to_the_workdirs_layout(bucket, moto, workdir, tmp_path):
    """Ray strips a remote zip's single top-level directory: the zip's own (``workdir/``) goes,
    and ``pkg/`` stays importable from the working dir."""
    from ray._private.runtime_env.packaging import unzip_package

    with EnvPatch(moto.env()):
        code, _ = stage_workdir(_code(workdir), f"s3://{bucket}/runs")
        key = code.workdir_uri.split(f"s3://{bucket}/", 1)[1]
        boto3.client("s3").download_file(bucket, key, str(tmp_path / "w.zip"))
    unzip_package(str(tmp_path / "w.zip"), str(tmp_path / "unpacked"), remove_top_level_directory=True,
                  unlink_zip=False)
    assert (tmp_path / "unpacked" / "pkg" / "train.py").read_text() == (workdir / "pkg" / "train.py").read_text()


def test_the_same_content_makes_the_same_zip(workdir, tmp_path):
    from spotwise.taskcode import zip_workdir

    zip_workdir(scan_workdir(workdir), tmp_path / "a.zip")
    zip_workdir(scan_workdir(workdir), tmp_path / "b.zip")
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()


def test_local_storage_and_the_local_cloud_keep_the_directory(workdir, tmp_path):
    code, uploaded = stage_workdir(_code(workdir), f"file://{tmp_path}/ckpt")
    assert not uploaded and code.workdir_uri is None and runtime_env(code)["working_dir"] == str(workdir)
    envs = stage_code(types.SimpleNamespace(workdir=str(workdir)), None, ["local"], None)
    assert envs == {}                           # nothing to do: no store or event touched


def test_a_cloud_run_hands_the_zip_uri_to_the_job(bucket, moto, workdir):
    from spotwise.taskspec import parse_taskspec

    (workdir / "pkg" / "version.py").write_text(f"V = {uuid.uuid4().hex!r}\n")     # content no run uploaded yet
    spec = parse_taskspec({"name": "x", "workdir": str(workdir), "training": {"entrypoint": "pkg.train:make_spec"}})
    events: list = []
    store = f"s3://{bucket}/runs"
    with EnvPatch(moto.env()):
        envs = stage_code(spec, RunStores({"aws": store}), ["aws"], lambda kind, **kw: events.append((kind, kw)))
    uri = envs[store]["working_dir"]         # what the job submitted with that store runs
    assert uri.startswith(f"s3://{bucket}/runs/_code/") and uri.endswith(".zip")
    assert events == [("workdir_staged", {"uri": uri, "uploaded": True})]
