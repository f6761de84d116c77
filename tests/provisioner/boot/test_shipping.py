"""How a run ships the launcher's build to its nodes (:mod:`spotwise.provisioner.boot.shipping`): once per
build into the run's storage, content-addressed, and a fetch URL per boot script."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from urllib.request import urlopen

from spotwise.build import build_id
from spotwise.provisioner.boot import shipping
from spotwise.provisioner.boot.shipping import NodeBuild, shipped_build


def test_the_build_is_uploaded_once_content_addressed_and_each_boot_gets_its_fetch_url(tmp_path, monkeypatch):
    opened: list[str] = []
    import spotwise.runtime.storage.base as storage

    real = storage.open_storage
    monkeypatch.setattr(storage, "open_storage", lambda uri: opened.append(uri) or real(uri))
    uri = f"file://{tmp_path}/runs"
    nb = NodeBuild(uri, work_dir=tmp_path / "work")
    boots = []
    ts = [threading.Thread(target=lambda: boots.append(nb.for_boot())) for _ in range(4)]   # nodes boot at once
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(boots) == 4 and len({(b.build_id, b.sha256, b.name) for b in boots}) == 1
    b = boots[0]
    assert b.build_id == build_id() and b.name.endswith("-py3-none-any.whl")
    stored = tmp_path / "runs" / "_builds" / b.sha256 / b.name
    assert stored.is_file() and hashlib.sha256(stored.read_bytes()).hexdigest() == b.sha256
    with urlopen(b.url) as r:                                # what the node's curl fetches
        assert hashlib.sha256(r.read()).hexdigest() == b.sha256
    assert nb.uploaded and opened == [uri]                   # built, uploaded and opened once

    again = NodeBuild(uri, work_dir=tmp_path / "work2")       # a later run of the same build
    assert again.for_boot().sha256 == b.sha256 and not again.uploaded
    assert [p.name for p in Path(tmp_path / "runs" / "_builds").iterdir()] == [b.sha256]


def test_one_node_build_per_storage_and_none_without_storage(monkeypatch):
    monkeypatch.setattr(shipping, "_shipped", {})
    assert shipped_build(None) is None and shipped_build("") is None
    a = shipped_build("s3://b/runs")
    assert a is shipped_build("s3://b/runs") and a is not shipped_build("s3://b/other")
