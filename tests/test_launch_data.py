"""``training.data`` checked before anything launches: ``launch --dry-run`` and ``launch`` both exit 2,
naming the field and what is allowed, for a token file the built-in model could not train on.

In-process CLI (``spotwise.cli.main``) with ``SPOTWISE_HOME`` in the test's folder. The real
launch is refused while the orchestrator is being built, before a plan is made or a node started:
no local node may exist afterwards.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import yaml

from spotwise.cli import main

STDLIB = Path(sysconfig.get_paths()["stdlib"])
JSON_FILES = sorted((STDLIB / "json").glob("*.py"))
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-gpt.yaml"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
    return tmp_path / "home"


def tokenize(capsys, out: Path, files, *flags: str) -> Path:
    assert main(["data", "tokenize", *map(str, files), str(out), *flags]) == 0
    capsys.readouterr()
    return out


def task(tmp_path: Path, uri: str, **training) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["training"]["data"] = {"uri": uri}
    doc["training"].update(training)
    p = tmp_path / "task.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def edit_meta(tokens: Path, **fields) -> None:
    mp = tokens.with_name("meta.json")
    mp.write_text(json.dumps({**json.loads(mp.read_text()), **fields}))


def launch(capsys, path: Path, *args: str) -> tuple[int, str]:
    rc = main(["launch", str(path), *args])
    _, err = capsys.readouterr()
    return rc, err


def bad_files(tmp_path: Path, capsys) -> dict[str, tuple[Path, str]]:
    """name -> (token file, what the message must say)."""
    out = {}

    def fresh(name: str, files=JSON_FILES, *flags: str) -> Path:
        return tokenize(capsys, tmp_path / name / "tokens.bin", files, *flags)

    p = fresh("no-tokens")
    p.unlink()
    out["missing token file"] = (p, "an existing token file")
    p = fresh("no-meta")
    p.with_name("meta.json").unlink()
    out["missing meta.json"] = (p, "meta.json")
    p = fresh("dtype-size")
    meta = json.loads(p.with_name("meta.json").read_text())
    edit_meta(p, dtype="uint32", size_bytes=4 * meta["token_count"])     # a consistent meta, a uint16 file
    out["dtype against the file's size"] = (p, "written with another dtype")
    p = fresh("dtype-float")
    edit_meta(p, dtype="float32")
    out["a dtype no model takes"] = (p, "allowed: uint16, uint32")
    out["vocab larger than the model's"] = (fresh("eod", JSON_FILES, "--eod"), "vocabulary of 256")
    small = tmp_path / "small.txt"
    small.write_text("x = 1\n" * 100)                                  # 600 tokens; a batch takes 8 * 129
    out["fewer tokens than one global batch"] = (fresh("small", [small]), "at least 1032 tokens")
    return out


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "launch"])
def test_each_bad_token_file_exits_2_before_launch(home, tmp_path, capsys, dry_run):
    from spotwise.provisioner.clouds.local.cloud import marked_pids

    for name, (tokens, needle) in bad_files(tmp_path, capsys).items():
        rc, err = launch(capsys, task(tmp_path, f"file://{tokens}"), *(["--dry-run"] if dry_run else []))
        assert rc == 2, (name, err)
        assert "training.data.uri" in err and needle in err, (name, err)
        assert "Traceback" not in err
    assert marked_pids(home_prefix=str(home)) == []
    assert not (home / "cache").exists()                   # checked from the meta: nothing fetched


def test_a_good_token_file_passes_the_dry_run(home, tmp_path, capsys):
    tokens = tokenize(capsys, tmp_path / "ok" / "tokens.bin", JSON_FILES)
    rc, err = launch(capsys, task(tmp_path, f"file://{tokens}"), "--dry-run")
    assert rc == 0, err


def test_a_local_token_file_cannot_reach_a_cloud(home, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")
    tokens = tokenize(capsys, tmp_path / "ok" / "tokens.bin", JSON_FILES)
    rc, err = launch(capsys, task(tmp_path, f"file://{tokens}"), "--cloud", "aws", "--storage",
                     "s3://my-bucket/p", "--dry-run")
    assert rc == 2 and "training.data.uri" in err and "s3://" in err, err


def test_a_gs_token_file_cannot_reach_a_cloud_whose_nodes_have_no_identity_for_it(home, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")
    rc, err = launch(capsys, task(tmp_path, "gs://my-bucket/data/tokens.bin"), "--cloud", "aws", "--storage",
                     "s3://my-bucket/p", "--dry-run")
    assert rc == 2 and "training.data.uri" in err and "aws nodes cannot reach gs://" in err, err


def test_an_az_token_file_cannot_reach_a_cloud_whose_nodes_have_no_identity_for_it(home, tmp_path, capsys,
                                                                                    monkeypatch):
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")
    rc, err = launch(capsys, task(tmp_path, "az://myaccount/corpus/tokens.bin"), "--cloud", "aws", "--storage",
                     "s3://my-bucket/p", "--dry-run")
    assert rc == 2 and "training.data.uri" in err and "aws nodes cannot reach az://" in err, err
    # Azure nodes read it as their managed identity: refused only while they would carry none
    monkeypatch.delenv("SPOTWISE_AZURE_NODE_IDENTITY", raising=False)
    rc, err = launch(capsys, task(tmp_path, "az://myaccount/corpus/tokens.bin"), "--cloud", "azure", "--storage",
                     "az://myaccount/ckpt/p")          # a real launch (a dry run lists it: issue 48)
    assert rc == 2 and "SPOTWISE_AZURE_NODE_IDENTITY" in err and "Traceback" not in err, err
    # and S3 is no store for Azure nodes (they have no identity for it)
    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", "/subscriptions/s/resourceGroups/rg/providers/"
                       "Microsoft.ManagedIdentity/userAssignedIdentities/spotwise-node")
    rc, err = launch(capsys, task(tmp_path, "az://myaccount/corpus/tokens.bin"), "--cloud", "azure", "--storage",
                     "s3://my-bucket/p", "--dry-run")
    assert rc == 2 and "--storage" in err and "azure nodes cannot reach s3://" in err and "az://ACCOUNT/CONTAINER" in err


@pytest.mark.parametrize("uri,needle", [
    ("ftp://host/tokens.bin", "file:///ABSOLUTE/PATH, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://"),
    ("s3://bucket", "the URI of the token file itself"),
    ("s3://bucket/data/meta.json", "the URI of the token file itself"),
    ("file://relative/tokens.bin", "absolute path"),
])
def test_a_bad_uri_is_refused_with_the_field(home, tmp_path, capsys, uri, needle):
    rc, err = launch(capsys, task(tmp_path, uri), "--dry-run")
    assert rc == 2 and "training.data.uri" in err and needle in err, err


def _own(tmp_path: Path, uri: str, **training) -> Path:
    p = tmp_path / "own.yaml"
    p.write_text(yaml.safe_dump({"name": "own", "workdir": str(tmp_path / "code"),
                                 "training": {"entrypoint": "mypkg.train:make_spec", "data": {"uri": uri}, **training}}))
    (tmp_path / "code" / "mypkg").mkdir(parents=True, exist_ok=True)
    (tmp_path / "code" / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "code" / "mypkg" / "train.py").write_text("def make_spec(config):\n    raise NotImplementedError\n")
    return p


def test_a_user_entrypoint_takes_a_token_file_checked_before_launch(home, tmp_path, capsys):
    """Your own make_spec reads ``training.data`` through ``spotwise.train.token_batches``: the
    launch checks the file's meta and size as for a built-in model (the vocabulary and window are
    the model's, checked on the node); a Ray Train function still refuses the key."""
    good = tokenize(capsys, tmp_path / "good" / "tokens.bin", JSON_FILES)
    rc, err = launch(capsys, _own(tmp_path, good.as_uri()), "--dry-run")
    assert rc == 0, err
    for name, (path, needle) in bad_files(tmp_path, capsys).items():
        if name in ("vocab larger than the model's", "fewer tokens than one global batch"):
            continue                           # the user's model's vocabulary and window: checked on the node
        rc, err = launch(capsys, _own(tmp_path, path.as_uri()), "--dry-run")
        assert rc == 2 and "training.data.uri" in err and needle in err, (name, err)
    p = tmp_path / "tf.yaml"
    p.write_text(yaml.safe_dump({"name": "tf", "training": {"train_func": "mypkg.train:train_func",
                                                            "data": {"uri": good.as_uri()}}}))
    rc, err = launch(capsys, p, "--dry-run")
    assert rc == 2 and "data" in err and "spotwise.train.token_batches" in err, err


