"""The first store: managed objects, notification outbox, model artifacts, uploaded training data.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
BIGID = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "moi",
        sa.Column("dn", sa.String(1000), primary_key=True),
        sa.Column("parent_dn", sa.String(1000), nullable=True),
        sa.Column("object_class", sa.String(100), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("attributes", JSON, nullable=False),
        sa.Column("vs_data", JSON, nullable=False),
        sa.Column("internal", JSON, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_moi_parent_dn", "moi", ["parent_dn"])
    op.create_index("ix_moi_object_class", "moi", ["object_class"])
    op.create_index("ix_moi_seq", "moi", ["seq"])
    op.create_table(
        "notification",
        sa.Column("id", BIGID, primary_key=True, autoincrement=True),
        sa.Column("subscription_dn", sa.String(1000), nullable=False),
        sa.Column("recipient", sa.String(2000), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=False),
        sa.Column("delivered_at", sa.Float, nullable=True),
        sa.Column("dropped", sa.Boolean, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_notification_subscription_dn", "notification", ["subscription_dn"])
    op.create_index("ix_notification_next_attempt_at", "notification", ["next_attempt_at"])
    op.create_table(
        "artifact",
        sa.Column("dn", sa.String(1000), primary_key=True),
        sa.Column("content", sa.LargeBinary, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "upload",
        sa.Column("id", BIGID, primary_key=True, autoincrement=True),
        sa.Column("request_dn", sa.String(1000), nullable=False),
        sa.Column("process_dn", sa.String(1000), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_upload_request_dn", "upload", ["request_dn"])
    op.create_index("ix_upload_process_dn", "upload", ["process_dn"])


def downgrade() -> None:
    op.drop_table("upload")
    op.drop_table("artifact")
    op.drop_index("ix_notification_next_attempt_at", "notification")
    op.drop_index("ix_notification_subscription_dn", "notification")
    op.drop_table("notification")
    op.drop_index("ix_moi_seq", "moi")
    op.drop_index("ix_moi_object_class", "moi")
    op.drop_index("ix_moi_parent_dn", "moi")
    op.drop_table("moi")
