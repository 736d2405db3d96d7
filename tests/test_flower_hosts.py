"""Flower on real hosts: the SuperLink certificate ``sluice certs`` makes, a run the SuperLink accepts but never
starts, and the recipe of docs/how-to/flower-hosts.md run as written across two network namespaces.

``test_real_hosts_recipe_runs_as_written`` runs the page's four blocks exactly as written, only the SuperLink's
address (``10.0.0.1``) and the run directory (``/srv/runs/r1``) replaced. The SuperLink's host is one network
namespace, the first client host and the submitting host the other; the second client host shares the
SuperLink's namespace (two SuperNodes cannot share one: each serves its ClientApps on 127.0.0.1:9094) and
reaches it at its address all the same. Every host has a directory of its own, with the environment's
executables on its ``PATH``; the copies of ``ca.pem`` (prose in the page) are done by the test.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from sluice.cli import main
from sluice.runtimes.flower.certs import make_certificates

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "how-to" / "flower-hosts.md"
THIS = f"tests/{Path(__file__).name}::test_real_hosts_recipe_runs_as_written"
HOSTS = ["SuperLink host", "SuperLink host", "client host c", "anywhere"]
TINY = ["data.num_clients=2", "train.participation=1.0", "model.hidden=[32]", "train.local_epochs=1",
        "train.rounds=1"]


def recipe() -> list[tuple[str, str]]:
    """``(host, code)`` of each block of the page that the recipe test covers, in order."""
    from test_docs_tutorials import blocks

    out = []
    for lang, code, _, cover in blocks(PAGE):
        if cover != THIS:
            continue
        assert lang == "bash", code
        m = re.fullmatch(r"# (.+)", code.splitlines()[0].strip())
        assert m, f"a block of the recipe starts with a comment naming its host: {code}"
        out.append((m.group(1), code))
    return out


def test_recipe_blocks_name_their_hosts_and_one_superlink_address() -> None:
    steps = recipe()
    assert [host for host, _ in steps] == HOSTS
    assert steps[0][1].splitlines()[1] == "sluice certs certs/ --host 10.0.0.1"  # no loopback names to remember
    assert "--host 0.0.0.0" in steps[1][1] and "flower-supernode --superlink 10.0.0.1:9092" in steps[2][1]
    assert "--superlink 10.0.0.1:9092" in steps[3][1] and "/srv/runs/r1" in steps[3][1]
    text = "\n".join(code for _, code in steps)
    assert "<" not in text and set(re.findall(r"\d+\.\d+\.\d+\.\d+", text)) <= {"10.0.0.1", "0.0.0.0"}


def _names(cert_path: Path) -> tuple[list[str], list[str]]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(ip) for ip in san.get_values_for_type(x509.IPAddress)], san.get_values_for_type(x509.DNSName)


def test_a_superlink_certificate_names_loopback_beside_its_hosts(tmp_path: Path) -> None:
    """The SuperLink's own executor connects at 127.0.0.1: ``sluice certs --host ADDR`` names it unasked."""
    from cryptography import x509

    certs = tmp_path / "certs"
    assert main(["certs", str(certs), "--host", "10.77.0.1", "--host", "link.example.org"]) == 0
    assert _names(certs / "server.pem") == (["10.77.0.1", "127.0.0.1"], ["link.example.org", "localhost"])
    # a certificate made without them (as before) is made again with them, signed by the CA the nodes trust
    old = tmp_path / "old"
    make_certificates(old, ["10.77.0.1"])
    ca = (old / "ca.pem").read_bytes()
    assert main(["certs", str(old), "--host", "10.77.0.1"]) == 0
    assert (old / "ca.pem").read_bytes() == ca
    assert _names(old / "server.pem") == (["10.77.0.1", "127.0.0.1"], ["localhost"])
    x509.load_pem_x509_certificate((old / "server.pem").read_bytes()).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca))


