"""What the parts of :class:`sluice.service.core.TrainingService` share: the state its constructor sets (one
producer: its store, outbox, supervisor...) and small helpers. The parts (:mod:`~sluice.service.requests`,
:mod:`~sluice.service.processes`, :mod:`~sluice.service.retraining`, :mod:`~sluice.service.messages`) are
mixins of that one class and call each other through ``self``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from sluice.control.lifecycle import Phase
from sluice.service.db import MOI

if TYPE_CHECKING:
    from sluice.service.capabilities import Prober
    from sluice.service.chain_cancels import ChainCancels
    from sluice.service.config import ServiceConfig
    from sluice.service.outbox import Outbox
    from sluice.service.store import Store
    from sluice.service.worker import Supervisor

ENDED = ("FINISHED", "FAILED", "CANCELLED")
_DUMP: dict[str, Any] = {"mode": "json", "exclude_none": True, "exclude_defaults": True}


def _phase(proc: MOI) -> Phase:
    return Phase.of(proc.internal)


class ServiceBase:
    """The state of one producer (set by ``TrainingService.__init__``)."""

    cfg: ServiceConfig
    public_url: str
    sn: str
    tf: str
    repo: str
    store: Store
    outbox: Outbox
    supervisor: Supervisor
    prober: Prober
    chain_cancels: ChainCancels
    _last_progress: dict[str, float]
    _policy_lock: threading.Lock
