"""Sluice's AI/ML management service: TS 28.105 training management over TS 28.532 ProvMnS REST.

The producer (``sluice serve``) keeps every managed object instance (MOI) — training requests, training
processes, reports, models, subscriptions — and every notification still to deliver in a database
(:mod:`sluice.service.db`, SQLAlchemy + Alembic). Each training process runs in its own worker process
(:mod:`sluice.service.worker`) through the same :class:`sluice.control.TrainingProcess` that ``sluice run``
uses. :mod:`sluice.service.client` is the consumer side (httpx). Importing this package adds the ``chain``
engine kind (:mod:`sluice.service.chain`) to the kinds a job may name (:data:`sluice.runtimes.jobs.ENGINE_KINDS`).

Nothing here is imported when the CLI builds its parser: FastAPI, SQLAlchemy and torch are loaded by the
commands that need them.
"""

from sluice.runtimes.jobs import EngineKind, register_engine_kind

register_engine_kind(EngineKind("chain", "sluice.service.chain:ChainConfig", "sluice.service.chain:engine_from_config",
                                lambda c: "chain-" + "-".join(c.producers)))
