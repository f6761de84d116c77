"""Recording fakes of what the orchestrator reaches outside its process — a cloud, the head's Jobs
API and control endpoint, the runner's lease — so a whole run can go through
:class:`~spotwise.engine.run.orchestrator.Orchestrator` in a test without a node or Ray. Each writes
what was asked of it to one shared ``log`` list, so a test can check the order across them."""

from __future__ import annotations

import itertools
import json

from spotwise.engine.state import db
from spotwise.errors import SpotwiseError
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner.base import CapacityError, Cloud, LaunchRequest, Node
from spotwise.provisioner.head_path import HeadEndpoint
from spotwise.runtime.node.job import RESULT_PREFIX, SNAPSHOT_PREFIX


class FakeCloud(Cloud):
    """An in-memory cloud named ``name``: a launch comes up at once; a node is listed until it is
    ended (:meth:`terminate`) or reclaimed (:meth:`reclaim`, a preemption nobody asked for).
    Spot launches in ``spot_out`` zones meet a capacity error."""

    notice_window_s = 120.0
    ray_port = 6379

    def __init__(self, name: str = "local", log: list | None = None) -> None:
        self.cloud_name = name
        self.log = log if log is not None else []
        self.live: dict[str, Node] = {}
        self.spot_out: set[str] = set()
        self.fail_terminate = False
        self.lists: list[tuple[str | None, tuple[str, ...] | None]] = []   # every list_nodes call: (cluster, regions)
        self._ids = itertools.count(1)

    def head_offer(self, region: str, zone: str) -> Offer:
        return Offer(cloud=self.cloud_name, instance_type="head.small", accelerator="", accelerator_count=0,
                     region=region, zone=zone, market=Market.ON_DEMAND, usd_per_hour=0.1, source="fake", as_of="2026")

    def launch(self, request: LaunchRequest) -> list[Node]:
        o = request.offer
        self.log.append(("launch", request.role, o.market.value, o.region))
        if o.market is Market.SPOT and o.zone in self.spot_out:
            raise CapacityError(f"no spot in {o.zone}", offer_key=o.key, cloud=self.cloud_name, region=o.region)
        out = []
        for _ in range(request.count):
            n = next(self._ids)
            node = Node(cloud=self.cloud_name, instance_id=f"{request.cluster_id}-{request.role}-{n}",
                        instance_type=o.instance_type, region=o.region, zone=o.zone, market=o.market.value,
                        usd_per_hour=o.usd_per_hour, cluster_id=request.cluster_id, job_id=request.job_id,
                        role=request.role, address=f"10.0.0.{n}", extra={"price_source": o.source})
            self.live[node.instance_id] = node
            out.append(node)
        return out

    def terminate(self, nodes: list[Node]) -> None:
        self.log.append(("terminate", sorted(n.instance_id for n in nodes)))
        if self.fail_terminate:
            raise SpotwiseError("the cloud refuses")
        for n in nodes:
            self.live.pop(n.instance_id, None)

    def reclaim(self, instance_id: str) -> None:
        self.live.pop(instance_id, None)

    def list_nodes(self, cluster_id: str | None = None, *, regions: list[str] | None = None) -> list[Node]:
        self.lists.append((cluster_id, tuple(regions) if regions is not None else None))
        return [n for n in self.live.values() if cluster_id in (None, n.cluster_id)
                and (regions is None or n.region in regions)]

    def prepare_cluster(self, cluster_id: str, job_id: str, region: str) -> None:
        self.log.append(("prepare", region))

    def endpoint(self, cluster_id: str, head: Node) -> HeadEndpoint:
        return HeadEndpoint(dashboard_url=f"http://{head.address}:8265", control_url=f"http://{head.address}:8266")

    def cleanup_cluster(self, cluster_id: str) -> list[str]:
        self.log.append(("cleanup", cluster_id))
        return [f"{self.cloud_name}: the cluster's network"]


class Jobs:
    """The head's Jobs API: takes every job; its status is RUNNING for ``runs`` polls after each
    submission (STOPPED at once after a stop request), then SUCCEEDED; its logs carry training's
    result (``steps`` completed) and final snapshot."""

    def __init__(self, log: list, *, runs: int = 3, steps: int = 10) -> None:
        self.log, self.runs, self.steps = log, runs, steps
        self.polls = 0
        self.stop_requested = False

    def submit_job(self, **kw) -> None:
        self.log.append(("submit", kw["submission_id"]))
        self.polls, self.stop_requested = 0, False

    def get_job_status(self, sid: str) -> str:
        self.polls += 1
        if self.stop_requested:
            return "JobStatus.STOPPED"
        return "JobStatus.RUNNING" if self.polls <= self.runs else "JobStatus.SUCCEEDED"

    def get_job_logs(self, sid: str) -> str:
        result = {"steps_completed": self.steps, "final_checkpoint": "file:///ckpt/final", "model_sha256": "abc"}
        snap = {"step": self.steps, "started_at": 1.0, "checkpoints": [{"step": self.steps, "kind": "final",
                                                                      "uri": "file:///ckpt/final"}]}
        return f"{SNAPSHOT_PREFIX}{json.dumps(snap)}\n{RESULT_PREFIX}{json.dumps(result)}\n"

    def stop_job(self, sid: str) -> None:
        self.log.append(("stop_job", sid))


class Control:
    """The job's control endpoint: training has started; stop requests reach ``jobs``; the job's
    output is ``OUTPUT`` (what each rank and the driver printed: a traceback on rank 1's stderr),
    numbered as the head's control actor numbers it."""

    OUTPUT = [("driver", "sw-head", "stdout", "spotwise build b1"),
              ("0", "sw-worker-a", "stdout", "step 1 loss 2.5"),
              ("1", "sw-worker-b", "stdout", "step 1 loss 2.5"),
              ("1", "sw-worker-b", "stderr", "Traceback (most recent call last):"),
              ("1", "sw-worker-b", "stderr", "ValueError: bad batch")]

    def __init__(self, log: list, jobs: Jobs, url: str) -> None:
        self.log, self.jobs, self.url = log, jobs, url

    def snapshot(self) -> dict:
        return {"step": 1, "started_at": 1.0, "resumes": []}

    def output(self, after: int) -> dict:
        lines = [{"seq": i + 1, "t": 1.0 + i, "rank": r, "node": n, "stream": st, "line": text}
                 for i, (r, n, st, text) in enumerate(self.OUTPUT)][after:]
        return {"lines": lines, "next": lines[-1]["seq"] if lines else after}

    def request_stop(self, reason: str) -> None:
        self.log.append(("request_stop", reason))
        self.jobs.stop_requested = True

    def drain(self, instance_ids: list[str], deadline_s: float) -> dict:
        self.log.append(("drain", sorted(instance_ids)))
        return {}

    def renew_lease(self, expires_at: float) -> dict:
        return {}


class Lease:
    """The runner's lease; ``stop`` also notes the job row's status at that moment."""

    def __init__(self, log: list, job_id: str) -> None:
        self.log, self.job_id = log, job_id

    def claim(self) -> None:
        self.log.append(("lease", "claim"))

    def start(self) -> "Lease":
        self.log.append(("lease", "start"))
        return self

    def attach(self, *, push, money) -> None:
        self.log.append(("lease", "attach", push.__self__.url, money()))

    def stop(self) -> None:
        with db.session() as s:
            status = s.get(db.Job, self.job_id).status
        self.log.append(("lease", "stop", status))
