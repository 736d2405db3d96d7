"""gRPC across two network namespaces joined by a veth pair shaped with tc tbf (root only)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from sluice.transport.netns import NetnsPair, netns_available

pytestmark = pytest.mark.netns

_OK, _WHY = netns_available()

SERVER = """
import sys
from sluice.transport.grpc_link import GrpcListener
lis = GrpcListener(sys.argv[1])
print(lis.address, flush=True)
link = lis.accept(20)
total = 0
while total < int(sys.argv[2]):
    total += len(link.recv(20))
link.send(str(total).encode())
import time; time.sleep(0.5)
lis.close(0.5)
"""


@pytest.mark.skipif(not _OK, reason=f"network namespaces are not usable here: {_WHY}")
def test_grpc_through_a_tbf_shaped_veth_pair():
    nbytes = 2_500_000
    with NetnsPair(rate_mbit=100, burst="16kb", subnet="10.231.79") as net:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert net.ns_a in names and net.ns_b in names
        srv = subprocess.Popen(
            net.exec_in(net.ns_b) + [sys.executable, "-c", SERVER, f"{net.addr_b}:50600", str(nbytes)],
            stdout=subprocess.PIPE, text=True,
        )
        try:
            assert srv.stdout is not None
            srv.stdout.readline()
            # this process is outside both namespaces: reach ns_b from ns_a through a child
            client = f"""
import time
from sluice.transport.grpc_link import connect
c = connect("{net.addr_b}:50600", 10)
t0 = time.perf_counter()
for _ in range(10):
    c.send(bytes({nbytes // 10}))
print(c.recv(30).decode(), time.perf_counter() - t0)
c.close()
"""
            out = subprocess.run(net.exec_in(net.ns_a) + [sys.executable, "-c", client], capture_output=True,
                                 text=True, timeout=60)
            total, seconds = out.stdout.split()
            assert int(total) == nbytes
            mbit = nbytes * 8 / float(seconds) / 1e6
            assert 50 < mbit < 110  # shaped to 100 Mbit/s
        finally:
            srv.kill()
            srv.wait(10)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.ns_a not in names and net.ns_b not in names


def test_netns_failure_is_cleaned_up(monkeypatch):
    if not _OK:
        pytest.skip(f"network namespaces are not usable here: {_WHY}")
    pair = NetnsPair(rate_mbit=100, burst="not-a-size", subnet="10.231.80")
    from sluice.errors import TransportError

    with pytest.raises(TransportError, match="tbf|burst|failed"):
        pair.up()
    time.sleep(0.05)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert pair.ns_a not in names and pair.ns_b not in names
