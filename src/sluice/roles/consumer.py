"""The consumer side: ask one producer or several (R4) for a model and gather the results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.errors import ConfigError
from sluice.roles.handles import ProcessHandle
from sluice.roles.negotiation import Review
from sluice.roles.producer import Producer, RequestRefused, RequestResponse, TrainingRequest


class Consumer:
    """Sends training requests and, when negotiating, reviews proposals with ``review``."""

    def __init__(self, name: str = "consumer", review: Review | None = None) -> None:
        self.name = name
        self.review = review

    def start(self, producer: Producer, request: TrainingRequest, **kwargs: Any) -> ProcessHandle:
        """One request to one producer, training in the background: the process handle, or
        :class:`~sluice.roles.producer.RequestRefused` with the producer's answer."""
        return producer.start(request, review=self.review, **kwargs)

    def request(self, producer: Producer, request: TrainingRequest, **kwargs: Any) -> RequestResponse:
        """One request to one producer; the answer says whether it was accepted, with its report."""
        return producer.request(request, review=self.review, **kwargs)

    def request_many(
        self,
        producers: Sequence[Producer],
        request: TrainingRequest,
        *,
        parallel: bool = False,
        **kwargs: Any,
    ) -> list[RequestResponse]:
        """Send the same request to several producers (R4) and gather every answer, in producer order.

        ``parallel`` starts every producer's training before waiting for any (each engine should then keep
        to one torch thread); if a start fails, the processes already started are cancelled.
        """
        names = [p.name for p in producers]
        if len(set(names)) != len(names):
            raise ConfigError(f"producer names must be distinct, got {names}")
        if not parallel:
            return [self.request(p, request, **kwargs) for p in producers]
        started: list[ProcessHandle | RequestResponse] = []
        try:
            for p in producers:
                try:
                    started.append(self.start(p, request, **kwargs))
                except RequestRefused as refused:
                    started.append(refused.response)
        except BaseException:
            for s in started:
                if isinstance(s, ProcessHandle):
                    s.cancel()
            raise
        return [p.answer(s) if isinstance(s, ProcessHandle) else s for p, s in zip(producers, started, strict=True)]


def train_many(
    producers: Sequence[Producer], request: TrainingRequest, review: Review | None = None, **kwargs: Any
) -> list[RequestResponse]:
    """Shorthand for ``Consumer(review=review).request_many(producers, request)``."""
    return Consumer(review=review).request_many(producers, request, **kwargs)
