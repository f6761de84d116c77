"""A schedule's ``unfinished`` rule: ``restart`` (every fire time starts the task anew, as before)
or ``resume`` (a previous run that ended unfinished continues from its last checkpoint). See
:mod:`spotwise.engine.work.schedules`.

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a database made by ``create_all`` from newer models (stamped at 0001) may have it already
    if "unfinished" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("schedules")}:
        return
    with op.batch_alter_table("schedules") as t:
        t.add_column(sa.Column("unfinished", sa.String(16), nullable=False, server_default="restart"))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as t:
        t.drop_column("unfinished")
