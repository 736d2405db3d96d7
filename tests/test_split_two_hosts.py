"""The two-host recipe of docs/tutorials/split-two-hosts.md, and the certificates ``sluice certs`` makes for it.

``test_two_host_recipe_runs_as_written`` runs the tutorial's two-host blocks exactly as written (only the
follower's address, ``FOLLOWER=...``, is replaced) across two network namespaces joined by a veth pair:
"host A" (the leader) in one, "host B" (the follower) in the other, each in a directory of its own. Each
host's blocks run in one bash session, in the order of the page, as a reader would type them; the copy of
``pki/follower/`` to host B (prose in the tutorial, ``scp`` in real life) is done by the test.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sluice.cli import main
from sluice.errors import ConfigError, TransportError

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tutorials" / "split-two-hosts.md"
THIS = f"tests/{Path(__file__).name}::test_two_host_recipe_runs_as_written"
ADDRESS = re.compile(r"^FOLLOWER=\S+", re.M)


def recipe() -> list[tuple[str, str]]:
    """``(host, code)`` of each block of the page that this test covers, in order; host is "A" or "B"."""
    from test_docs_tutorials import blocks

    out = []
    for lang, code, _, cover in blocks(PAGE):
        if cover != THIS:
            continue
        assert lang == "bash", code
        first = code.splitlines()[0].strip()
        m = re.fullmatch(r"# host ([AB])", first)
        assert m, f"a two-host block starts with '# host A' or '# host B': {code}"
        out.append((m.group(1), code))
    return out


def test_recipe_blocks_are_tagged_and_name_the_example_configs() -> None:
    steps = recipe()
    assert [host for host, _ in steps] == ["A", "B", "A", "A"]
    text = "\n".join(code for _, code in steps)
    assert len(ADDRESS.findall(steps[0][1])) == 1  # the one address the test replaces
    assert "sluice certs pki --follower" in steps[0][1]
    assert "--role follower" in steps[1][1] and "examples/split_party_follower.toml" in steps[1][1]
    assert "--role leader" in steps[2][1] and "examples/split_party_leader.toml" in steps[2][1]
    assert "split_party_follower.toml" not in steps[2][1]  # the leader never reuses the follower's config
    assert "<" not in text  # no placeholders left for the reader to fill in


# ---------------------------------------------------------------------------------------------------------
# the certificates of each role


def _eku(cert):  # noqa: ANN001, ANN202
    from cryptography import x509

    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_split_certificates_fit_each_role(tmp_path: Path) -> None:
    import stat

    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from sluice.transport.grpc_link import GrpcListener, TlsFiles, connect

    pki = tmp_path / "pki"
    assert main(["certs", str(pki), "--follower", "127.0.0.1,follower.example.org"]) == 0
    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    assert stat.S_IMODE((pki / "ca.key").stat().st_mode) == 0o600
    assert sorted(p.name for p in (pki / "follower").iterdir()) == ["ca.pem", "follower.key", "follower.pem"]
    assert sorted(p.name for p in (pki / "leader").iterdir()) == ["ca.pem", "leader.key", "leader.pem"]
    follower = x509.load_pem_x509_certificate((pki / "follower" / "follower.pem").read_bytes())
    leader = x509.load_pem_x509_certificate((pki / "leader" / "leader.pem").read_bytes())
    for cert in (follower, leader):
        cert.verify_directly_issued_by(ca)
    assert _eku(follower) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert _eku(leader) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    san = follower.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["follower.example.org"]
    assert stat.S_IMODE((pki / "follower" / "follower.key").stat().st_mode) == 0o600

    # mutual TLS as the example configs set it up: the follower listens, the leader connects
    f, ldr = pki / "follower", pki / "leader"
    lis = GrpcListener("127.0.0.1:0", TlsFiles(str(f / "follower.pem"), str(f / "follower.key"), str(f / "ca.pem")))
    try:
        c = connect(lis.address, 10.0, TlsFiles(str(ldr / "leader.pem"), str(ldr / "leader.key"), str(ldr / "ca.pem")))
        s = lis.accept(10.0)
        c.send(b"hello")
        assert s.recv(10) == b"hello" and s.secure and c.secure
        c.close()
        s.close()
        # the issue: a leader presenting the follower's server certificate is refused
        with pytest.raises(TransportError, match="could not connect"):
            connect(lis.address, 1.0, TlsFiles(str(f / "follower.pem"), str(f / "follower.key"), str(f / "ca.pem")))
    finally:
        lis.close(0.5)


def test_a_leader_with_the_followers_certificate_is_told_why(tmp_path: Path) -> None:
    """The issue's mistake: a leader run with the follower's config presents the follower's server certificate;
    its error says so, not only that it could not connect."""
    from sluice.split.config import SplitConfig
    from sluice.split.links import connect_followers
    from sluice.transport.grpc_link import GrpcListener, TlsFiles

    pki = tmp_path / "pki"
    assert main(["certs", str(pki), "--follower", "127.0.0.1"]) == 0
    f = pki / "follower"
    files = {"cert": str(f / "follower.pem"), "key": str(f / "follower.key"), "ca": str(f / "ca.pem")}
    lis = GrpcListener("127.0.0.1:0", TlsFiles(files["cert"], files["key"], files["ca"]))
    try:
        cfg = SplitConfig.model_validate({"transport": {"connect_timeout_s": 2.0, "tls": {"enabled": True, **files}}})
        with pytest.raises(TransportError, match=r"could not connect.*follower\.pem is not a client certificate"):
            connect_followers(cfg, ["follower-1"], [lis.address])
        leader = pki / "leader"  # its own client certificate: no such word
        cfg = SplitConfig.model_validate({"transport": {"connect_timeout_s": 10.0, "tls": {
            "enabled": True, "cert": str(leader / "leader.pem"), "key": str(leader / "leader.key"),
            "ca": str(leader / "ca.pem")}}})
        links = connect_followers(cfg, ["follower-1"], [lis.address])
        links["follower-1"].close()
    finally:
        lis.close(0.5)


def test_the_readme_shows_no_cross_host_command_of_its_own() -> None:
    """The README links to the two-host recipes instead of giving its own: any command of it for another host
    (a split party, certificates, a SuperLink or SuperNode) must be a line of a recipe run as written here or in
    tests/test_flower_hosts.py, so that copied from the README it works too."""
    from test_flower_hosts import recipe as flower_recipe

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tested = {line.strip() for _, code in recipe() + flower_recipe() for line in code.splitlines()}
    shown = [line.strip() for block in re.findall(r"^```(?:bash|sh|console)\n(.*?)^```", readme, re.S | re.M)
             for line in block.splitlines()
             if re.search(r"split party|sluice certs|superlink|flower-super", line, re.I)]
    assert [line for line in shown if line not in tested] == []
    assert "docs/tutorials/split-two-hosts.md" in readme and "docs/how-to/flower-hosts.md" in readme


def test_split_certificates_keep_the_ca_and_name_several_followers(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert main(["certs", str(pki), "--follower", "10.0.0.2"]) == 0
    ca = (pki / "ca.pem").read_bytes()
    assert main(["certs", str(pki), "--follower", "b=10.0.0.2", "--follower", "c=10.0.0.3",
                 "--leader", "lab"]) == 0
    assert (pki / "ca.pem").read_bytes() == ca  # parties made before keep working
    for name in ("b", "c", "lab"):
        assert (pki / name / f"{name}.pem").exists() and (pki / name / "ca.pem").read_bytes() == ca
    assert main(["certs", str(pki), "--follower", "10.0.0.2", "--force"]) == 0
    assert (pki / "ca.pem").read_bytes() != ca


@pytest.mark.parametrize("argv", [
    ["--leader", "lab"],                                  # no follower
    ["--follower", "10.0.0.2", "--follower", "10.0.0.3"],  # several followers, unnamed
    ["--follower", "leader=10.0.0.2"],                    # two parties with one name
    ["--follower", "ca=10.0.0.2"],                        # the CA's files
    ["--follower", "b=bad host"],
    ["--follower", "b="],
    ["--follower", "10.0.0.2", "--host", "10.0.0.1"],     # Flower's and split's certificates mixed
])
def test_split_certificate_mistakes_are_clear_errors(tmp_path: Path, argv: list[str], capsys) -> None:
    assert main(["certs", str(tmp_path / "pki"), *argv]) == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "pki").exists()  # nothing is made half-way


def test_split_certificates_need_a_follower(tmp_path: Path) -> None:
    from sluice.runtimes.flower.certs import make_split_certificates

    with pytest.raises(ConfigError):
        make_split_certificates(tmp_path / "x", {})


# ---------------------------------------------------------------------------------------------------------
# the recipe across two network namespaces


def _stop(proc: subprocess.Popen | None) -> None:
    """End ``proc`` and everything it started (it leads its own session)."""
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(10)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait(what: str, done, procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not done():
        for p, log in zip(procs, logs, strict=True):
            if p.poll() is not None:
                raise AssertionError(f"{what}: a host's session ended ({p.returncode}):\n{log.read_text()[-4000:]}")
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not after {timeout:g} s:\n" + "\n".join(log.read_text()[-3000:]
                                                                                for log in logs))
        time.sleep(0.2)


def need_netns() -> None:
    """Skip the calling test where network namespaces cannot be made (not root, no iproute2)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and ip (iproute2)")
    from sluice.transport.netns import netns_available

    ok, why = netns_available()
    if not ok:
        pytest.skip(f"network namespaces are not usable here: {why}")


