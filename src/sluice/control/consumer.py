"""The consumer side: ask one producer or several (R4) for a model and gather the results."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sluice.control.negotiation import Review
from sluice.control.producer import Producer, RequestResponse, TrainingRequest
from sluice.errors import ConfigError


class Consumer:
    """Sends training requests and, when negotiating, reviews proposals with ``review``."""

    def __init__(self, name: str = "consumer", review: Review | None = None) -> None:
        self.name = name
        self.review = review

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

        ``parallel`` trains them in threads (each engine should then keep to one torch thread).
        """
        names = [p.name for p in producers]
        if len(set(names)) != len(names):
            raise ConfigError(f"producer names must be distinct, got {names}")
        if not parallel:
            return [self.request(p, request, **kwargs) for p in producers]
        with ThreadPoolExecutor(max_workers=len(producers)) as pool:
            futures = [pool.submit(self.request, p, request, **kwargs) for p in producers]
            return [f.result() for f in futures]


def train_many(
    producers: Sequence[Producer], request: TrainingRequest, review: Review | None = None, **kwargs: Any
) -> list[RequestResponse]:
    """Shorthand for ``Consumer(review=review).request_many(producers, request)``."""
    return Consumer(review=review).request_many(producers, request, **kwargs)