def _stopped(home: Path, run_id: int) -> str:
    from sluice.runtimes.flower.deploy import run_status

    return str(run_status(home, run_id).get("status", ""))


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.timeout(900)  # a SuperLink, two runs and five Flower CLI calls: minutes on a loaded machine
def test_a_run_the_superlink_never_starts_ends_with_engine_failure(tmp_path: Path, monkeypatch) -> None:
    """A SuperLink whose certificate does not name 127.0.0.1 accepts runs and never starts them (its executor
    cannot connect). Submitted from elsewhere, or followed on the SuperLink's host, the run ends after the start
    timeout with ``ENGINE_FAILURE``, the SuperLink's reason and the run stopped; nothing waits for ever."""
    from sluice.runtimes.flower import deploy
    from sluice.runtimes.flower.runner import FlowerOptions, follow, run_on_flower
    from sluice.runtimes.jobs import load_job

    monkeypatch.setattr(deploy, "make_certificates",
                        lambda out, hosts, **kw: make_certificates(out, ["localhost"], **kw))
    job = load_job("hfl", None, TINY)
    dep = deploy.LocalDeployment(tmp_path / "dep", nodes=0)
    console = Console(file=io.StringIO(), width=160)
    try:
        dep.start()
        assert dep.certs is not None
        deploy.write_connection(dep.home, "sluice", f"localhost:{dep.port}", dep.certs.ca)
        opts = FlowerOptions(superlink=f"localhost:{dep.port}", root_certificates=str(dep.certs.ca),
                             start_timeout_s=15.0)
        # submitted as to a SuperLink elsewhere: the reason from the run's status
        out = tmp_path / "remote"
        t0 = time.monotonic()
        assert run_on_flower(job, str(out), opts, console=console) == 9
        assert time.monotonic() - t0 < 150
        report = json.loads((out / "report.json").read_text())
        assert report["cause"] == "ENGINE_FAILURE", report
        assert "did not start it within 15 s (status pending)" in report["detail"], report["detail"]
        assert "127.0.0.1" in report["detail"]
        remote_id = int(re.search(r"Flower run (\d+)", report["detail"]).group(1))
        # followed beside the SuperLink this host started: the reason from its log
        out = tmp_path / "local"
        out.mkdir()
        sub = deploy.submit(job.dump(), out, tmp_path / "work", dep.home, run_config=opts.run_config())
        report = follow(job, out, dep, sub.run_id, console=console, opts=opts)
        assert report["cause"] == "ENGINE_FAILURE", report
        assert "certificate is not valid for '127.0.0.1'" in report["detail"], report["detail"]
        assert json.loads((out / "report.json").read_text())["cause"] == "ENGINE_FAILURE"
        for run_id in (remote_id, sub.run_id):  # stopped: they will not start later
            assert _stopped(dep.home, run_id).startswith("finished"), run_id
    finally:
        dep.stop()


# ---------------------------------------------------------------------------------------------------------
# the recipe across two network namespaces


def _wait_for(what: str, done, proc: subprocess.Popen, log: Path, timeout: float) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"{what}: the process ended ({proc.returncode}):\n{log.read_text()[-4000:]}")
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not after {timeout:g} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


@pytest.mark.flower
@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_hosts_recipe_runs_as_written(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and ip (iproute2)")
    from sluice.runtimes.flower.deploy import _kill_tree
    from sluice.transport.netns import NetnsPair, netns_available

    ok, why = netns_available()
    if not ok:
        pytest.skip(f"network namespaces are not usable here: {why}")
    steps = recipe()
    assert [host for host, _ in steps] == HOSTS
    link_home, client_homes = tmp_path / "superlink-host", [tmp_path / "client-host-0", tmp_path / "client-host-1"]
    run = tmp_path / "runs" / "r1"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "FLWR_"))}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    procs: list[subprocess.Popen] = []
    with NetnsPair(rate_mbit=1000, subnet="10.231.83") as net:
        certs, superlink, node, submit = (code.replace("10.0.0.1", net.addr_a).replace("/srv/runs/r1", str(run))
                                          for _, code in steps)

        def start(ns: str, home: Path, code: str, log: Path) -> subprocess.Popen:
            home.mkdir(exist_ok=True)
            with open(log, "w") as f:
                procs.append(subprocess.Popen(net.exec_in(ns) + ["bash", "-c", "set -euo pipefail\n" + code],
                                              cwd=home, env={**env, "FLWR_HOME": str(home / ".flwr")}, stdout=f,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            return procs[-1]

        try:
            logs = {name: tmp_path / f"{name}.log" for name in ("certs", "superlink", "node-0", "node-1", "submit")}
            p = start(net.ns_a, link_home, certs, logs["certs"])
            assert p.wait(120) == 0, logs["certs"].read_text()
            for home in client_homes:  # the page: copy ca.pem to every client host (and the submitting one)
                home.mkdir()
                shutil.copy(link_home / "certs" / "ca.pem", home / "ca.pem")
            p = start(net.ns_a, link_home, superlink, logs["superlink"])
            _wait_for("the SuperLink listens", lambda: "Uvicorn running on" in logs["superlink"].read_text(), p,
                      logs["superlink"], 120)
            for c, (ns, home) in enumerate(zip((net.ns_b, net.ns_a), client_homes, strict=True)):
                start(ns, home, f"c={c}; N=2\n{node}", logs[f"node-{c}"])  # the page: c and N set on each
            submitter = client_homes[0]
            (submitter / "job.toml").write_text(
                "[data]\nnum_clients = 2\n[train]\nrounds = 1\nparticipation = 1.0\nlocal_epochs = 1\n"
                "[model]\nhidden = [32]\n")
            p = start(net.ns_b, submitter, submit, logs["submit"])
            try:
                rc = p.wait(420)
            except subprocess.TimeoutExpired:
                pytest.fail("the run did not end:\n" + "\n".join(logs[n].read_text()[-3000:]
                                                                 for n in ("submit", "superlink")))
            assert rc == 0, logs["submit"].read_text()[-4000:] + logs["superlink"].read_text()[-3000:]
        finally:
            for p in reversed(procs):
                _kill_tree(p)
    report = json.loads((run / "report.json").read_text())
    assert report["cause"] == "CRITERION_MET" and report["iterations"] == 1, report
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.ns_a not in names and net.ns_b not in names
