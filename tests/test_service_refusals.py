"""Requests the job's engine cannot honour are refused before training, with what the engine reports: a metric
it does not report, a threshold outside the metric's range, a model type the job does not train. Never a 500,
never a worker that starts and fails with ENGINE_FAILURE."""

from __future__ import annotations

import contextlib

import pytest

from test_service_support import checked, local_job, request_body

REPORTED = "test_accuracy"  # one of the metrics the digits MLP reports


def _refused(srv, rid: str, body: dict, bad: str) -> dict:
    err = checked(srv.http.put(srv.req(rid), json=body), 400)
    assert bad in err["badAttributes"], err
    checked(srv.http.get(srv.req(rid)), 404)  # nothing was created
    return err


def test_a_3gpp_metric_the_engine_does_not_report_is_refused_with_what_it_reports(service):
    body = request_body("R500", attributes={"performanceRequirements": [
        {"performanceMetric": "RMSE", "performanceScore": 0.05}]})
    body["VsDataContainer"] = body["VsDataContainer"][:1]  # the producer decides the termination parameters
    err = _refused(service, "R500", body, "performanceRequirements")
    assert "RMSE" in err["reason"] and REPORTED in err["reason"] and "train_loss" in err["reason"]


def test_a_3gpp_metric_name_is_matched_without_regard_to_case(service):
    body = request_body("R501", attributes={"performanceRequirements": [
        {"performanceMetric": "Accuracy", "performanceScore": 0.1}]})
    body["VsDataContainer"] = body["VsDataContainer"][:1]
    got = checked(service.http.put(service.req("R501"), json=body), 201)
    assert got["attributes"]["performanceRequirements"][0]["performanceMetric"] == "Accuracy"
    service.wait_status("R501", ("FINISHED",))
    proc = service.process_of("R501")
    req = next(c for c in proc["VsDataContainer"] if c["id"] == "sluice-requirements")["attributes"]["vsData"]
    assert req["performance"] == {"test_accuracy": 0.1}


@pytest.mark.parametrize("where", ["termination", "requirements", "sluice-requirements"])
def test_an_unreported_metric_in_any_part_of_the_job_is_refused(service, where):
    if where == "termination":
        body = request_body("R502", termination={"iterations": 3, "performance": {"test_rmse": 0.1}})
        bad = "VsDataContainer/sluice-termination"
    elif where == "requirements":
        body = request_body("R502", termination={"iterations": 3}, attributes={"performanceRequirements": [
            {"performanceMetric": "mae", "performanceScore": 0.1}]})
        bad = "performanceRequirements"
    else:
        body = request_body("R502", termination={"iterations": 3}, requirements={"performance": {"nope": 0.5}})
        bad = "VsDataContainer/sluice-requirements"
    err = _refused(service, "R502", body, bad)
    assert REPORTED in err["reason"]


@pytest.mark.parametrize("decided_by", ["consumer", "producer"])
def test_a_threshold_out_of_range_is_refused_up_front(service, decided_by):
    term = {"iterations": 3} if decided_by == "consumer" else None
    body = request_body("R503", termination=term, attributes={"performanceRequirements": [
        {"performanceMetric": "accuracy", "performanceScore": 1.01}]})
    err = _refused(service, "R503", body, "performanceRequirements")
    assert "1.01" in err["reason"]
    body = request_body("R503", termination={"iterations": 3, "performance": {"accuracy": 1.5}})
    _refused(service, "R503", body, "VsDataContainer/sluice-termination")


def test_a_model_type_the_job_does_not_train_is_refused(service):
    body = request_body("R504", attributes={"aIMLInferenceName": "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS"})
    body["VsDataContainer"] = body["VsDataContainer"][:1]
    err = _refused(service, "R504", body, "aIMLInferenceName")
    assert "coverage_error" in err["reason"] and REPORTED in err["reason"]
    # a scenario job trains its scenario's type: another one is refused too
    job = {"engine": "local", "seed": 0, "data": {"dataset": "coverage"}, "train": {"iterations": 2}}
    body = request_body("R504", job, termination={"iterations": 1},
                        attributes={"aIMLInferenceName": "MDA_ASSISTED_ENERGY_SAVING_ENERGY_SAVING_ANALYSIS"})
    _refused(service, "R504", body, "aIMLInferenceName")


def test_a_scenario_job_is_accepted_with_the_type_it_trains(service):
    """The type a scenario's task declares ("coverage problem analysis") is the job's own 3GPP type."""
    job = {"engine": "local", "seed": 0, "data": {"dataset": "coverage"}, "train": {"iterations": 2}}
    for rid, attrs in (("R506", {}), ("R507", {"aIMLInferenceName": "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS"})):
        checked(service.http.put(service.req(rid), json=request_body(rid, job, termination={"iterations": 1},
                                                                      attributes=attrs)), 201)
        service.wait_status(rid, ("FINISHED",), timeout=120)


def test_a_change_to_an_unreported_metric_is_refused_and_the_request_kept(service):
    body = request_body("R505", local_job(), termination={"iterations": 3})
    checked(service.http.put(service.req("R505"), json=body), 201)
    patch = {"attributes": {"performanceRequirements": [{"performanceMetric": "RMSE", "performanceScore": 0.1}]}}
    err = service.patch(service.req("R505"), patch, 400)
    assert "performanceRequirements" in err["badAttributes"] and REPORTED in err["reason"]
    service.wait_status("R505", ("FINISHED",))


def test_the_worker_refuses_parameters_its_engine_cannot_honour(tmp_path):
    """The last line of defence (a job whose engine could not be asked before, such as a chain): the worker
    refuses before training, with the refusal's reason, not as an engine failure."""
    import multiprocessing

    from sluice.runtimes.remote import run_steered as worker_main

    spec = {"process": "P", "kind": "local", "raw": {**{k: v for k, v in local_job().items() if k != "engine"}},
            "termination": {"iterations": 2, "performance": {"test_rmse": 0.1}}, "requirements": None,
            "uploads": [], "work_dir": str(tmp_path)}
    parent, child = multiprocessing.Pipe()
    worker_main(spec, child)
    msgs = []
    with contextlib.suppress(EOFError):  # the worker closed its end after its last message
        while parent.poll(0):
            msgs.append(parent.recv())
    (msg,) = [m for m in msgs if m["kind"] in ("failed", "refused", "done")]
    assert msg["kind"] == "refused" and "test_rmse" in msg["error"] and REPORTED in msg["error"]
