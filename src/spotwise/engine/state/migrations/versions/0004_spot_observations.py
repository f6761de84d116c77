"""What earlier runs saw of spot in a zone: the zone history a later run's policy is shown.

One row per stretch of ticks in which one run saw spot of one instance type in one site as
obtainable (``state`` 1) or not (0); a tick without evidence either way is not written. See
:mod:`spotwise.engine.state.spot_log`.

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a database made by ``create_all`` from newer models (stamped at 0001) may have it already
    if "spot_observations" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "spot_observations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("cloud", sa.String(32), nullable=False),
        sa.Column("region", sa.String(64), nullable=False),
        sa.Column("instance_type", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("state", sa.Integer(), nullable=False),
        sa.Column("t_start", sa.Float(), nullable=False),
        sa.Column("t_end", sa.Float(), nullable=False),
    )
    op.create_index("ix_spot_observations_site", "spot_observations", ["cloud", "region", "instance_type", "t_end"])


def downgrade() -> None:
    op.drop_index("ix_spot_observations_site", table_name="spot_observations")
    op.drop_table("spot_observations")
