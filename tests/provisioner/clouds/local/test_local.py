"""The local cloud: IMDSv2 metadata server, Ray nodes as processes, the simulated spot market.

Real processes and real HTTP; every test checks that no process of its nodes is left behind.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from spotwise.pricing.offer import Market
from spotwise.provisioner.base import CapacityError, LaunchRequest
from spotwise.provisioner.clouds.local.cloud import LocalCloud, local_offers, marked_pids
from spotwise.provisioner.clouds.local.market import SimulatedMarket
from spotwise.provisioner.clouds.local.metadata import MetadataServer


def _get(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("X-aws-ec2-metadata-token", token)
    return urllib.request.urlopen(req, timeout=5)


def _token(base):
    req = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
    return urllib.request.urlopen(req, timeout=5).read().decode()


def test_metadata_server_speaks_imdsv2():
    with MetadataServer() as md:
        base = md.base_url("i-1")
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(f"{base}/latest/meta-data/spot/instance-action")
        assert e.value.code == 401                      # IMDSv2: token required
        tok = _token(base)
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(f"{base}/latest/meta-data/spot/instance-action", tok)
        assert e.value.code == 404                      # no notice yet
        assert _get(f"{base}/latest/meta-data/instance-id", tok).read().decode() == "i-1"
        md.post_notice("i-1", at=1_800_000_000)
        body = json.loads(_get(f"{base}/latest/meta-data/spot/instance-action", tok).read())
        assert body == {"action": "terminate", "time": "2027-01-15T08:00:00Z"}
        with pytest.raises(urllib.error.HTTPError):     # other instances are unaffected
            _get(f"{md.base_url('i-2')}/latest/meta-data/spot/instance-action", tok)
        md.post_rebalance("i-2")
        assert "noticeTime" in json.loads(_get(f"{md.base_url('i-2')}/latest/meta-data/events/recommendations/rebalance", tok).read())


def test_price_sheet_has_source_and_date():
    offers = local_offers()
    assert {o.market for o in offers} >= {Market.SPOT, Market.ON_DEMAND}
    assert all(o.source and o.as_of for o in offers)
    spot = min(o.usd_per_hour for o in offers if o.market is Market.SPOT)
    od = min(o.usd_per_hour for o in offers if o.market is Market.ON_DEMAND and o.instance_type != "local.head")
    assert spot < od


@pytest.fixture
def cloud(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    c = LocalCloud()
    yield c
    for n in c.list_nodes():
        c.terminate([n])
    leftover = marked_pids(home_prefix=str(tmp_path))
    assert leftover == [], f"processes left behind: {leftover}"


def test_launch_list_terminate_leaves_nothing(cloud):
    offers = local_offers()
    head = next(o for o in offers if o.instance_type == "local.head")
    spot = next(o for o in offers if o.market is Market.SPOT)
    [h] = cloud.launch(LaunchRequest(cluster_id="ctest1", job_id="j1", offer=head, role="head"))
    workers = cloud.launch(LaunchRequest(cluster_id="ctest1", job_id="j1", offer=spot, count=1))
    listed = cloud.list_nodes("ctest1")
    assert {n.instance_id for n in listed} == {h.instance_id, workers[0].instance_id}
    assert all(n.job_id == "j1" and n.cluster_id == "ctest1" for n in listed)
    assert cloud.list_nodes("other") == []
    assert marked_pids(workers[0].instance_id)
    _every_process_of_the_node_is_marked(h.instance_id)
    cloud.terminate(listed)
    cloud.terminate(listed)                    # idempotent
    assert cloud.list_nodes("ctest1") == []
    assert marked_pids(prefix="ctest1-") == []
    # A fresh LocalCloud (another process, e.g. `spotwise gc`) sees the same records.
    assert LocalCloud().list_nodes("ctest1") == []


def _session_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[3])


def _every_process_of_the_node_is_marked(instance_id: str) -> None:
    """Every process in the head's session (``ray start`` runs in one of its own) carries the
    marker in ``/proc/PID/environ``, the Ray processes that rename themselves included: once the
    dashboard agent and the runtime env agent are up (setproctitle hid them, and on a head with a
    dashboard its modules, before ``KEEP_MARKER_ENV``), the session and the marker scan name the
    same processes."""
    from pathlib import Path

    sessions = {_session_of(p) for p in marked_pids(instance_id)}
    assert len(sessions) == 1, sessions

    def members() -> dict[int, bytes]:
        out = {}
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and _session_of(int(d.name)) in sessions:
                    out[int(d.name)] = (d / "cmdline").read_bytes()
            except OSError:
                continue
        return out

    deadline = time.time() + 120
    while not any(c.startswith(b"ray::DashboardAgent") for c in members().values()):
        assert time.time() < deadline, f"the head's dashboard agent never started: {members()}"
        time.sleep(0.5)
    while not any(c.startswith(b"ray::RuntimeEnvAgent") for c in members().values()):
        assert time.time() < deadline, f"the head's runtime env agent never started: {members()}"
        time.sleep(0.5)
    unmarked = {p: c[:60] for p, c in members().items() if p not in set(marked_pids(instance_id))}
    assert unmarked == {}, f"processes of the node the marker scan cannot see: {unmarked}"


def test_spot_capacity_error_when_zone_unavailable(cloud):
    spot = next(o for o in local_offers() if o.market is Market.SPOT)
    cloud.spot_unavailable.add(spot.zone)
    with pytest.raises(CapacityError) as e:
        cloud.launch(LaunchRequest(cluster_id="ctest2", job_id="j", offer=spot))
    assert e.value.offer_key == spot.key
    assert cloud.list_nodes("ctest2") == []


def test_market_posts_notice_then_kills_after_notice_period(cloud):
    offers = local_offers()
    head = next(o for o in offers if o.instance_type == "local.head")
    spot = next(o for o in offers if o.market is Market.SPOT)
    [h] = cloud.launch(LaunchRequest(cluster_id="ctest3", job_id="j", offer=head, role="head"))
    [w] = cloud.launch(LaunchRequest(cluster_id="ctest3", job_id="j", offer=spot))
    preempted = []
    with MetadataServer() as md:
        market = SimulatedMarket(cloud=cloud, metadata=md, spot_nodes=lambda: [w],
                                 on_preempted=lambda n, p: preempted.append((n.instance_id, p)),
                                 preempt_at=[0.5], notice_seconds=1.5)
        t0 = time.time()
        market.start(t0)
        base = md.base_url(w.instance_id)
        tok = _token(base)
        notice = None
        while time.time() < t0 + 10 and notice is None:
            try:
                notice = json.loads(_get(f"{base}/latest/meta-data/spot/instance-action", tok).read())
            except urllib.error.HTTPError:
                time.sleep(0.05)
        assert notice and notice["action"] == "terminate"
        assert marked_pids(w.instance_id), "the node must still run during its notice period"
        while time.time() < t0 + 15 and not preempted:
            time.sleep(0.05)
        market.stop()
    assert preempted and preempted[0][0] == w.instance_id
    p = preempted[0][1]
    assert p.killed_at - p.notice_at >= 1.5
    assert marked_pids(w.instance_id) == []
    assert [n.instance_id for n in cloud.list_nodes("ctest3")] == [h.instance_id]
    cloud.terminate([h])


def test_market_replays_a_trace(cloud, tmp_path):
    spot = next(o for o in local_offers() if o.market is Market.SPOT)
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 0, 0, 1]}))
    seen = []
    with MetadataServer() as md:
        market = SimulatedMarket(cloud=cloud, metadata=md, spot_nodes=lambda: [],
                                 on_preempted=lambda n, p: None, trace_path=str(trace),
                                 tick_seconds=0.4, zone=spot.zone)
        t0 = time.time()
        market.start(t0)
        for _ in range(40):
            seen.append(spot.zone in cloud.spot_unavailable)
            time.sleep(0.05)
        market.stop()
    assert True in seen and seen[0] is False           # became unavailable during the 0 ticks
    assert spot.zone not in cloud.spot_unavailable    # available again at the end


def scheduled_market(preempt_at: list[float], notice_seconds: float):
    """A market over three spot nodes ``w0..w2`` with recording fakes: ``(market, posted,
    killed)``, each list ``(instance_id, time)`` in the order it happened; a killed node leaves the
    spot list."""
    from types import SimpleNamespace

    nodes = [SimpleNamespace(instance_id=f"w{i}") for i in range(3)]
    killed: list[tuple[str, float]] = []
    posted: list[tuple[str, float]] = []
    host = SimpleNamespace(spot_unavailable=set(), kill_now=lambda n: killed.append((n.instance_id, time.time())))
    md = SimpleNamespace(post_notice=lambda iid, action, at: posted.append((iid, time.time())))
    market = SimulatedMarket(cloud=host, metadata=md, spot_nodes=lambda: [n for n in nodes
                                                                         if n.instance_id not in dict(killed)],
                             on_preempted=lambda n, p: None, preempt_at=preempt_at, notice_seconds=notice_seconds)
    return market, posted, killed


def run_market_until(market, done, bound_s: float) -> float:
    """Start ``market``'s clock now, poll ``done()`` (at most ``bound_s``: a bound, not a timed
    assertion), stop it; the start time."""
    t0 = time.time()
    market.start(t0)
    while not done() and time.time() < t0 + bound_s:
        time.sleep(0.05)
    market.stop()
    return t0


def test_a_time_scheduled_twice_preempts_two_nodes_at_once():
    """``--preempt-at 0.2,0.2``: both spot nodes are noticed together (a Slurm job of two nodes, or
    a zone reclaiming two instances, as the bench's like-with-like baselines need), not one after
    the other's notice period."""
    market, posted, killed = scheduled_market([0.2, 0.2], 1.0)
    t0 = run_market_until(market, lambda: len(killed) >= 2, 10)
    assert sorted(i for i, _ in posted) == ["w0", "w1"]
    assert abs(posted[0][1] - posted[1][1]) < 0.5, posted        # noticed together
    assert sorted(i for i, _ in killed) == ["w0", "w1"]
    assert all(t - t0 < 2.5 for _, t in killed), killed          # killed after one notice period, together


def test_a_later_scheduled_notice_does_not_wait_for_the_first_node_to_go_and_skips_it():
    """``--preempt-at 0.1,0.2`` with a 60 s notice: the second notice goes to the next spot node
    while the first is still up under its own (a real cloud's second reclaim does not wait), and
    never to the node already noticed."""
    market, posted, killed = scheduled_market([0.1, 0.2], 60.0)
    run_market_until(market, lambda: len(posted) >= 2, 30)
    assert [i for i, _ in posted] == ["w0", "w1"] and killed == []
    assert [p.instance_id for p in market.history] == ["w0", "w1"]
