"""The runner's lease on a job: who owns it (host, pid, process start time) and until when.

``owner_host``/``owner_pid``/``owner_started`` name the process that runs the job; the start time
(``/proc/PID/stat`` field 22, clock ticks since boot, with the boot id) tells a reused pid from the
owner. ``lease_expires_at`` is renewed every few seconds by the owner; once it has passed, or the
owner on this host is provably gone, ``gc``, ``serve`` and the next ``launch`` may end the job's
nodes and mark it ``lost``. ``node_deadline`` is the latest time the job's nodes were told to end
themselves by (their dead man's switch): bills of a dead owner's nodes close no later than it plus
the nodes' self-end allowance (see :mod:`spotwise.engine.state.lease`).

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


COLUMNS = (("owner_host", sa.String(255)), ("owner_started", sa.String(64)), ("lease_expires_at", sa.Float()),
           ("node_deadline", sa.Float()))


def upgrade() -> None:
    # a database made by ``create_all`` from newer models (stamped at 0001) may have them already
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("jobs")}
    missing = [(n, t) for n, t in COLUMNS if n not in have]
    if missing:
        with op.batch_alter_table("jobs") as b:
            for name, type_ in missing:
                b.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        for c in ("node_deadline", "lease_expires_at", "owner_started", "owner_host"):
            b.drop_column(c)
