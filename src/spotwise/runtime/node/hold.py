"""Hold a node's shutdown until the run's just-in-time checkpoint is committed.

    python -m spotwise.runtime.node.hold RUN_URI --since EPOCH --until EPOCH

Exit 0 once the newest committed checkpoint of the run stored at ``RUN_URI`` is one after which
the ranks do no more work (a ``preemption``, ``stop`` or ``final`` one: :data:`ENDING_KINDS`, not a
periodic one) committed at or after ``--since`` (its ``COMMITTED`` marker's ``time``); exit 3 at ``--until`` without one; exit 2
on a bad argument. Read without torch (:mod:`spotwise.runtime.checkpoint.layout`), with the
node's own identity for the store.

Why: GCE preempts a Spot VM with an ACPI soft off, and powers it off 30 s later; the guest's
shutdown stops the node's processes (Ray's raylet, the ranks) within seconds unless something
holds it, so the just-in-time checkpoint the interruption watcher's drain asked for would be cut
off. GCE runs the instance's ``shutdown-script`` metadata before the rest of the shutdown ("Run
shutdown scripts": a best-effort window, on a preemption inside the 30 s), and spotwise's is this
hold (:mod:`spotwise.provisioner.clouds.gcp.shutdown`). The Azure watcher waits the same way before
acknowledging its Preempt event (:func:`wait_for_checkpoint`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


#: the checkpoint kinds after which the ranks do no more work: the notice's own (``preemption``), a
#: requested ``stop``, the run's ``final``. A ``periodic`` one is not the end of anything: with the
#: README's job a periodic checkpoint commits every second or two, so one always lay within a
#: notice's first seconds, and the hold let the shutdown go on before the just-in-time checkpoint
#: (seen on the emulated GCP, 2026-12-06: ``lost_steps`` 1, the ranks stopped mid-step).
ENDING_KINDS = frozenset({"preemption", "stop", "final"})


def wait_for_checkpoint(run_uri: str, since_ms: int, deadline_ms: int, poll_s: float = 0.5) -> bool:
    """Whether a checkpoint of the run at ``run_uri`` of an :data:`ENDING_KINDS` kind, committed at
    or after ``since_ms`` (epoch milliseconds), appeared before ``deadline_ms``; polls its store
    every ``poll_s``."""
    from spotwise.runtime.checkpoint.layout import COMMIT_MARKER, latest_committed, step_dir
    from spotwise.runtime.storage.base import open_storage

    storage = open_storage(run_uri)
    while True:
        info = latest_committed(storage)
        if info is not None and info.kind in ENDING_KINDS:
            meta = json.loads(storage.get_bytes(f"{step_dir(info.step)}/{COMMIT_MARKER}") or b"{}")
            if meta.get("time", 0) * 1000 >= since_ms:
                return True
        if time.time() * 1000 >= deadline_ms:
            return False
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spotwise.runtime.node.hold", description=__doc__.split("\n\n")[0])
    p.add_argument("run_uri", help="the run's storage URI (STORE/RUN)")
    p.add_argument("--since", type=float, required=True, help="epoch seconds: a checkpoint committed at or after")
    p.add_argument("--until", type=float, required=True, help="epoch seconds: when to stop holding")
    args = p.parse_args(argv)
    if not args.until >= args.since:
        print(f"--until: got {args.until}; allowed: epoch seconds >= --since ({args.since})", file=sys.stderr)
        return 2
    if wait_for_checkpoint(args.run_uri, int(args.since * 1000), int(args.until * 1000)):
        print(f"spotwise: a checkpoint of {args.run_uri} committed; the shutdown goes on", flush=True)
        return 0
    print(f"spotwise: no checkpoint of {args.run_uri} committed by the hold's end; the shutdown goes on", flush=True)
    return 3


if __name__ == "__main__":
    sys.exit(main())
