"""Checkpoints of running training processes, so that a restarted service resumes them.

Revision ID: 0002_checkpoint
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_checkpoint"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoint",
        sa.Column("process_dn", sa.String(1000), primary_key=True),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("engine_state", sa.LargeBinary, nullable=False),
        sa.Column("process_state", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("checkpoint")
