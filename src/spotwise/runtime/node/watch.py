"""Per-node interruption watcher: cloud notice -> Ray node drain with reason PREEMPTION.

    python -m spotwise.runtime.node.watch --cloud aws --metadata-url BASE --instance-id ID \\
        --gcs-address HOST:PORT [--poll-interval 0.5] [--once] \\
        [--lease-deadline EPOCH [--lease-unreachable-s 60] [--self-end shutdown|azure|gcp|local|slurm]]

Polls the instance-metadata service (:mod:`spotwise.runtime.node.notices`). On the first notice it
finds the Ray node whose label ``spotwise-instance`` equals ``ID`` in the GCS node table and
calls ``GcsClient.drain_node(node_id_hex, DRAIN_NODE_REASON_PREEMPTION, message, deadline_ms)``.
Ray Train's PreemptionWatcher sees the drain, every rank writes a just-in-time checkpoint, and
the restart after the node is gone is charged to the preemption budget, not ``max_failures``.

Azure: the Preempt event is acknowledged (``StartRequests``) once the run's newest checkpoint is
newer than the notice, or at the deadline, whichever comes first, when ``--ack-after-checkpoint
STORAGE_URI/RUN`` is given; otherwise right after the drain is accepted.

With ``--lease-deadline`` the watcher is also the node's dead man's switch
(:mod:`spotwise.runtime.node.deadman`): it reads the runner's lease from the GCS and ends its own node
when the lease runs out or the GCS, once it has answered, stops answering for
``--lease-unreachable-s``; until the first lease is read, ``--lease-deadline`` (the boot lease)
holds, and until the GCS first answers only the boot lease can end the node (its head may still be
booting: a cloud boots a launch's nodes at once). After a drain it keeps watching the
lease (a node whose reclaim never comes must still end).

Exit status: 0 after a drain was accepted (or ``--once`` found no notice), 1 on a bad argument or
when no Ray node carries the instance label. Transient metadata errors are logged and retried.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time

from spotwise.runtime.api import INSTANCE_LABEL
from spotwise.runtime.node.hold import wait_for_checkpoint
from spotwise.runtime.node.notices import Notice, make_poller

log = logging.getLogger("spotwise.watch")


def find_node_id(gcs_client, instance_id: str) -> str | None:
    """Hex id of the ALIVE Ray node labelled ``spotwise-instance=instance_id``."""
    # generated protobuf modules ship no stubs: mypy sees no message classes in them
    from ray.core.generated.gcs_pb2 import GcsNodeInfo  # type: ignore[attr-defined]

    infos = gcs_client.get_all_node_info(timeout=10, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
    for node_id, info in infos.items():
        if dict(info.labels).get(INSTANCE_LABEL) == instance_id:
            return node_id.hex() if hasattr(node_id, "hex") else info.node_id.hex()
    return None


def drain(gcs_address: str, instance_id: str, notice: Notice) -> tuple[bool, str]:
    """Drain the node of ``instance_id``; ``(accepted, message)``."""
    import ray._raylet
    from ray.core.generated import autoscaler_pb2

    client = ray._raylet.GcsClient(address=gcs_address)  # type: ignore[attr-defined]  # compiled, empty stub
    node_id = find_node_id(client, instance_id)
    if node_id is None:
        return False, f"no alive Ray node labelled {INSTANCE_LABEL}={instance_id}"
    accepted, msg = client.drain_node(
        node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),  # type: ignore[attr-defined]  # generated, no stub
        f"{notice.cloud} spot interruption notice: {notice.action}", int(notice.deadline_ms), timeout=10)
    return bool(accepted), msg or f"drained node {node_id}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spotwise.runtime.node.watch", description=__doc__.split("\n\n")[0])
    p.add_argument("--cloud", required=True, choices=["aws", "gcp", "azure", "slurm"])
    p.add_argument("--metadata-url", default=None, help="metadata service base URL")
    p.add_argument("--instance-id", required=True)
    p.add_argument("--gcs-address", required=True, help="HOST:PORT of the Ray GCS")
    p.add_argument("--poll-interval", type=float, default=0.5)
    p.add_argument("--once", action="store_true", help="poll once and exit")
    p.add_argument("--ack-after-checkpoint", default=None, help="Azure: storage URI of the run")
    p.add_argument("--lease-deadline", type=float, default=None,
                   help="dead man's switch: boot lease, epoch seconds (omit: no switch)")
    p.add_argument("--lease-unreachable-s", type=float, default=None,
                   help="end the node when the GCS has not answered for this long (default 60)")
    p.add_argument("--self-end", default="shutdown", choices=["shutdown", "azure", "gcp", "local", "slurm"],
                   help="how the node ends itself: shutdown -h now; (Azure) delete its VM through ARM; "
                        "(GCP) delete its instance through the Compute API; (local cloud) kill its processes; "
                        "or (Slurm) scancel its job")
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = _parser().parse_args(argv)
    if args.poll_interval <= 0:
        print(f"--poll-interval: got {args.poll_interval}; allowed: a number > 0", file=sys.stderr)
        return 1
    if args.lease_unreachable_s is not None and not args.lease_unreachable_s > 0:
        print(f"--lease-unreachable-s: got {args.lease_unreachable_s}; allowed: a number > 0", file=sys.stderr)
        return 1
    if args.lease_deadline is not None and not math.isfinite(args.lease_deadline):
        print(f"--lease-deadline: got {args.lease_deadline}; allowed: finite epoch seconds", file=sys.stderr)
        return 1
    reader = None
    if args.lease_deadline is not None:
        from spotwise.runtime.node.deadman import UNREACHABLE_S, LeaseReader, Switch

        switch = Switch(deadline=args.lease_deadline, unreachable_s=args.lease_unreachable_s or UNREACHABLE_S)
        reader = LeaseReader(args.gcs_address, switch).start()
        log.info("dead man's switch armed: boot lease until %.3f", args.lease_deadline)
    poller = make_poller(args.cloud, args.metadata_url, instance_id=args.instance_id)
    drained = False
    failures = 0
    while True:
        if reader is not None:
            why = reader.expired()
            if why:
                from spotwise.runtime.node.deadman import end_self

                end_self(args.self_end, why, metadata_url=args.metadata_url)
                return 1                       # only when ending failed
        notice = None
        if not drained:
            try:
                notice = poller.poll()
                failures = 0
            except Exception as e:  # noqa: BLE001 - metadata hiccup: retry
                failures += 1
                if failures in (1, 10) or failures % 120 == 0:   # the runner's metadata server may be gone
                    log.warning("metadata poll failed (%d in a row): %s", failures, e)
        if notice is not None:
            log.warning("interruption notice: %s", notice)
            noticed_ms = int(time.time() * 1000)
            accepted, msg = drain(args.gcs_address, args.instance_id, notice)
            log.warning("drain %s: %s", "accepted" if accepted else "REJECTED", msg)
            if args.cloud == "azure" and notice.event_id:
                if args.ack_after_checkpoint:
                    wait_for_checkpoint(args.ack_after_checkpoint, noticed_ms, notice.deadline_ms)
                try:
                    poller.acknowledge(notice.event_id)
                except Exception as e:  # noqa: BLE001 - drained already; without the ack Azure waits out its deadline
                    log.warning("ack failed: %s", e)
            if reader is None:
                return 0 if accepted else 1
            drained = True                     # keep guarding the lease until the node is gone
        if args.once:
            return 0
        time.sleep(args.poll_interval)


if __name__ == "__main__":
    sys.exit(main())