def host_homes(tmp_path: Path) -> dict[str, Path]:
    """A directory per host, "A" and "B", each with the checkout's .venv, examples and src linked in."""
    homes = {h: tmp_path / f"host{h}" for h in "AB"}
    for home in homes.values():
        home.mkdir()
        for name in (".venv", "examples", "src"):
            (home / name).symlink_to(ROOT / name)
    return homes


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_host_recipe_runs_as_written(tmp_path: Path) -> None:
    need_netns()
    from sluice.transport.netns import NetnsPair

    steps = recipe()
    assert [host for host, _ in steps] == ["A", "B", "A", "A"]
    sync = tmp_path / "sync"
    sync.mkdir()
    homes = host_homes(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}

    with NetnsPair(rate_mbit=100, subnet="10.231.81") as net:
        # host A's session: the certificates, then (once host B's follower listens) the leader and the report
        certs, leader, report = (code for host, code in steps if host == "A")
        certs, n = ADDRESS.subn(f"FOLLOWER={net.addr_b}", certs)
        assert n == 1
        host_a = "\n".join([
            "set -euo pipefail", certs, f"touch {sync}/certs-made",
            f"while [ ! -e {sync}/follower-up ]; do sleep 0.2; done", leader, report, "",
        ])
        host_b = "set -euo pipefail\n" + steps[1][1]
        logs = {h: tmp_path / f"host{h}.log" for h in homes}
        procs: dict[str, subprocess.Popen] = {}
        try:
            with open(logs["A"], "w") as out:
                procs["A"] = subprocess.Popen(net.exec_in(net.ns_a) + ["bash", "-c", host_a], cwd=homes["A"],
                                              env=env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True)
            _wait("host A makes the certificates", (sync / "certs-made").exists, [procs["A"]], [logs["A"]], 120)
            # step 2 of the tutorial: copy pki/follower/ to host B as certs/
            shutil.copytree(homes["A"] / "pki" / "follower", homes["B"] / "certs")
            assert not (homes["B"] / "certs" / "ca.key").exists()
            with open(logs["B"], "w") as out:
                procs["B"] = subprocess.Popen(net.exec_in(net.ns_b) + ["bash", "-c", host_b], cwd=homes["B"],
                                              env=env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True)
            _wait("host B's follower listens", lambda: "listening on" in logs["B"].read_text(),
                  [procs["A"], procs["B"]], [logs["A"], logs["B"]], 180)
            (sync / "follower-up").touch()
            try:
                rc_a = procs["A"].wait(600)
                rc_b = procs["B"].wait(60)
            except subprocess.TimeoutExpired:
                pytest.fail("the two-host run did not end:\n" + logs["A"].read_text()[-4000:]
                            + logs["B"].read_text()[-4000:])
        finally:
            for proc in procs.values():
                _stop(proc)
        text_a, text_b = logs["A"].read_text(), logs["B"].read_text()
        assert rc_a == 0, text_a[-6000:] + "\n--- host B ---\n" + text_b[-3000:]
        assert rc_b == 0, text_b[-4000:]
    run = homes["A"] / "runs" / "split-two-hosts"
    rep = json.loads((run / "report.json").read_text())
    assert rep["cause"] == "CRITERION_MET" and rep["iterations"] > 0
    assert "leader connected" in text_b and "done:" in text_b
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.ns_a not in names and net.ns_b not in names
