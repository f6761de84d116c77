"""After a crash of our own process, `spotwise gc` ends the local nodes no live job owns and spares
the ones a running job still owns."""

import pytest

from spotwise.cli import main
from spotwise.pricing.offer import Market
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.clouds.local.cloud import LocalCloud, local_offers, marked_pids


pytestmark = pytest.mark.usefixtures("local_home")


def test_gc_ends_orphans_and_spares_live_jobs():
    from spotwise.engine.state import db

    cloud = LocalCloud()
    offer = next(o for o in local_offers() if o.market is Market.SPOT)
    [orphan] = cloud.launch(LaunchRequest(cluster_id="corphan", job_id="gone", offer=offer, role="head"))
    [owned] = cloud.launch(LaunchRequest(cluster_id="clive", job_id="live-job", offer=offer, role="head"))
    with db.session() as s:
        s.add(db.Job(id="live-job", name="x", status="running", cloud="local", cluster_id="clive", spec={}))
        s.commit()
    assert main(["gc", "--cloud", "local", "--format", "json"]) == 0
    alive = {n.instance_id for n in LocalCloud().list_nodes()}
    assert orphan.instance_id not in alive and marked_pids(orphan.instance_id) == []
    assert owned.instance_id in alive


def test_gc_spares_a_cluster_brought_up_on_purpose_until_down(capsys):
    import json
    from pathlib import Path

    task = Path(__file__).resolve().parents[4] / "examples" / "tiny-gpt.yaml"
    assert main(["up", str(task), "--cloud", "local", "--no-wait", "--format", "json"]) == 0
    cid = json.loads(capsys.readouterr().out)["cluster_id"]
    assert LocalCloud().list_nodes(cid)
    assert main(["gc", "--cloud", "local", "--format", "json"]) == 0
    assert LocalCloud().list_nodes(cid), "gc must not end a cluster that `spotwise up` owns"
    assert main(["down", cid, "--cloud", "local", "--format", "json"]) == 0
    assert LocalCloud().list_nodes(cid) == []
    from spotwise.engine.state import db

    with db.session() as s:
        assert s.get(db.Job, cid).status == "terminated"