def test_the_launch_pins_the_checked_file_and_a_wrong_pin_exits_2(home, tmp_path, capsys):
    from spotwise.engine.run.orchestrator import LaunchOptions, Orchestrator
    from spotwise.taskspec import load_taskspec

    tokens = tokenize(capsys, tmp_path / "ok" / "tokens.bin", JSON_FILES)
    sha = json.loads(tokens.with_name("meta.json").read_text())["sha256"]
    orch = Orchestrator(load_taskspec(task(tmp_path, f"file://{tokens}")), LaunchOptions())
    assert orch.driver.training.data.sha256 == sha and orch.spec.training.data.sha256 is None
    wrong = task(tmp_path, f"file://{tokens}")
    doc = yaml.safe_load(wrong.read_text())
    doc["training"]["data"]["sha256"] = "0" * 64
    wrong.write_text(yaml.safe_dump(doc))
    rc, err = launch(capsys, wrong, "--dry-run")
    assert rc == 2 and "training.data.sha256" in err and sha in err, err
    doc["training"]["data"]["sha256"] = "ABC"
    wrong.write_text(yaml.safe_dump(doc))
    rc, err = launch(capsys, wrong, "--dry-run")
    assert rc == 2 and "training.data.sha256" in err and "64 lowercase hex digits" in err, err
