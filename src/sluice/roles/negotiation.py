"""Who decides the termination parameters (T2).

* ``"consumer"`` — the consumer decides and sends them; the producer trains with them as given;
* ``"producer"`` — the producer decides them itself from the requirements, the model type and its past
  runs of that model;
* ``"negotiated"`` — the producer proposes, the consumer accepts (returns ``None``/``True``), modifies
  (returns a dict merged into the proposal, JSON merge-patch style, or a whole :class:`Termination`) or
  rejects (returns ``False``), and training uses the result.

Parameters can still change while training runs: :meth:`TrainingProcess.update`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from sluice.control.params import ModelIdentity, Requirements, Termination, parse_termination
from sluice.control.policy import Proposal
from sluice.errors import NegotiationError

DecidedBy = Literal["consumer", "producer", "negotiated"]


class Agreement(BaseModel):
    """The termination parameters training will use and how they were reached."""

    termination: Termination
    decided_by: DecidedBy
    proposal: Proposal | None = None
    modified: bool = False


Review = Callable[[Proposal], "None | bool | dict[str, Any] | Termination"]


class Proposer(Protocol):
    """What negotiation needs of a producer (:class:`sluice.roles.Producer` is one)."""

    name: str

    def propose(self, model: ModelIdentity, requirements: Requirements | None = None) -> Proposal: ...

    def decide(self, model: ModelIdentity, requirements: Requirements | None = None) -> Termination: ...


def negotiate(
    producer: Proposer,
    model: ModelIdentity,
    requirements: Requirements | None = None,
    *,
    mode: DecidedBy = "consumer",
    termination: Termination | dict[str, Any] | None = None,
    review: Review | None = None,
) -> Agreement:
    """Run one of the three flows of T2 and return the agreed parameters."""
    if mode == "consumer":
        if termination is None:
            raise NegotiationError("mode 'consumer' needs the consumer's termination parameters")
        return Agreement(termination=parse_termination(termination), decided_by="consumer")
    if mode == "producer":
        if termination is not None:
            raise NegotiationError(
                "mode 'producer' lets the producer decide; do not send termination parameters "
                "(use mode 'consumer' or 'negotiated')"
            )
        return Agreement(termination=producer.decide(model, requirements), decided_by="producer")
    if mode != "negotiated":
        raise NegotiationError(f"mode must be 'consumer', 'producer' or 'negotiated', got {mode!r}")
    proposal = producer.propose(model, requirements)
    answer = review(proposal) if review is not None else None
    if answer is None or answer is True:
        return Agreement(termination=proposal.termination, decided_by="negotiated", proposal=proposal)
    if answer is False:
        raise NegotiationError(f"the consumer rejected the proposal of {producer.name}: "
                               + "; ".join(proposal.rationale))
    if isinstance(answer, dict):
        agreed = proposal.termination.merged(answer)
    elif isinstance(answer, Termination):
        agreed = answer
    else:
        raise NegotiationError(f"a review answers None/True (accept), False (reject), a dict of changes or "
                               f"Termination; got {type(answer).__name__}")
    return Agreement(termination=agreed, decided_by="negotiated", proposal=proposal,
                     modified=agreed != proposal.termination)
