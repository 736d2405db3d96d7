"""Benchmark: private set intersection (sluice.psi) over Sluice's gRPC link, against the bare library.

Each party holds N ids (random 16-character strings from a fixed seed), half of them shared. For each N,
side by side in one run:

(a) **bare**: ``openmined.psi`` in one process, client and server objects handing each other their
    serialised messages directly. Time = the whole protocol (request, setup message, response,
    intersection); bytes = the summed lengths of the three serialised messages.
(b) **Sluice**: :func:`sluice.psi.intersect` here (the split leader) against :func:`sluice.psi.serve` in a
    separate follower process, over :mod:`sluice.transport.grpc_link` with mutual TLS (certificates from
    :func:`sluice.runtimes.flower.certs.make_split_certificates`, as ``sluice certs DIR --follower ADDR`` makes them),
    each message framed with :func:`sluice.wire.tensor.encode_raw`. Time = the leader's ``intersect()`` wall
    time, from building its request to the result; bytes = what the leader's link counted, both directions
    (frames included; TLS records and HTTP/2 framing below the link are not counted). Process start-up and
    the TLS handshake (reported apart: ``connect()``, which waits until the channel is ready) are outside
    the time, and one small echo warms the stream before the first intersection.

Targets: Sluice / bare <= 1.2x in time and <= 1.1x in bytes. Sizes up to 100,000 ids run ``--repeats``
times (bare and Sluice back to back each time; medians reported), larger ones once. Both sides' results are
checked against the true intersection.

    .venv/bin/python bench/split_psi.py                              # 10k, 100k, 1M ids a party
    .venv/bin/python bench/split_psi.py --sizes 10000 --repeats 1    # smoke (seconds)

Writes ``bench/results/split_psi.md`` and ``.json`` (``split_psi_<sizes>`` for other ``--sizes``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import private_set_intersection.python as psi

from sluice.errors import WireError
from sluice.psi import intersect, serve
from sluice.transport.grpc_link import GrpcListener, TlsFiles, connect
from sluice.transport.link import Link
from sluice.wire.tensor import RawMsg, decode, encode_raw

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
SEED = 0
FPR = 1e-9
ID_CHARS = 16
REPEAT_UP_TO = 100_000
"""Sizes up to this run ``--repeats`` times, larger ones once."""
TIMEOUT_S = 3600.0
"""How long a side waits for its peer's next message (a 1,000,000-id setup takes minutes on shared cores)."""
ALPHABET = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
TARGET_TIME, TARGET_BYTES = 1.2, 1.1


def party_ids(n: int, seed: int = SEED) -> tuple[list[str], list[str], int]:
    """(leader's ids, follower's ids, common): n each, half shared, each side in its own random order."""
    common = n // 2
    rng = np.random.default_rng([seed, n])
    pool = ALPHABET[rng.integers(0, len(ALPHABET), size=(2 * n - common, ID_CHARS))]
    ids = [b.decode("ascii") for b in pool.view(f"S{ID_CHARS}").ravel().tolist()]
    if len(set(ids)) != len(ids):  # pragma: no cover - 62^16 ids: never at these sizes
        raise RuntimeError("duplicate random ids; change the seed")
    leader, follower = ids[:n], ids[n - common:]
    return [leader[i] for i in rng.permutation(n)], [follower[i] for i in rng.permutation(n)], common


class LinkChannel:
    """A :class:`sluice.psi.Channel` on a Sluice link: each message one raw frame."""

    def __init__(self, link: Link, timeout: float = TIMEOUT_S) -> None:
        self.link, self.timeout = link, timeout

    def send(self, data: bytes) -> None:
        self.link.send(encode_raw(data))

    def recv(self) -> bytes:
        msg = decode(self.link.recv(self.timeout))
        if not isinstance(msg, RawMsg):
            raise WireError(f"expected a raw frame on {self.link.name}, got {type(msg).__name__}")
        return msg.data


