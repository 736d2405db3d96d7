"""Benchmark: the management service (``sluice serve``) under load, and what monitoring through it costs.

One service runs on a loopback port with a fresh SQLite file (``max_concurrent = 2``), a notification
receiver subscribed to everything.

1. **Concurrent reads.** While a process trains, 200 GETs of that ``MLTrainingProcess`` are sent at once
   (one asyncio client, 200 connections), three times: p50 / p99 / max latency and the count of non-200s.
2. **A queue of 50.** 50 small requests (local engine, digits, 2 iterations) are created at once; every one
   must end in a terminal ``requestStatus`` with an ``MLTrainingReport``. Wall time until the last ends.
3. **Notification latency.** For every notification the receiver got during (2): receipt time − the
   ``eventTime`` the producer stamped when it committed the change (same host, same clock): p50 / p99.
4. **Create → first iteration.** ``--starts`` requests of the default job (no ``sluice-job``: the producer's
   default engine and its defaults, the producer's termination parameters), one after the other on the
   warm service: the seconds from sending the PUT until the ``MLTrainingProcess`` shows its first iteration
   (``sluice-status`` iterations ≥ 1; read every 10 ms). The first request is sent as soon as the service
   answers (its forkserver may still be loading) and is reported apart. Target: median < 3 s.
5. **Monitoring cost.** The same horizontal-FL job (digits, 20 clients, ``--rounds`` rounds) run by
   ``sluice run`` and as a request through the service, alternately, ``--repeats`` times each. Per
   iteration = the report's active training time / iterations (the same definition on both sides, from
   ``report.json`` and from the ``sluice-report`` of the ``MLTrainingReport``). Ratio = median service /
   median CLI; the target is ≤ 1.05.

    .venv/bin/python bench/service.py             # full
    .venv/bin/python bench/service.py --quick     # 10 queued requests, 1 repeat of 10 rounds (smoke)
    .venv/bin/python bench/service.py --parts first_iteration --out /tmp/x   # one part only

Writes ``bench/results/service.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_service_support import Receiver, start_server, stop_server  # noqa: E402

PARTS = ("reads", "queue", "first_iteration", "cost")
HFL = {"data": {"dataset": "digits", "num_clients": 20}, "train": {"participation": 0.25}}


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    if not ys:
        return float("nan")
    k = min(len(ys) - 1, max(0, int(round(q / 100 * (len(ys) - 1)))))
    return ys[k]


def body(rid: str, job: dict[str, Any], iterations: int) -> dict[str, Any]:
    return {"id": rid, "attributes": {}, "VsDataContainer": [
        {"id": "sluice-job", "attributes": {"vsData": job}},
        {"id": "sluice-termination", "attributes": {"vsData": {"iterations": iterations}}}]}


def vs(res: dict[str, Any], cid: str) -> Any:
    return next(c for c in res.get("VsDataContainer", []) if c["id"] == cid)["attributes"]["vsData"]


def wait_ended(srv: Any, rid: str, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        r = srv.http.get(srv.req(rid)).json()
        if r["attributes"]["requestStatus"] in ("FINISHED", "CANCELLED"):
            return r
        time.sleep(0.2)
    raise TimeoutError(f"{rid} did not end in {timeout} s")


async def burst(url: str, n: int) -> tuple[list[float], int]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:
        async def one() -> tuple[float, int]:
            t = time.perf_counter()
            try:
                r = await client.get(url)
                code = r.status_code
            except httpx.HTTPError:
                code = 0
            return time.perf_counter() - t, code

        got = await asyncio.gather(*(one() for _ in range(n)))
    return [g[0] for g in got], sum(1 for g in got if g[1] != 200)


def concurrent_reads(srv: Any, rounds: int) -> dict[str, Any]:
    srv.http.put(srv.req("READS"), json=body("READS", {"engine": "hfl", **HFL}, 100000))
    uri = srv.proc_uri("READS-1")
    t0 = time.monotonic()
    while srv.http.get(uri).json()["attributes"]["progressStatus"]["status"] != "RUNNING":
        if time.monotonic() - t0 > 120:
            raise TimeoutError("the process did not start")
        time.sleep(0.2)
    lat: list[float] = []
    failed = 0
    for _ in range(rounds):
        xs, bad = asyncio.run(burst(uri, 200))
        lat += xs
        failed += bad
    still = srv.http.get(uri).json()["attributes"]["progressStatus"]["status"]
    srv.http.patch(srv.req("READS"), json={"attributes": {"cancelRequest": True}},
                   headers={"Content-Type": "application/merge-patch+json"})
    wait_ended(srv, "READS", 120)
    return {"requests": len(lat), "concurrency": 200, "failed": failed, "p50_ms": pct(lat, 50) * 1e3,
            "p99_ms": pct(lat, 99) * 1e3, "max_ms": max(lat) * 1e3, "process_status_during": still}


def queue(srv: Any, rec: Receiver, n: int) -> dict[str, Any]:
    job = {"engine": "local", "train": {"batch_size": 64}, "model": {"hidden": [16]}}
    first = len(rec.got)
    t0 = time.time()
    codes: list[int] = []

    def put(i: int) -> None:
        codes.append(srv.http.put(srv.req(f"Q{i}"), json=body(f"Q{i}", job, 2)).status_code)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses, reports = {}, 0
    for i in range(n):
        r = wait_ended(srv, f"Q{i}", 1800)
        statuses[r["attributes"]["requestStatus"]] = statuses.get(r["attributes"]["requestStatus"], 0) + 1
        rep = srv.http.get(srv.proc_uri(f"Q{i}-1")).json()["attributes"].get("trainingReportRef")
        if rep and srv.http.get(srv.dn(rep)).status_code == 200:
            reports += 1
    wall = time.time() - t0
    time.sleep(1.0)
    with rec.lock:
        got = list(zip(rec.got[first:], rec.times[first:], strict=True))
    lat = [t - datetime.fromisoformat(n_["eventTime"]).timestamp() for n_, t in got]
    ids = [n_["notificationId"] for n_, _ in got]
    return {"requests": n, "created_201": codes.count(201), "terminal": statuses, "with_report": reports,
            "wall_s": wall,
            "notifications": {"count": len(lat), "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
                              "max_ms": max(lat) * 1e3 if lat else None,
                              "ids_strictly_increasing": all(a < b for a, b in zip(ids, ids[1:], strict=False))}}


def status_of(proc: dict[str, Any]) -> dict[str, Any]:
    return next((c["attributes"]["vsData"] for c in proc.get("VsDataContainer", []) if c["id"] == "sluice-status"),
                {})


def create_to_first_iteration(srv: Any, rid: str) -> tuple[float, float]:
    """Seconds from sending the PUT of a default request until its process shows iteration 1, and the PUT's own
    seconds; the request is then cancelled and waited for."""
    body_ = {"id": rid, "attributes": {}, "VsDataContainer": []}
    uri = srv.proc_uri(f"{rid}-1")
    t0 = time.perf_counter()
    r = srv.http.put(srv.req(rid), json=body_)
    put = time.perf_counter() - t0
    if r.status_code != 201:
        raise RuntimeError(f"PUT {rid}: {r.status_code} {r.text}")
    while int(status_of(srv.http.get(uri).json()).get("iterations") or 0) < 1:
        if time.perf_counter() - t0 > 300:
            raise TimeoutError(f"{rid} did not train an iteration in 300 s")
        time.sleep(0.01)
    first = time.perf_counter() - t0
    srv.http.patch(srv.req(rid), json={"attributes": {"cancelRequest": True}},
                   headers={"Content-Type": "application/merge-patch+json"})
    wait_ended(srv, rid, 300)
    return first, put


def first_iterations(srv: Any, n: int, cold: tuple[float, float] | None) -> dict[str, Any]:
    got = [create_to_first_iteration(srv, f"F{k}") for k in range(n)]
    firsts = [g[0] for g in got]
    return {"requests": n, "job": "default (no sluice-job)", "each_s": firsts,
            "median_s": statistics.median(firsts), "max_s": max(firsts),
            "put_median_ms": statistics.median(g[1] for g in got) * 1e3, "target_s": 3.0,
            "first_after_start_s": None if cold is None else cold[0],
            "first_after_start_put_s": None if cold is None else cold[1]}


def per_iteration(report: dict[str, Any]) -> float:
    return float(report["duration_s"]) / max(1, int(report["iterations"]))


def monitoring_cost(srv: Any, tmp: Path, rounds: int, repeats: int) -> dict[str, Any]:
    cli, svc = [], []
    for k in range(repeats):
        out = tmp / f"cli-{k}"
        cmd = [sys.executable, "-m", "sluice", "run", "--out", str(out), "--set", f"train.rounds={rounds}",
               "--set", "data.num_clients=20", "--set", "train.participation=0.25"]
        subprocess.run(cmd, check=False, capture_output=True, timeout=1800, cwd=tmp)
        cli.append(per_iteration(json.loads((out / "report.json").read_text(encoding="utf-8"))))
        rid = f"H{k}"
        srv.http.put(srv.req(rid), json=body(rid, {"engine": "hfl", **HFL}, rounds))
        wait_ended(srv, rid, 1800)
        proc = srv.http.get(srv.proc_uri(f"{rid}-1")).json()
        report = srv.http.get(srv.dn(proc["attributes"]["trainingReportRef"])).json()
        svc.append(per_iteration(vs(report, "sluice-report")))
    c, s = statistics.median(cli), statistics.median(svc)
    return {"rounds": rounds, "repeats": repeats, "cli_s_per_iteration": cli, "service_s_per_iteration": svc,
            "cli_median_s": c, "service_median_s": s, "ratio": s / c, "target": 1.05}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--queued", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--starts", type=int, default=7, help="requests timed from create to first iteration")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    if a.quick:
        a.queued, a.rounds, a.repeats, a.starts = 10, 10, 1, 3
    parts = [x for x in a.parts.split(",") if x]
    unknown = [x for x in parts if x not in PARTS]
    if unknown:
        ap.error(f"unknown parts {unknown}")
    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-service-"))
    rec = Receiver()
    srv = start_server(tmp, name="bench")
    result: dict[str, Any] = {}
    try:
        cold = create_to_first_iteration(srv, "COLD") if "first_iteration" in parts else None
        srv.http.put(srv.uri("SubNetwork=SN1/NtfSubscriptionControl=BENCH"),
                     json={"id": "BENCH", "attributes": {"notificationRecipientAddress": rec.url}})
        t0 = time.time()
        if "reads" in parts:
            result["concurrent_reads"] = concurrent_reads(srv, 3)
        if "queue" in parts:
            result["queue"] = queue(srv, rec, a.queued)
        if "first_iteration" in parts:
            result["first_iteration"] = first_iterations(srv, a.starts, cold)
        if "cost" in parts:
            result["monitoring_cost"] = monitoring_cost(srv, tmp, a.rounds, a.repeats)
        total = time.time() - t0
    finally:
        stop_server(srv)
        rec.close()
    args = (" --quick" if a.quick else "") + ("" if parts == list(PARTS) else f" --parts {','.join(parts)}")
    result = {"host": {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(),
                       "load_avg_1m_at_end": os.getloadavg()[0]},
              **result, "bench_wall_s": total, "command": "bench/service.py" + args}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "service.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    md = markdown(result)
    (out / "service.md").write_text("\n".join(md), encoding="utf-8")
    print("\n".join(md))


def markdown(result: dict[str, Any]) -> list[str]:
    md = [
        "# Management service benchmark",
        "",
        f"`{result['command']}` — Python {result['host']['python']}, {result['host']['cpus']} CPUs "
        f"(shared; 1-min load average at the end {result['host']['load_avg_1m_at_end']:.1f}), SQLite store, "
        "`max_concurrent = 2`, everything on loopback.",
        "",
    ]
    if "concurrent_reads" in result:
        reads = result["concurrent_reads"]
        md += [
            "## 200 concurrent GETs of a running MLTrainingProcess",
            "",
            "| requests | failed | p50 ms | p99 ms | max ms |",
            "|---|---|---|---|---|",
            f"| {reads['requests']} ({reads['concurrency']} at once × 3) | {reads['failed']} | "
            f"{reads['p50_ms']:.1f} | {reads['p99_ms']:.1f} | {reads['max_ms']:.1f} |",
            "",
        ]
    if "queue" in result:
        q = result["queue"]
        n = q["notifications"]
        md += [
            f"## {q['requests']} requests queued at once",
            "",
            f"created (201): {q['created_201']}; terminal states: {q['terminal']}; with a report: "
            f"{q['with_report']}; wall time until the last ended: {q['wall_s']:.1f} s.",
            "",
            "## Notification latency (eventTime → receipt)",
            "",
            "| notifications | p50 ms | p99 ms | max ms | ids strictly increasing |",
            "|---|---|---|---|---|",
            f"| {n['count']} | {n['p50_ms']:.1f} | {n['p99_ms']:.1f} | {n['max_ms']:.1f} | "
            f"{n['ids_strictly_increasing']} |",
            "",
        ]
    if "first_iteration" in result:
        f = result["first_iteration"]
        md += [
            f"## Create → first iteration ({f['requests']} requests of the default job, one after the other)",
            "",
            "| each s | median s | max s | PUT median ms |",
            "|---|---|---|---|",
            f"| {', '.join(f'{x:.2f}' for x in f['each_s'])} | **{f['median_s']:.2f}** | {f['max_s']:.2f} | "
            f"{f['put_median_ms']:.0f} |",
            "",
            f"Target: median < {f['target_s']:g} s. The first request, sent as soon as the service answered "
            f"(its workers' forkserver still loading): {f['first_after_start_s']:.2f} s, of which the PUT "
            f"{f['first_after_start_put_s']:.2f} s.",
            "",
        ]
    if "monitoring_cost" in result:
        cost = result["monitoring_cost"]
        md += [
            f"## Monitoring cost: `sluice run` vs the same job through the service ({cost['rounds']} rounds, "
            f"{cost['repeats']} runs each, alternating)",
            "",
            "| | s per iteration (each run) | median |",
            "|---|---|---|",
            f"| `sluice run` | {', '.join(f'{x:.4f}' for x in cost['cli_s_per_iteration'])} | "
            f"{cost['cli_median_s']:.4f} |",
            f"| service | {', '.join(f'{x:.4f}' for x in cost['service_s_per_iteration'])} | "
            f"{cost['service_median_s']:.4f} |",
            "",
            f"Ratio service / CLI: **{cost['ratio']:.3f}** (target ≤ {cost['target']}).",
            "",
        ]
    return md


if __name__ == "__main__":
    main()
