"""The GCE ``shutdown-script`` of spotwise's nodes: on a preemption, hold the guest's shutdown
until the run's just-in-time checkpoint is committed.

GCE preempts a Spot VM by sending the guest an ACPI G2 soft off, then a G3 mechanical off 30 s
later if it has not stopped ("Preemption process", cloud.google.com/compute/docs/instances/
spot#preemption-process). The guest agent runs the instance's ``shutdown-script`` metadata item
when the guest shuts down, before the rest of the shutdown stops the node's processes (its
``google-shutdown-scripts.service`` runs it as the unit's ``ExecStop``; what the startup script
left running is stopped only afterwards, in systemd's final kill). Without a hold, the raylet and
the ranks get SIGTERM within seconds of the notice, while the interruption watcher's drain has only
just asked them for the just-in-time checkpoint.

The script (:func:`shutdown_script`): when ``instance/preempted`` is ``TRUE`` on the metadata
server (a deletion, a stop or the node's own dead man's switch is not held: nothing is coming),
run ``python -m spotwise.runtime.node.hold RUN --since NOW-2 --until NOW+HOLD_S`` in the node's
venv (the boot script records it in ``$STATE_DIR/venv``), so the shutdown goes on as soon as a
checkpoint committed after the notice is in the run's store, and at the latest :data:`HOLD_S`
seconds after it, inside the 30 s. The emulated GCP runs this script at the notice and only then
stops the node's processes (``tests/emulator/gcp.py``).
"""

from __future__ import annotations

import shlex

#: seconds the shutdown is held at most: GCE powers the VM off 30 s after the notice, and the
#: rest of the guest's shutdown needs a few
HOLD_S = 25
#: a checkpoint committed this long before the script started still counts (the hold starts a
#: moment after the notice; the watcher's drain may have been quicker)
SLACK_S = 2


def shutdown_items(compute_v1, run_storage: str | None, job_id: str) -> list:
    """The instance's ``shutdown-script`` metadata item for the run ``run_storage/job_id`` (none
    where the run has no storage: there is no checkpoint to wait for)."""
    if not run_storage:
        return []
    return [compute_v1.Items(key="shutdown-script", value=shutdown_script(f"{run_storage.rstrip('/')}/{job_id}"))]


def shutdown_script(run_uri: str) -> str:
    """The ``shutdown-script`` metadata value for nodes of the run stored at ``run_uri``."""
    q = shlex.quote
    return f"""#!/bin/bash
# spotwise: on a GCE preemption, hold the shutdown for the just-in-time checkpoint (at most {HOLD_S} s)
S="${{SPOTWISE_STATE_DIR:-/var/lib/spotwise}}"
MD="${{SPOTWISE_METADATA_URL:-http://metadata.google.internal}}"
[ "$(curl -sf -m 2 -H 'Metadata-Flavor: Google' "$MD/computeMetadata/v1/instance/preempted")" = TRUE ] || exit 0
[ -f "$S/venv" ] || exit 0
NOW=$(date +%s)
exec "$(cat "$S/venv")/bin/python" -m spotwise.runtime.node.hold {q(run_uri)} --since $((NOW - {SLACK_S})) --until $((NOW + {HOLD_S})) >>"$S/shutdown.log" 2>&1
"""
