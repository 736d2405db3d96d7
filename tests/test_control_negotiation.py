"""Who decides (T2), feasibility before training (R3), triggers (T7) and one-to-many requests (R4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sluice.control import (
    Cause,
    ModelIdentity,
    ProducerPolicy,
    ReplayEngine,
    Requirements,
    RunHistory,
    Termination,
    train,
)
from sluice.control.history import RunRecord
from sluice.errors import NegotiationError
from sluice.local import LocalTrainer
from sluice.roles import Consumer, Producer, TrainingRequest, negotiate, train_many


def _factory(ds, n_train: int | None = None, **kw):
    def make(model, requirements):
        n = n_train or len(ds.y_train)
        return LocalTrainer.from_arrays(ds.X_train[:n], ds.y_train[:n], ds.X_test, ds.y_test, num_classes=10,
                            hidden=(16,), **kw)

    return make


MODEL = ModelIdentity(id="fault-mlp", type="fault_prediction")


# --------------------------------------------------------------------------------- T2: who decides
def test_consumer_decides(digits) -> None:
    p = Producer("p", _factory(digits))
    ag = negotiate(p, MODEL, mode="consumer", termination={"iterations": 3})
    assert ag.decided_by == "consumer" and ag.termination.iterations == 3 and ag.proposal is None
    with pytest.raises(NegotiationError, match="needs the consumer's termination"):
        negotiate(p, MODEL, mode="consumer")
    with pytest.raises(NegotiationError, match="mode must be"):
        negotiate(p, MODEL, mode="whoever")  # type: ignore[arg-type]


def _past(iterations: int, reached: dict[str, float], *, run_id: str, model_id: str = "fault-mlp",
          shape: str | None = None) -> RunRecord:
    metric = next(iter(reached), None)
    return RunRecord(model_id=model_id, model_type=MODEL.type, version="1", cause=Cause.CRITERION_MET,
                     fired=None if metric is None else f"performance.{metric}", iterations=iterations,
                     duration_s=1.0, performance={}, run_id=run_id, shape=shape, reached=reached)


def test_producer_decides_from_requirements_type_and_history(digits) -> None:
    hist = RunHistory()
    p = Producer("p", _factory(digits), ProducerPolicy(default_iterations=77), hist)
    req = Requirements(performance={"accuracy": 0.9}, max_training_time_s=30)
    t = negotiate(p, MODEL, req, mode="producer").termination
    assert t.iterations == 77  # no history yet: policy default
    assert t.performance["test_accuracy"].threshold == 0.9
    assert t.training_time_s == 30
    assert t.plateau["test_accuracy"].patience == 20
    # a past run of the same model that reached test_accuracy 0.9 in 40 iterations -> 1.5 x 40
    hist.add(_past(40, {"test_accuracy": 0.9}, run_id="P1"))
    prop = p.propose(MODEL, req)
    assert prop.termination.iterations == 60
    assert any("P1" in why and "40 needed by 1 past run" in why for why in prop.rationale), prop.rationale
    # another model (another engine, maybe another architecture) of the same type does not learn from it
    other = ModelIdentity(id="fault-2", type="fault_prediction")
    assert p.decide(other, req).iterations == 77
    # type-specific training error for coverage problem analysis (T4)
    cov = ModelIdentity(id="cov", type="coverage_problem_analysis")
    t = p.decide(cov, None)
    assert t.training_error.threshold == 0.8 and t.plateau.keys() == {"coverage_error"}
    with pytest.raises(NegotiationError, match="do not send"):
        negotiate(p, MODEL, req, mode="producer", termination={"iterations": 3})


def test_history_counts_only_the_same_job_shape_and_a_compatible_target(digits) -> None:
    """Issue 41: a run of another architecture, or one that aimed lower or at another metric, says nothing
    about how long this request needs; the reason names the runs it used."""
    from sluice.control.history import job_shape

    job = {"data": {"dataset": "digits"}, "model": {"hidden": [16], "id": "a"}, "train": {"lr": 0.1}}
    shape = job_shape("local", job)
    # identity, seed, budgets and device do not change the shape; architecture, data, lr, compression do
    same = {**job, "seed": 3, "model": {"hidden": [16], "id": "b", "version": "2"},
            "train": {"lr": 0.1, "iterations": 500, "device": "cpu"}}
    assert job_shape("local", same) == shape
    for other in ({**job, "model": {"hidden": [64, 64]}}, {**job, "data": {"dataset": "mnist"}},
                  {**job, "train": {"lr": 0.01}}, {**job, "compression": {"up": "topk"}}):
        assert job_shape("local", other) != shape
    assert job_shape("hfl", job) != shape
    assert job_shape("local", job, {"layers": 1}) != shape
    assert job_shape("local", job, {"performance": {"test_accuracy": 0.5}, "max_training_time_s": 9}) == shape

    hist = RunHistory()
    p = Producer("p", _factory(digits), ProducerPolicy(default_iterations=77), hist)
    req = Requirements(performance={"test_accuracy": 0.9})
    hist.add(_past(8, {"test_accuracy": 0.95}, run_id="OTHER-ARCH", shape=job_shape("local", {"model": {}})))
    hist.add(_past(8, {"test_f1": 0.95}, run_id="OTHER-METRIC", shape=shape))
    hist.add(_past(8, {"test_accuracy": 0.8}, run_id="LOWER", shape=shape))
    hist.add(_past(8, {}, run_id="BUDGET", shape=shape))
    prop = p.propose(MODEL, req, shape=shape)
    assert prop.termination.iterations == 77
    assert any("no past run of this job shape reached test_accuracy ≥ 0.9" in w for w in prop.rationale)
    hist.add(_past(30, {"test_accuracy": 0.95}, run_id="R7-1", shape=shape))  # stricter: it passed 0.9
    hist.add(_past(20, {"test_accuracy": 0.9}, run_id="R8-1", shape=shape, model_id="another-id"))
    prop = p.propose(MODEL, req, shape=shape)
    assert prop.termination.iterations == 45
    (why,) = [w for w in prop.rationale if w.startswith("iterations")]
    assert "R7-1" in why and "R8-1" in why and "2 past run(s)" in why, why
    assert not any(x in why for x in ("OTHER", "LOWER", "BUDGET")), why
    # a stricter request: runs that stopped at 0.9 or 0.95 do not tell how long 0.97 takes
    assert p.propose(MODEL, Requirements(performance={"test_accuracy": 0.97}), shape=shape).termination \
        .iterations == 77
    # no goal at all: nothing to learn from
    assert p.propose(MODEL, None, shape=shape).termination.iterations == 77


def test_proposal_accepted_modified_or_rejected(digits) -> None:
    p = Producer("p", _factory(digits), ProducerPolicy(default_iterations=50))
    req = Requirements(performance={"accuracy": 0.9})
    seen = []

    def accept(prop):
        seen.append(prop)
        return None

    ag = negotiate(p, MODEL, req, mode="negotiated", review=accept)
    assert ag.decided_by == "negotiated" and not ag.modified
    assert ag.termination == seen[0].termination and seen[0].rationale
    ag = negotiate(p, MODEL, req, mode="negotiated",
                   review=lambda prop: {"iterations": 10, "plateau": None})
    assert ag.modified and ag.termination.iterations == 10 and not ag.termination.plateau
    assert ag.proposal.termination.iterations == 50
    ag = negotiate(p, MODEL, req, mode="negotiated", review=lambda prop: Termination(iterations=4))
    assert ag.termination.iterations == 4 and ag.termination.performance == {}
    with pytest.raises(NegotiationError, match="rejected"):
        negotiate(p, MODEL, req, mode="negotiated", review=lambda prop: False)


def test_negotiated_parameters_are_used_for_training(digits) -> None:
    p = Producer("p", _factory(digits), ProducerPolicy(default_iterations=50))
    req = TrainingRequest(model=MODEL, requirements=Requirements(performance={"accuracy": 0.99}),
                          decided_by="negotiated")
    resp = Consumer(review=lambda prop: {"iterations": 3}).request(p, req)
    assert resp.accepted and resp.agreement.modified
    assert resp.report.iterations == 3 and resp.report.fired == "iterations"
    assert resp.report.cause == Cause.PERFORMANCE_NOT_MET


# --------------------------------------------------------------------------------- R3: feasibility
def test_refused_early_for_samples_and_compute(digits) -> None:
    p = Producer("small", _factory(digits, n_train=80))
    resp = p.request(TrainingRequest(model=MODEL, requirements=Requirements(min_data_amount=200),
                                     termination=Termination(iterations=5)))
    assert not resp.accepted and resp.report.cause == Cause.INSUFFICIENT_TRAINING_SAMPLES
    assert resp.report.iterations == 0 and p.engines[MODEL.id].iteration == 0
    assert resp.request_status == "CANCELLED"
    p = Producer("slow", _factory(digits))
    resp = p.request(TrainingRequest(model=MODEL, requirements=Requirements(max_training_time_s=0.5),
                                     termination=Termination(iterations=10**6)))
    assert not resp.accepted and resp.report.cause == Cause.INSUFFICIENT_COMPUTE
    assert p.engines[MODEL.id].iteration == 0
    p = Producer("typed", _factory(digits), ProducerPolicy(supported_types=["energy_saving_analysis"]))
    resp = p.request(TrainingRequest(model=MODEL, termination=Termination(iterations=5)))
    assert not resp.accepted and "does not train models of type" in resp.reason


# --------------------------------------------------------------------------------- T7: triggers
def test_consumer_request_then_feedback_and_data_retraining(digits, tmp_path: Path) -> None:
    hist = RunHistory(tmp_path / "history.jsonl")
    p = Producer("p", _factory(digits), ProducerPolicy(retrain_below={"precision": 0.8}), hist,
                 save_dir=tmp_path / "models")
    resp = p.request(TrainingRequest(model=MODEL, termination=Termination(iterations=2)))
    assert resp.accepted and resp.trigger == "CONSUMER_REQUEST" and resp.request_status == "FINISHED"
    assert Path(resp.report.model_path).name == "fault-mlp-v1.pt"
    w1 = p.engines[MODEL.id].params.copy()

    no = p.feedback(MODEL.id, "precision", 0.93)
    assert not no.accepted and "meets threshold" in no.reason
    yes = p.feedback(MODEL.id, "test_precision", 0.6)
    assert yes.accepted and yes.trigger == "CONSUMER_FEEDBACK"
    assert yes.report.model.version == "2" and yes.report.iterations == 2
    assert p.engines[MODEL.id].iteration == 4  # continued from the trained state
    assert not np.array_equal(p.engines[MODEL.id].params, w1)

    X, y = digits.X_test[:50], digits.y_test[:50]
    upd = p.data_updated(MODEL.id, {"X": X, "y": y})
    assert upd.accepted and upd.trigger == "DATA_UPDATED" and upd.report.model.version == "3"
    assert p.engines[MODEL.id].num_samples == len(digits.y_train) + 50

    assert not p.feedback("unknown", "precision", 0.1).accepted
    assert not p.data_updated("unknown", {"X": X, "y": y}).accepted
    assert "no retraining threshold" in p.feedback(MODEL.id, "recall", 0.1).reason
    # the history survives on disk
    again = RunHistory(tmp_path / "history.jsonl")
    assert [r.trigger for r in again.records] == ["CONSUMER_REQUEST", "CONSUMER_FEEDBACK", "DATA_UPDATED"]


# --------------------------------------------------------------------------------- R4: one-to-many
@pytest.mark.parametrize("parallel", [False, True])
def test_one_consumer_many_producers(digits, parallel: bool) -> None:
    producers = [
        Producer("cell-a", _factory(digits, n_train=600)),
        Producer("cell-b", _factory(digits, n_train=1000)),
        Producer("cell-c", _factory(digits, n_train=100)),
    ]
    req = TrainingRequest(model=MODEL, requirements=Requirements(min_data_amount=500),
                          termination=Termination(iterations=3))
    answers = train_many(producers, req, parallel=parallel)
    assert [a.producer for a in answers] == ["cell-a", "cell-b", "cell-c"]
    assert [a.accepted for a in answers] == [True, True, False]
    assert answers[2].report.cause == Cause.INSUFFICIENT_TRAINING_SAMPLES
    assert all(a.report.iterations == 3 for a in answers[:2])
    # each producer trained its own data: different models
    assert not np.array_equal(producers[0].engines[MODEL.id].params, producers[1].engines[MODEL.id].params)
    with pytest.raises(Exception, match="distinct"):
        train_many([producers[0], producers[0]], req)


# --------------------------------------------------------------------------------- one preflight
class _Counted(ReplayEngine):
    """A replayed stream that says how many samples it holds but can neither limit nor wait for them."""

    num_samples = 50


def test_preflight_waits_for_data_when_the_process_can_take_it(digits) -> None:
    X, y = digits.X_train, digits.y_train
    eng = LocalTrainer.from_arrays(X[:60], y[:60], digits.X_test, digits.y_test, num_classes=10, hidden=(16,))
    req = Requirements(min_data_amount=100)
    asked: list[str] = []

    def more(report):
        asked.append(report.cause)
        return {"X": X[60:160], "y": y[60:160]}

    rep = train(eng, {"iterations": 2}, req, data_provider=more)
    assert rep.cause == Cause.CRITERION_MET and rep.awaited_data == 1 and rep.iterations == 2
    assert asked == [Cause.INADEQUATE_TRAINING_DATA] and eng.num_samples == 160
    # a process that cannot take data is refused before training, as is an engine that cannot wait
    eng = LocalTrainer.from_arrays(X[:60], y[:60], digits.X_test, digits.y_test, num_classes=10, hidden=(16,))
    assert train(eng, {"iterations": 2}, req).cause == Cause.INSUFFICIENT_TRAINING_SAMPLES
    rep = train(_Counted([{"test_accuracy": 0.5}] * 3), {"iterations": 2, "data_wait_s": 5}, req)
    assert rep.cause == Cause.INSUFFICIENT_TRAINING_SAMPLES and "50 training samples" in rep.detail
    # the producer judges with the same preflight: accepted, the engine waits for 100 samples
    p = Producer("p", _factory(digits, n_train=60))
    v = p.assess(MODEL, req, Termination(iterations=2, data_wait_s=5))
    assert v.feasible and v.awaits_samples == 100 and p.engines[MODEL.id].min_samples == 100
    v = Producer("q", _factory(digits, n_train=60)).assess(MODEL, req, Termination(iterations=2))
    assert not v.feasible and v.cause == Cause.INSUFFICIENT_TRAINING_SAMPLES


def test_preflight_refuses_data_amounts_an_engine_cannot_apply() -> None:
    stream = [{"test_accuracy": 0.5}] * 3
    with pytest.raises(NegotiationError, match="cannot limit its training samples"):
        train(_Counted(stream), {"iterations": 2}, {"max_data_amount": 20})
    with pytest.raises(NegotiationError, match="cannot say how many training samples"):
        train(ReplayEngine(stream), {"iterations": 2}, {"data_amount": 20})
    with pytest.raises(NegotiationError, match="cannot say how many layers"):
        train(ReplayEngine(stream), {"iterations": 2}, {"layers": 1})
    assert train(_Counted(stream), {"iterations": 2}, {"max_data_amount": 50}).iterations == 2  # nothing to cut
    p = Producer("p", lambda model, req: _Counted(stream))
    resp = p.request(TrainingRequest(model=MODEL, requirements=Requirements(data_amount=20),
                                     termination=Termination(iterations=2)))
    assert not resp.accepted and "cannot limit" in resp.reason and len(p.processes) == 0


# --------------------------------------------------------------------------------- the service's proposals
def test_the_service_proposes_from_runs_of_the_same_job_shape_and_target(tmp_path) -> None:
    """Issue 41 over the wire: a run that reached test_accuracy 0.6 teaches a request of the same job shape
    and target (its process id is named), and nothing to one of another architecture or a stricter target."""
    from test_service_support import local_job, request_body, running_server

    def vs(resource: dict, cid: str) -> dict:
        return next(c for c in resource["VsDataContainer"] if c["id"] == cid)["attributes"]["vsData"]

    def proposal(srv, rid: str, job: dict, accuracy: float) -> tuple[int, list[str]]:
        body = request_body(rid, job, requirements={"performance": {"test_accuracy": accuracy}},
                            decided_by="negotiated")
        assert srv.http.put(srv.req(rid), json=body).status_code == 201
        neg = vs(srv.process_of(rid), "sluice-negotiation")
        assert neg["state"] == "PROPOSED"
        srv.patch(srv.req(rid), {"attributes": {"cancelRequest": True}})
        return neg["proposal"]["iterations"], [w for w in neg["rationale"] if w.startswith("iterations")]

    small, wide = local_job(200), {**local_job(200), "model": {"hidden": [48]}}
    with running_server(tmp_path, extra=("--set", "policy.default_iterations=77")) as srv:
        body = request_body("PAST", small, termination={"iterations": 200, "performance": {"test_accuracy": 0.6}},
                            decided_by="consumer")
        assert srv.http.put(srv.req("PAST"), json=body).status_code == 201
        srv.wait_status("PAST", ("FINISHED",), timeout=120)
        rep = vs(srv.get(srv.dn(srv.process_of("PAST")["attributes"]["trainingReportRef"])), "sluice-report")
        assert rep["cause"] == "CRITERION_MET"
        needed = rep["iterations"]
        n, why = proposal(srv, "SAME", small, 0.6)
        assert n == max(1, -(-3 * needed // 2)), why  # ⌈1.5 × needed⌉
        assert "PAST-1" in why[0] and "this job shape" in why[0], why
        n, why = proposal(srv, "LOOSER", small, 0.5)  # a run that passed 0.6 passed 0.5 on the way
        assert n == max(1, -(-3 * needed // 2)) and "PAST-1" in why[0], why
        n, why = proposal(srv, "WIDE", wide, 0.6)
        assert n == 77 and "PAST-1" not in why[0], why
        n, why = proposal(srv, "STRICT", small, 0.9)
        assert n == 77 and "no past run of this job shape reached test_accuracy ≥ 0.9" in why[0], why