class ArrivalChannel(LinkChannel):
    """A :class:`LinkChannel` that notes the CPU time of its process when a message arrives (the follower's
    work on a request starts there; before it, it only waited)."""

    cpu_at_arrival = 0.0

    def recv(self) -> bytes:
        data = super().recv()
        self.cpu_at_arrival = time.process_time()
        return data


def bare(leader: list[str], follower: list[str]) -> dict[str, Any]:
    """The library alone, both sides in this process, messages handed over as serialised bytes."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    client = psi.client.CreateWithNewKey(True)
    server = psi.server.CreateWithNewKey(True)
    request = client.CreateRequest(leader).SerializeToString()
    req = psi.Request.FromString(request)
    setup = server.CreateSetupMessage(FPR, len(req.encrypted_elements), follower,
                                      psi.DataStructure.GCS).SerializeToString()
    response = server.ProcessRequest(req).SerializeToString()
    found = sorted(client.GetIntersection(psi.ServerSetup.FromString(setup), psi.Response.FromString(response)))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    sizes = {"request": len(request), "setup": len(setup), "response": len(response)}
    return {"seconds": seconds, "cpu_s": cpu, "bytes": sum(sizes.values()), "messages": sizes, "found": found}


# -- the follower process ------------------------------------------------------------------------------------
def follower_main(args: argparse.Namespace) -> int:
    """Listen with mutual TLS, answer ``--runs`` intersections, write the server's stats to ``--result``."""
    _, ids, _ = party_ids(args.size)
    certs = Path(args.certs)
    tls = TlsFiles(str(certs / "follower" / "follower.pem"), str(certs / "follower" / "follower.key"),
                   str(certs / "follower" / "ca.pem"))
    listener = GrpcListener("127.0.0.1:0", tls, name="follower")
    try:
        ready = Path(args.ready)
        ready.with_suffix(".tmp").write_text(listener.address)
        ready.with_suffix(".tmp").replace(ready)
        link = listener.accept(timeout=300.0)
        ch = ArrivalChannel(link)
        ch.send(ch.recv())  # echo: warms the stream
        runs = []
        for _ in range(args.runs):
            s = serve(ids, ch, fpr=FPR)
            runs.append({"seconds": s.seconds, "cpu_s": time.process_time() - ch.cpu_at_arrival,
                         "sent_bytes": s.sent_bytes, "received_bytes": s.received_bytes})
        ch.recv()  # the leader's goodbye: everything it needed has arrived
        Path(args.result).write_text(json.dumps({"runs": runs, "link": link.stats.as_dict(),
                                                 "secure": link.secure}))
        link.close()
    finally:
        listener.close()
    return 0


