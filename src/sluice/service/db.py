"""The service's store: tables (SQLAlchemy 2), the Alembic migrations that create them, and the engine.

Tables (created only by the migrations in ``sluice/service/migrations``):

* ``moi`` — every managed object instance by its LDN (``SubNetwork=SN1/MLTrainingFunction=TF1/...``):
  class, parent, the 3GPP ``attributes``, the ``VsDataContainer`` payloads by container id (``vs_data``)
  and the producer's own bookkeeping (``internal``: the job of a process, queue flags...), which is never
  shown;
* ``notification`` — the outbox: one row per notification and subscription, written in the same
  transaction as the change it reports; its autoincrement id is the ``notificationId`` (never reused:
  SQLite ``AUTOINCREMENT``, a sequence elsewhere);
* ``artifact`` — the bytes of each trained model, by the model's LDN;
* ``upload`` — training data a consumer sent, kept until a process has taken it;
* ``checkpoint`` — the last checkpoint of each running training process (engine and process state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class Base(DeclarativeBase):
    pass


class MOI(Base):
    __tablename__ = "moi"

    dn: Mapped[str] = mapped_column(sa.String(1000), primary_key=True)
    parent_dn: Mapped[str | None] = mapped_column(sa.String(1000), index=True)
    object_class: Mapped[str] = mapped_column(sa.String(100), index=True)
    seq: Mapped[int] = mapped_column(sa.BigInteger, index=True)
    attributes: Mapped[dict[str, Any]] = mapped_column(JSONType)
    vs_data: Mapped[dict[str, Any]] = mapped_column(JSONType)
    internal: Mapped[dict[str, Any]] = mapped_column(JSONType)
    version: Mapped[int] = mapped_column(sa.Integer, default=1)
    created_at: Mapped[float] = mapped_column(sa.Float)
    updated_at: Mapped[float] = mapped_column(sa.Float)


class Notification(Base):
    __tablename__ = "notification"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    subscription_dn: Mapped[str] = mapped_column(sa.String(1000), index=True)
    recipient: Mapped[str] = mapped_column(sa.String(2000))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[float] = mapped_column(sa.Float)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(sa.Float, index=True)
    delivered_at: Mapped[float | None] = mapped_column(sa.Float, nullable=True)
    dropped: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    last_error: Mapped[str | None] = mapped_column(sa.Text, nullable=True)


class Artifact(Base):
    __tablename__ = "artifact"

    dn: Mapped[str] = mapped_column(sa.String(1000), primary_key=True)
    content: Mapped[bytes] = mapped_column(sa.LargeBinary)
    sha256: Mapped[str] = mapped_column(sa.String(64))
    size: Mapped[int] = mapped_column(sa.BigInteger)


class Upload(Base):
    __tablename__ = "upload"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    request_dn: Mapped[str] = mapped_column(sa.String(1000), index=True)
    process_dn: Mapped[str] = mapped_column(sa.String(1000), index=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType)
    samples: Mapped[int] = mapped_column(sa.Integer)
    created_at: Mapped[float] = mapped_column(sa.Float)


def make_engine(url: str) -> sa.Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and cross-thread connections. PostgreSQL URLs
    (``postgresql://`` or ``postgresql+psycopg://``) use psycopg 3 (extra ``service``); a throwaway server
    for tests and benchmarks is :func:`sluice.service.pgserver.running_postgres`."""
    if url.startswith("sqlite"):
        eng = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @sa.event.listens_for(eng, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return eng
    return sa.create_engine(url, pool_pre_ping=True)


def alembic_config(url: str) -> Any:
    """The Alembic configuration of the packaged migrations for database ``url``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def migrate(engine: sa.Engine, revision: str = "head") -> None:
    """Bring the database of ``engine`` to ``revision`` (creates every table on a new database)."""
    from alembic import command

    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


class Checkpoint(Base):
    """The last checkpoint of a running training process (by the process's LDN): the engine's state
    (``engine.checkpoint()``) and the process's own (:meth:`sluice.control.TrainingProcess.checkpoint`, as
    JSON), taken after iteration ``iteration``. A restarted service resumes the process from it; the row
    is removed when the process ends."""

    __tablename__ = "checkpoint"

    process_dn: Mapped[str] = mapped_column(sa.String(1000), primary_key=True)
    iteration: Mapped[int] = mapped_column(sa.Integer)
    engine_state: Mapped[bytes] = mapped_column(sa.LargeBinary)
    process_state: Mapped[bytes] = mapped_column(sa.LargeBinary)
    created_at: Mapped[float] = mapped_column(sa.Float)
