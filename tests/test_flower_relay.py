"""The worker's relay between the service and a Flower run's ServerApp, over connection pairs in this process (the
relay on a real federation: tests/test_service_federation.py): messages pass both ways unchanged; a service that
goes away hangs up on the ServerApp; a ServerApp gone without its report fails the process with the reason."""

from __future__ import annotations

import socket
import threading
from multiprocessing import Pipe

import pytest

from sluice.runtimes.flower.relay import FederationConfig, _serve, unreachable


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _relay() -> tuple:
    """(service end, ServerApp end, relay thread) around a running ``_serve``."""
    service, to_service = Pipe()
    to_app, app = Pipe()
    fed = FederationConfig(superlink=f"127.0.0.1:{_closed_port()}", insecure=True)
    t = threading.Thread(target=_serve, args=(to_service, to_app, fed, "edge", 7), daemon=True)
    t.start()
    return service, app, t


def test_messages_pass_both_ways_until_the_report() -> None:
    service, app, t = _relay()
    service.send({"cmd": "suspend", "token": 1})
    assert app.recv() == {"cmd": "suspend", "token": 1}
    for msg in ({"kind": "ack", "token": 1, "ok": True}, {"kind": "progress", "status": {"iterations": 1}},
                {"kind": "done", "report": {"cause": "CRITERION_MET"}, "model": b"\x00" * 10}):
        app.send(msg)
        assert service.recv() == msg
    t.join(10)
    assert not t.is_alive()  # the report was the last word


def test_a_service_that_goes_away_hangs_up_on_the_serverapp() -> None:
    service, app, t = _relay()
    service.close()
    assert app.poll(10)  # the ServerApp sees its connection end (and cancels its training)
    with pytest.raises(EOFError):
        app.recv()
    t.join(10)
    assert not t.is_alive()


def test_a_serverapp_gone_without_a_report_fails_the_process_with_the_reason() -> None:
    service, app, t = _relay()
    app.send({"kind": "progress", "status": {"iterations": 3}})
    assert service.recv()["kind"] == "progress"
    app.close()
    msg = service.recv()
    assert msg["kind"] == "failed" and not msg["before_training"]
    assert "federation 'edge'" in msg["error"] and "Flower run 7" in msg["error"]
    assert "cannot be reached" in msg["error"]  # the SuperLink is gone too
    t.join(10)


def test_a_superlink_is_reachable_or_says_why_not() -> None:
    fed = FederationConfig(superlink=f"127.0.0.1:{_closed_port()}", insecure=True)
    assert "cannot be reached" in unreachable(fed, timeout_s=5)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        assert unreachable(fed.model_copy(update={"superlink": f"127.0.0.1:{srv.getsockname()[1]}"})) is None
    with pytest.raises(ValueError, match="root_certificates"):
        FederationConfig(superlink="127.0.0.1:9092")


def test_data_amount_requirements_are_refused_on_flower_before_anything_starts(tmp_path) -> None:
    from rich.console import Console

    from sluice.control.params import Requirements
    from sluice.runtimes.flower.deploy import DeploymentError
    from sluice.runtimes.flower.engine import node_data_refusal
    from sluice.runtimes.flower.runner import FlowerOptions, run_on_flower
    from sluice.runtimes.jobs import load_job

    assert node_data_refusal(None) is None and node_data_refusal({"performance": {"test_accuracy": 0.9}}) is None
    assert node_data_refusal({"max_data_amount": 10}).startswith("requirements.max_data_amount: on a Flower")
    assert node_data_refusal(Requirements(min_data_amount=5)).startswith("requirements.min_data_amount")
    job = load_job("hfl", None, ["requirements.data_amount=100"])
    with pytest.raises(DeploymentError, match="requirements.data_amount: .*lives on the nodes"):
        run_on_flower(job, str(tmp_path / "run"), FlowerOptions(), console=Console())
    assert not (tmp_path / "run" / "flower").exists()  # no deployment was started
