"""The join watchdog (:mod:`spotwise.engine.run.joins`): the bookkeeping, and reading the ALIVE nodes
from a Ray dashboard (a loopback fake answering what Ray 2.60's state API answers)."""

from __future__ import annotations

import copy
import json
import subprocess
from urllib.parse import parse_qs

import pytest

from httpfake import LoopbackServer
from spotwise.engine.run.joins import JoinWatch, alive_instances
from spotwise.provisioner.base import Node
from spotwise.provisioner.boot.script import instance_label_value
from spotwise.runtime.api import INSTANCE_LABEL

T0 = 1_000_000.0
TIMEOUT = 600.0


def node(iid: str, *, role: str = "worker", launched_at: float | None = T0) -> Node:
    return Node(cloud="aws", instance_id=iid, instance_type="p4d.24xlarge", region="us-east-1", zone="us-east-1a",
                market="spot", usd_per_hour=10.0, cluster_id="c", job_id="j", role=role, launched_at=launched_at)


def ids(overdue) -> list[str]:
    return [o.node.instance_id for o in overdue]


def test_a_worker_that_never_joins_is_overdue_after_the_timeout_not_before():
    w = JoinWatch(timeout_s=TIMEOUT)
    nodes = [node("i-head", role="head"), node("i-w1")]
    w.seen({"i-head"}, T0 + TIMEOUT)                      # exactly the timeout: not yet
    assert w.overdue(nodes, T0 + TIMEOUT) == []
    w.seen({"i-head"}, T0 + TIMEOUT + 1)
    [o] = w.overdue(nodes, T0 + TIMEOUT + 1)
    assert o.node.instance_id == "i-w1" and o.unseen_s == pytest.approx(TIMEOUT + 1)
    assert o.seen == "never ALIVE in Ray"


def test_a_worker_that_joined_is_judged_from_when_it_was_last_seen_alive():
    w = JoinWatch(timeout_s=TIMEOUT)
    nodes = [node("i-w1")]
    for t in (T0 + 100, T0 + 500, T0 + 900):              # alive, long past its launch + timeout
        w.seen({"i-w1"}, t)
        assert w.overdue(nodes, t) == []
    w.seen(set(), T0 + 900 + TIMEOUT)                     # gone from Ray: the clock runs from its last sighting
    assert w.overdue(nodes, T0 + 900 + TIMEOUT) == []
    w.seen(set(), T0 + 901 + TIMEOUT)
    [o] = w.overdue(nodes, T0 + 901 + TIMEOUT)
    assert o.unseen_s == pytest.approx(TIMEOUT + 1) and o.seen.startswith("last ALIVE in Ray")


def test_every_answer_counts_even_between_two_overdue_calls():
    w = JoinWatch(timeout_s=TIMEOUT)
    nodes = [node("i-w1")]
    w.seen({"i-w1"}, T0 + 500)                            # alive in this answer, nobody asked overdue()
    w.seen(set(), T0 + 700)                               # launched 700 s ago, but seen 200 s ago
    assert w.overdue(nodes, T0 + 700) == []


def test_unknown_answers_never_make_a_worker_overdue():
    w = JoinWatch(timeout_s=TIMEOUT)
    nodes = [node("i-w1")]
    assert w.overdue(nodes, T0 + 10 * TIMEOUT) == []      # no answer at all yet
    w.seen(set(), T0 + 10)                                # an answer, early
    for t in (T0 + 2 * TIMEOUT, T0 + 5 * TIMEOUT):        # then the dashboard does not answer
        w.seen(None, t)
        assert w.overdue(nodes, t) == []
    w.seen(set(), T0 + 10)                                # an old answer says nothing about later
    assert w.overdue(nodes, T0 + 5 * TIMEOUT) == []
    w.seen({"i-w1"}, T0 + 6 * TIMEOUT)                    # it was there all along
    assert w.overdue(nodes, T0 + 6 * TIMEOUT) == []


def test_an_answer_is_not_reused_once_the_dashboard_stops_answering():
    w = JoinWatch(timeout_s=TIMEOUT)
    nodes = [node("i-w1")]
    w.seen(set(), T0 + 2 * TIMEOUT)                       # absent long enough, but excluded then
    assert w.overdue(nodes, T0 + 2 * TIMEOUT, exclude={"i-w1"}) == []
    w.seen(None, T0 + 2 * TIMEOUT + 5)                    # this tick: unknown
    assert w.overdue(nodes, T0 + 2 * TIMEOUT + 5) == []


def test_the_head_and_excluded_nodes_are_never_overdue():
    w = JoinWatch(timeout_s=TIMEOUT)
    nodes = [node("i-head", role="head"), node("i-draining"), node("i-ending"), node("i-w1")]
    w.seen(set(), T0 + 2 * TIMEOUT)
    assert ids(w.overdue(nodes, T0 + 2 * TIMEOUT, exclude={"i-draining", "i-ending"})) == ["i-w1"]


def test_a_worker_without_a_launch_time_is_timed_from_when_the_watch_first_saw_it():
    w = JoinWatch(timeout_s=TIMEOUT)
    nodes = [node("i-w1", launched_at=None)]
    w.seen(set(), T0)
    assert w.overdue(nodes, T0) == []
    w.seen(set(), T0 + TIMEOUT + 1)
    assert ids(w.overdue(nodes, T0 + TIMEOUT + 1)) == ["i-w1"]


def test_a_replaced_node_is_forgotten_and_its_successor_timed_from_its_own_launch():
    w = JoinWatch(timeout_s=TIMEOUT)
    w.seen({"i-w1"}, T0 + 10)
    w.overdue([node("i-w1")], T0 + 10)
    late = T0 + 5000
    w.seen(set(), late)
    assert w.overdue([node("i-w2", launched_at=late - 10)], late) == []
    assert w._last_alive == {}


