"""The ``filter`` query parameter (TS 28.532 GET, Jex conditions of TS 32.161): node paths with conditions on the
attributes of the node, and a 400 naming what is supported for anything else, never a silent empty answer."""

from __future__ import annotations

import pytest

from test_service_support import checked, request_body


@pytest.fixture(scope="module")
def srv(service):
    checked(service.http.put(service.req("FL1"), json=request_body("FL1", termination={"iterations": 1})), 201)
    checked(service.http.put(service.req("FL2"), json=request_body("FL2", termination={"iterations": 1},
                                                                    attributes={"cancelRequest": True})), 201)
    service.wait_status("FL1", ("FINISHED",))
    service.wait_status("FL2", ("CANCELLED",))
    return service


def _children(srv, flt: str, cls: str) -> list[dict]:
    tree = srv.get(srv.function, scopeType="BASE_NTH_LEVEL", scopeLevel=1, filter=flt)
    return tree.get(cls, [])


def ids(nodes: list[dict]) -> set[str]:
    return {n["id"] for n in nodes}


@pytest.mark.parametrize("flt", ['MLTrainingRequest[requestStatus="FINISHED"]',
                                 "MLTrainingRequest[attributes/requestStatus='FINISHED']",
                                 '//MLTrainingRequest[requestStatus = "FINISHED" and cancelRequest = false]'])
def test_a_condition_on_an_attribute_selects_the_nodes_that_meet_it(srv, flt):
    got = _children(srv, flt, "MLTrainingRequest")
    assert "FL1" in ids(got) and "FL2" not in ids(got)
    assert all(r["attributes"]["requestStatus"] == "FINISHED" for r in got)


def test_conditions_combine_and_compare(srv):
    either = _children(srv, 'MLTrainingRequest[requestStatus="FINISHED" or requestStatus="CANCELLED"]',
                       "MLTrainingRequest")
    assert {"FL1", "FL2"} <= ids(either)
    assert "FL1" not in ids(_children(srv, 'MLTrainingRequest[not(requestStatus="FINISHED")]', "MLTrainingRequest"))
    assert "FL2" in ids(_children(srv, 'MLTrainingRequest[requestStatus!="FINISHED"]', "MLTrainingRequest"))
    nested = _children(srv, 'MLTrainingProcess[progressStatus/status="CANCELLED"]', "MLTrainingProcess")
    assert "FL2-1" in ids(nested) and "FL1-1" not in ids(nested)
    assert "FL1-1" in ids(_children(srv, "MLTrainingProcess[priority>=0]", "MLTrainingProcess"))
    assert "FL1-1" not in ids(_children(srv, "MLTrainingProcess[priority>0]", "MLTrainingProcess"))
    # alternatives, and a node path with an id
    both = _children(srv, 'MLTrainingRequest=FL1 | MLTrainingProcess[progressStatus/status="CANCELLED"]',
                     "MLTrainingRequest")
    assert ids(both) == {"FL1"}


@pytest.mark.parametrize("flt, says", [
    ("Foo", "MLTrainingRequest"),
    ('MLTrainingRequest[nope="x"]', "requestStatus"),
    ('MLTrainingRequest[requestStatus="FINISHED"', "]"),
    ('MLTrainingRequest[requestStatus~"F"]', "="),
    ('MLTrainingRequest[requestStatus="FINISHED"]/MLTrainingProcess', "last node"),
])
def test_an_unsupported_filter_is_a_400_naming_what_is_supported(srv, flt, says):
    err = checked(srv.http.get(srv.function, params={"scopeType": "BASE_ALL", "filter": flt}), 400)
    assert err["badQueryParams"] == ["filter"] and says in err["reason"], err
