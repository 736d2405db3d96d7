"""Per-client reporting of federated training: what each client did, accumulated over the iterations.

A federated engine lists in every :class:`sluice.engine.IterationEvent` the part each sampled client took
(:class:`sluice.engine.ClientRound`); :class:`ClientTally` adds them up, and the report carries the result
as :attr:`sluice.control.report.TrainingReport.clients`, one :class:`ClientReport` per client that was
sampled at least once, in id order. A client that drops out (it received the server's message and uploaded
nothing) counts in ``dropped``; one that comes back after a dense resynchronisation (a restarted node) in
``resynced``; both keep their entry. A client takes part (:meth:`ClientTally.participating`) from its first
sampling on, and leaves while it has not answered since it dropped out (``active``).
:func:`sluice.roles.threegpp.training_report` renders the entries as TS 28.105 ``fLReportPerClient``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from sluice.engine import ClientRound


class ClientReport(BaseModel):
    """One client's part in a training process."""

    id: int = Field(description="the client's id (the terminal, in horizontal FL)")
    rounds: int = Field(0, description="iterations it trained in and uploaded")
    dropped: int = Field(0, description="iterations it was sampled in and uploaded nothing (it dropped out)")
    resynced: int = Field(0, description="iterations whose message to it was a dense resynchronisation "
                          "(it rejoined, or what it held was unknown)")
    samples: int = Field(0, description="training samples it used: the most it trained on in one iteration "
                         "(each iteration trains on all it holds)")
    training_s: float = Field(0.0, description="its local training time, summed over the iterations it trained in")
    first_round: int | None = Field(None, description="the first iteration it trained in")
    last_round: int | None = Field(None, description="the last iteration it trained in")
    started_at: str | None = Field(None, description="when its first local training began (UTC, ISO 8601, the "
                                   "client's clock)")
    ended_at: str | None = Field(None, description="when its last local training ended (UTC, ISO 8601)")
    performance: dict[str, float] = Field(default_factory=dict, description="what it reported the last time it "
                                          "trained (train_loss...)")
    active: bool = Field(True, description="it uploaded the last time it was sampled (False: it dropped out and "
                         "has not answered since)")

    @property
    def sampled(self) -> int:
        """Iterations it was sampled in (trained or dropped)."""
        return self.rounds + self.dropped


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ClientTally:
    """The :class:`ClientReport` of every client seen, updated with each iteration's client parts."""

    def __init__(self) -> None:
        self._clients: dict[int, ClientReport] = {}

    def add(self, iteration: int, parts: Iterable[ClientRound]) -> None:
        """Add the clients' ``parts`` in ``iteration``."""
        for p in parts:
            r = self._clients.setdefault(int(p.client), ClientReport(id=int(p.client)))
            r.resynced += bool(p.resynced)
            r.active = not p.dropped
            if p.dropped:
                r.dropped += 1
                continue
            r.rounds += 1
            r.samples = max(r.samples, int(p.samples))
            r.training_s += float(p.seconds)
            r.first_round = iteration if r.first_round is None else r.first_round
            r.last_round = iteration
            if p.started_at is not None and math.isfinite(p.started_at):
                r.started_at = r.started_at or _iso(p.started_at)
                r.ended_at = _iso(p.started_at + float(p.seconds))
            r.performance = {k: float(v) for k, v in p.metrics.items()}

    def reports(self) -> list[ClientReport]:
        """Every client seen, in id order (copies)."""
        return [self._clients[c].model_copy(deep=True) for c in sorted(self._clients)]

    def participating(self) -> list[int]:
        """The ids of the clients taking part (sampled at least once, and uploaded the last time), in order."""
        return sorted(c for c, r in self._clients.items() if r.sampled and r.active)

    def state(self) -> list[dict[str, Any]]:
        """The tally as plain dicts (a process checkpoint's ``clients``)."""
        return [r.model_dump(mode="json") for r in self.reports()]

    def load_state(self, state: Iterable[Mapping[str, Any]]) -> None:
        """Go on from :meth:`state`."""
        reports = [ClientReport.model_validate(dict(x)) for x in state]
        self._clients = {r.id: r for r in reports}