def test_the_label_value_is_what_the_boot_script_makes_of_the_id():
    """The node is found by its label: the same mangling as the script's ``tr``/``cut``, or a
    worker whose id has other characters would be ended although it joined."""
    for iid in ("i-0abc123", "sw1-worker-a1b2", "vm_name.x", "a/b c:d", "x" * 80):
        out = subprocess.run(["bash", "-c", "printf '%s' \"$1\" | tr -c 'a-zA-Z0-9_.-' '-' | cut -c1-63", "_", iid],
                             capture_output=True, text=True, check=True).stdout.rstrip("\n")
        assert instance_label_value(iid) == out
    w = JoinWatch(timeout_s=TIMEOUT)
    w.seen({instance_label_value("a/b c:d")}, T0 + 2 * TIMEOUT)
    assert w.overdue([node("a/b c:d")], T0 + 2 * TIMEOUT) == []


def test_the_timeout_must_be_positive():
    with pytest.raises(ValueError):
        JoinWatch(timeout_s=0)


# -- reading the dashboard -------------------------------------------------------------------------

# Ray 2.60's answer to GET /api/v0/nodes?...&filter_keys=state&filter_predicates=%3D&filter_values=ALIVE,
# as a local cluster's head gave it with one of its two workers DEAD (node ids shortened, resources
# trimmed): the GCS applies the filter, so `total` counts the DEAD node it left out.
ANSWER = {
    "result": True, "msg": "",
    "data": {"result": {
        "total": 3, "num_after_truncation": 2, "num_filtered": 2,
        "result": [
            {"node_id": "cab82a50", "node_ip": "127.0.0.1", "is_head_node": True, "state": "ALIVE",
             "state_message": None, "node_name": "127.0.0.1",
             "resources_total": {"node:__internal_head__": 1.0, "memory": 17153743668.0},
             "labels": {"spotwise-instance": "i-head", "ray.io/node-id": "cab82a50"}},
            {"node_id": "421cb155", "node_ip": "127.0.0.1", "is_head_node": False, "state": "ALIVE",
             "state_message": None, "node_name": "127.0.0.1", "resources_total": {"CPU": 1.0},
             "labels": {"spotwise-instance": "i-w1", "ray.io/node-id": "421cb155"}},
        ],
        "partial_failure_warning": "", "warnings": None}},
}


class Dashboard:
    """A loopback stand-in for the head's dashboard: answers ``/api/v0/nodes`` with ``body``."""

    def __init__(self, body, status: int = 200) -> None:
        self.body, self.status, self.requests = body, status, []
        self.server = LoopbackServer({"GET": self._get})

    def _get(self, ex) -> None:
        self.requests.append((ex.url.path, parse_qs(ex.url.query), dict(ex.headers)))
        if ex.url.path != "/api/v0/nodes":
            ex.send(404, "not found")
        elif isinstance(self.body, (bytes, str)):
            ex.send(self.status, self.body, "application/json")
        else:
            ex.send_json(self.status, self.body)

    def __enter__(self) -> "Dashboard":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()


def test_alive_instances_reads_the_alive_nodes_labels_with_the_endpoint_headers():
    with Dashboard(ANSWER) as d:
        got = alive_instances(d.server.url, {"Authorization": "Bearer tok"})
    assert got == {"i-head", "i-w1"}
    [(path, query, headers)] = d.requests
    assert query["filter_keys"] == ["state"] and query["filter_predicates"] == ["="]
    assert query["filter_values"] == ["ALIVE"] and int(query["limit"][0]) >= 1000
    assert headers.get("Authorization") == "Bearer tok"


def _changed(**data) -> dict:
    body = copy.deepcopy(ANSWER)
    body["data"]["result"].update(data)
    return body


@pytest.mark.parametrize("body,status", [
    (ANSWER, 500),                                                    # an error status
    ({**ANSWER, "result": False, "msg": "GCS unavailable"}, 200),     # the dashboard's own failure
    (_changed(partial_failure_warning="a data source did not answer"), 200),
    (_changed(num_filtered=5), 200),                                  # cut by the limit
    (b"<html>proxy error</html>", 200),                               # not JSON
    ({"result": True, "data": {}}, 200),                              # not the state API's shape
])
def test_anything_but_a_complete_answer_is_unknown(body, status):
    with Dashboard(body, status) as d:
        assert alive_instances(d.server.url) is None
        assert d.requests


def test_a_dashboard_that_does_not_answer_is_unknown():
    srv = LoopbackServer({})
    url = srv.url
    srv.stop()                                          # nothing listens there any more
    assert alive_instances(url, timeout_s=1.0) is None


def test_a_dead_row_is_not_alive_even_if_a_server_ignored_the_filter():
    body = copy.deepcopy(ANSWER)
    dead = {**body["data"]["result"]["result"][1], "state": "DEAD", "state_message": "health check failed",
            "labels": {"spotwise-instance": "i-dead"}}
    body["data"]["result"]["result"].append(dead)
    body["data"]["result"].update(num_after_truncation=3, num_filtered=3)
    with Dashboard(body) as d:
        assert alive_instances(d.server.url) == {"i-head", "i-w1"}


def test_an_answer_with_no_worker_yet_is_a_real_answer():
    body = _changed(total=1, num_after_truncation=1, num_filtered=1)
    body["data"]["result"]["result"] = body["data"]["result"]["result"][:1]
    with Dashboard(json.dumps(body)) as d:
        assert alive_instances(d.server.url) == {"i-head"}
    assert INSTANCE_LABEL == "spotwise-instance"