# -- the leader ----------------------------------------------------------------------------------------------
def start_follower(size: int, runs: int, tmp: Path) -> tuple[subprocess.Popen, str, Path]:
    ready, result = tmp / f"follower-{size}.addr", tmp / f"follower-{size}.json"
    log = open(tmp / f"follower-{size}.log", "w")  # noqa: SIM115 - the process holds it
    cmd = [sys.executable, __file__, "--follower", "--size", str(size), "--runs", str(runs),
           "--certs", str(tmp / "certs"), "--ready", str(ready), "--result", str(result)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    log.close()
    end = time.monotonic() + 300.0
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            proc.wait()
            tail = (tmp / f"follower-{size}.log").read_text()[-2000:]
            raise RuntimeError(f"the follower did not start listening:\n{tail}")
        time.sleep(0.05)
    return proc, ready.read_text().strip(), result


def measure(size: int, runs: int, tmp: Path) -> dict[str, Any]:
    """``runs`` pairs (bare, then Sluice against a follower process) at ``size`` ids a party."""
    leader, follower, common = party_ids(size)
    theirs = set(follower)
    truth = [i for i, x in enumerate(leader) if x in theirs]
    assert len(truth) == common
    proc, address, result = start_follower(size, runs, tmp)
    link = None
    try:
        certs = tmp / "certs" / "leader"
        tls = TlsFiles(str(certs / "leader.pem"), str(certs / "leader.key"), str(certs / "ca.pem"))
        t0 = time.perf_counter()
        link = connect(address, 60.0, tls, name="leader")
        handshake_s = time.perf_counter() - t0
        ch = LinkChannel(link)
        ch.send(b"warm-up")
        assert ch.recv() == b"warm-up"
        out: dict[str, Any] = {"size": size, "common": common, "runs": runs, "handshake_s": handshake_s,
                               "secure": link.secure, "bare": [], "sluice": []}
        for r in range(runs):
            b = bare(leader, follower)
            assert b.pop("found") == truth, "the bare library's intersection is wrong"
            out["bare"].append(b)
            before, cpu0 = link.stats.as_dict(), time.process_time()
            found, st = intersect(leader, ch, fpr=FPR)
            after, cpu = link.stats.as_dict(), time.process_time() - cpu0
            assert found == truth, "Sluice's intersection is wrong"
            out["sluice"].append({
                "seconds": st.seconds, "cpu_s": cpu, "psi_sent": st.sent_bytes, "psi_received": st.received_bytes,
                "link_sent": after["bytes_sent"] - before["bytes_sent"],
                "link_received": after["bytes_received"] - before["bytes_received"],
            })
            print(f"  {size:>9,} ids, run {r + 1}/{runs}: bare {b['seconds']:.2f} s, "
                  f"Sluice {st.seconds:.2f} s", flush=True)
        ch.send(b"bye")
        proc.wait(timeout=120)
        out["follower"] = json.loads(result.read_text())
        return out
    finally:
        if link is not None:
            link.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def summarise(m: dict[str, Any]) -> dict[str, Any]:
    """Medians over the runs, and the ratios Sluice / bare against their targets."""
    med = statistics.median
    bare_s = med(b["seconds"] for b in m["bare"])
    bare_b = med(b["bytes"] for b in m["bare"])
    sl_s = med(s["seconds"] for s in m["sluice"])
    sl_b = med(s["link_sent"] + s["link_received"] for s in m["sluice"])
    bare_cpu = med(b["cpu_s"] for b in m["bare"])
    sl_cpu = med(s["cpu_s"] + f["cpu_s"] for s, f in zip(m["sluice"], m["follower"]["runs"], strict=True))
    return {
        "size": m["size"], "common": m["common"], "runs": m["runs"],
        "bare_s": bare_s, "sluice_s": sl_s, "time_ratio": sl_s / bare_s, "time_met": sl_s / bare_s <= TARGET_TIME,
        "bare_bytes": bare_b, "sluice_bytes": sl_b, "bytes_ratio": sl_b / bare_b,
        "bytes_met": sl_b / bare_b <= TARGET_BYTES, "handshake_s": m["handshake_s"],
        "bare_cpu_s": bare_cpu, "sluice_cpu_s": sl_cpu, "cpu_ratio": sl_cpu / bare_cpu,
        "server_s": med(r["seconds"] for r in m["follower"]["runs"]),
        "messages": m["bare"][0]["messages"],
    }


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# Private set intersection: Sluice over gRPC with mutual TLS, against the bare library",
        "",
        f"Measured on {res['machine']} ({res['date']}), `{res['command']}`; load average "
        f"{res['load_before']} before, {res['load_after']} after.",
        "",
        f"ECDH-PSI of `openmined.psi` {res['library']} (P-256, GCS setup, fpr {FPR:g}), ids of {ID_CHARS} "
        "random characters, half of each party's ids shared. Bare: client and server in one process, time of "
        "the whole protocol, bytes = the three serialised messages. Sluice: `intersect()` here against "
        "`serve()` in a follower process over the gRPC link with mutual TLS; time = `intersect()` (the "
        "follower's work included, the TLS handshake not), bytes = the link's count both ways (Sluice frames "
        "included, TLS and HTTP/2 framing not). CPU: seconds of CPU of the bare process, against those of the "
        "leader's process during `intersect()` plus the follower's from the request's arrival to its answer "
        "(all threads, gRPC's included): the check that does not depend on the machine's load. Medians over "
        "the runs; targets: time <= 1.2x, bytes <= 1.1x.",
        "",
        "| ids a party | common | runs | bare time | Sluice time | time Sluice/bare | bare bytes | Sluice bytes "
        "| bytes Sluice/bare | CPU bare / Sluice | CPU Sluice/bare | TLS connect |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in res["summary"]:
        lines.append(
            f"| {s['size']:,} | {s['common']:,} | {s['runs']} | {s['bare_s']:.2f} s | {s['sluice_s']:.2f} s | "
            f"**{s['time_ratio']:.3f}x** ({'met' if s['time_met'] else 'not met'}) | {s['bare_bytes']:,.0f} | "
            f"{s['sluice_bytes']:,.0f} | **{s['bytes_ratio']:.5f}x** ({'met' if s['bytes_met'] else 'not met'}) "
            f"| {s['bare_cpu_s']:.2f} s / {s['sluice_cpu_s']:.2f} s | {s['cpu_ratio']:.3f}x "
            f"| {1000 * s['handshake_s']:.0f} ms |"
        )
    lines += ["", "Bytes per message (bare; Sluice adds a 7-byte frame to each):", "",
              "| ids a party | request | setup (GCS) | response | setup bytes an id |", "|---|---|---|---|---|"]
    for s in res["summary"]:
        m = s["messages"]
        lines.append(f"| {s['size']:,} | {m['request']:,} | {m['setup']:,} | {m['response']:,} | "
                     f"{m['setup'] / s['size']:.2f} |")
    lines += ["", "Per-run numbers (the follower's own time from the request's arrival to its answer, link "
              "counters of both ends): `split_psi.json`.", ""]
    return "\n".join(lines)


def leader_main(args: argparse.Namespace) -> int:
    from sluice.runtimes.flower.certs import make_split_certificates

    sizes = [int(x) for x in args.sizes.split(",")]
    res: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "library": psi.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": "python bench/split_psi.py" + ("" if args.sizes == ",".join(map(str, DEFAULT_SIZES))
                                                  else f" --sizes {args.sizes}")
        + ("" if args.repeats == 3 else f" --repeats {args.repeats}"),
        "load_before": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="sluice-psi-") as tmp:
        make_split_certificates(Path(tmp) / "certs", {"follower": ["127.0.0.1"]}, leader="leader")
        for size in sizes:
            runs = args.repeats if size <= REPEAT_UP_TO else 1
            res["runs"].append(measure(size, runs, Path(tmp)))
            s = summarise(res["runs"][-1])
            print(f"{size:,} ids: time {s['time_ratio']:.3f}x, bytes {s['bytes_ratio']:.5f}x, "
                  f"CPU {s['cpu_ratio']:.3f}x, "
                  f"TLS connect {1000 * s['handshake_s']:.0f} ms", flush=True)
    res["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    res["summary"] = [summarise(m) for m in res["runs"]]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    default = sizes == list(DEFAULT_SIZES)
    name = "split_psi" if default else "split_psi_" + "_".join(map(str, sizes))
    (out / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown(res))
    print(f"wrote {out / name}.json and .md")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="ids a party, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help=f"runs of each size up to {REPEAT_UP_TO:,} ids")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--follower", action="store_true", help=argparse.SUPPRESS)
    for opt in ("--size", "--runs"):
        ap.add_argument(opt, type=int, help=argparse.SUPPRESS)
    for opt in ("--certs", "--ready", "--result"):
        ap.add_argument(opt, help=argparse.SUPPRESS)
    args = ap.parse_args()
    return follower_main(args) if args.follower else leader_main(args)


if __name__ == "__main__":
    sys.exit(main())
