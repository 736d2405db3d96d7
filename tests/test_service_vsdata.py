"""The typed sluice-* vsData of a request: what fits, and the 400 (with its message) for what does not."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sluice.service.nrm import MnSError
from sluice.service.vsdata import feedback, negotiation, performance_requirements, request_vs


def refused(fn: Any, *args: Any) -> MnSError:
    with pytest.raises(MnSError) as info:
        fn(*args)
    assert info.value.status == 400
    return info.value


def test_a_request_with_termination_is_decided_by_its_consumer() -> None:
    got = request_vs({}, {"sluice-job": {"engine": "local"}, "sluice-termination": {"iterations": 3}})
    assert (got.job, got.termination, got.decided_by, got.requirements) == (
        {"engine": "local"}, {"iterations": 3}, "consumer", {})
    assert request_vs({}, {}).decided_by == "producer"
    assert request_vs({}, {"sluice-negotiation": {"decidedBy": "negotiated"}}).decided_by == "negotiated"
    assert request_vs({}, {"sluice-negotiation": {"decidedBy": ""}}).decided_by == "producer"


def test_performance_requirements_add_thresholds() -> None:
    got = request_vs({"performanceRequirements": [{"performanceMetric": "accuracy", "performanceScore": 1}]},
                     {"sluice-requirements": {"performance": {"loss": 0.5}, "min_samples": 10}})
    assert got.requirements == {"performance": {"loss": 0.5, "accuracy": 1.0}, "min_samples": 10}
    sent = {"performance": {"loss": 0.5}}
    request_vs({"performanceRequirements": [{"performanceMetric": "accuracy", "performanceScore": 1}]},
               {"sluice-requirements": sent})
    assert sent == {"performance": {"loss": 0.5}}  # the consumer's vsData stays as sent
    for bad in ({"performanceMetric": "a", "performanceScore": True}, {"performanceMetric": 1, "performanceScore": 1},
                {"performanceMetric": "a", "performanceScore": math.nan}, "accuracy"):
        exc = refused(performance_requirements, [bad])
        assert exc.reason == ("performanceRequirements[0] needs performanceMetric (text) and performanceScore "
                              "(a number)") and exc.bad_attributes == ["performanceRequirements"]


@pytest.mark.parametrize(("vs", "message", "where"), [
    ({"sluice-job": [1]}, "sluice-job vsData must be an object (a job: engine = ..., and its sections)", "sluice-job"),
    ({"sluice-requirements": 3}, "sluice-requirements vsData must be an object", "sluice-requirements"),
    ({"sluice-termination": "x"}, "sluice-termination vsData must be an object", "sluice-termination"),
    ({"sluice-negotiation": [1]}, "sluice-negotiation vsData must be an object", "sluice-negotiation"),
    ({"sluice-negotiation": {"decidedBy": "me"}}, "decidedBy must be consumer, producer or negotiated, got 'me'",
     "sluice-negotiation"),
    ({"sluice-negotiation": {"decidedBy": "consumer"}},
     "decidedBy consumer needs the termination parameters (sluice-termination)", "sluice-termination"),
    ({"sluice-negotiation": {"decidedBy": "negotiated"}, "sluice-termination": {"iterations": 3}},
     "decidedBy negotiated: the producer sets the termination parameters; send none (or decidedBy consumer)",
     "sluice-termination"),
])
def test_shapes_that_do_not_fit(vs: dict[str, Any], message: str, where: str) -> None:
    exc = refused(request_vs, {}, vs)
    assert exc.reason == message and exc.bad_attributes == [f"VsDataContainer/{where}"]


def test_feedback_and_negotiation() -> None:
    assert feedback({"metric": "accuracy", "value": 1}).value == 1.0
    for bad in (None, {"metric": "accuracy"}, {"metric": 2, "value": 1}, {"metric": "a", "value": math.inf},
                {"metric": "a", "value": False}):
        assert refused(feedback, bad).reason == "sluice-feedback is {metric: name, value: number}"
    assert negotiation(None).decidedBy is None
    assert negotiation({"decidedBy": "producer", "accept": True}).decidedBy == "producer"
