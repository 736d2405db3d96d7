"""Benchmark: the management service's per-iteration overhead on a Flower federation, against
``sluice run --runtime flower`` on the same deployment and job (issue 43: within 5 %).

One :class:`~sluice.runtimes.flower.deploy.LocalDeployment` (a SuperLink and 3 SuperNodes on 127.0.0.1, TLS) and one
``sluice serve`` (SQLite, ``[federations.edge]`` naming that SuperLink and its CA, 3 nodes) run for the whole
benchmark. The same small HFL job (digits, ``data.num_clients=3``, participation 1.0, ``model.hidden=[32]``,
one local epoch, seed 0, ``--rounds`` iterations) is then trained, alternately (A B, B A, A B...):

* **flower**: submitted straight to the deployment as ``sluice run --runtime flower`` submits it
  (:func:`sluice.runtimes.flower.deploy.submit` with :class:`sluice.runtimes.flower.runner.FlowerOptions`'s run
  configuration: round timeout 60 s, link timeout 30 s, node wait 120 s, the server polling for replies every 0.05 s,
  ``min-nodes`` 3); the ServerApp trains under ``sluice.runtimes.training.run_job`` and writes ``status.json``,
  ``metrics.jsonl`` and ``report.json`` into the run directory;
* **service**: created as an ``MLTrainingRequest`` with ``"federation": "edge"`` and the termination
  ``{"iterations": rounds}``; the service's worker relays the worker protocol to the run's ServerApp, which
  trains under ``sluice.runtimes.remote.run_steered`` (progress, state and checkpoint messages to the service).

Per iteration, both sides: the training process's own clock (``elapsed_s``, the active training time, in the
ServerApp) at the end of the last iteration minus the same clock at the end of the first, over
(iterations − 1). The end of the last: the report's ``duration_s`` (``report.json``; the ``sluice-report`` of
the ``MLTrainingReport``). The end of the first: ``elapsed_s`` of the first live status that shows an iteration
(``status.json``, rewritten after every iteration; the process's ``sluice-status``, stored after every
iteration), each read every 0.25 s; should a status be first seen at iteration k > 1, the span runs from k.
Round 1 (the first messages, the hello to each node) and the start of the run are thus left out on both
sides. Overhead = median service / median flower − 1; the target is ≤ 5 %.

Over the same span (from the first live status seen to the end seen) it also counts CPU seconds (user +
system, ended and reaped processes included): of the deployment's processes (SuperLink, SuperNodes and the
ServerApp and ClientApp processes they start; the ServerApp apart) and of the service's (``sluice serve``, its
forkserver and workers). On shared cores the wall-clock seconds follow the other work; the service's CPU
share of an iteration is the check that does not.

    .venv/bin/python bench/service_federation.py                 # 3 pairs of 6 rounds
    .venv/bin/python bench/service_federation.py --pairs 1 --rounds 3 --out /tmp/x    # smoke

Writes ``bench/results/service_federation.md`` and ``.json``. Needs the ``flower`` and ``service`` extras.
Every process it starts (the deployment, the service with its workers) is stopped on the way out, also on an
error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sluice.runtimes.flower.deploy import FLOWER_VERSION, LocalDeployment, submit  # noqa: E402
from sluice.runtimes.flower.runner import FlowerOptions  # noqa: E402
from sluice.runtimes.jobs import load_job  # noqa: E402
from test_service_support import Server, checked, request_body, start_server, stop_server  # noqa: E402

NODES = 3
SETS = ["data.num_clients=3", "train.participation=1.0", "model.hidden=[32]", "train.local_epochs=1", "seed=0"]
POLL_S = 0.25  # how often either side's live status is read until it shows an iteration
TARGET = 0.05


def job_dict(rounds: int) -> dict[str, Any]:
    """The request's ``sluice-job`` (tests/test_service_federation.py's job, with ``train.rounds``)."""
    return {"engine": "hfl", "federation": "edge", "seed": 0, "data": {"num_clients": 3},
            "train": {"participation": 1.0, "local_epochs": 1, "rounds": rounds}, "model": {"hidden": [32]}}


def service_config(tmp: Path, dep: LocalDeployment, opts: FlowerOptions) -> Path:
    """``[federations.edge]``: the deployment's SuperLink with the same timeouts as the flower side."""
    path = tmp / "service.toml"
    path.write_text(f"""
[federations.edge]
superlink = "{dep.address}"
root_certificates = "{dep.certs.ca}"
nodes = {NODES}
round_timeout_s = {opts.round_timeout_s}
link_timeout_s = {opts.link_timeout_s}
node_wait_s = {opts.node_wait_s}
""", encoding="utf-8")
    return path


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _serverapps_done(dep: LocalDeployment, timeout_s: float = 60.0) -> None:
    """Wait until no ServerApp process of the deployment is left (the run ended on Flower's side too)."""
    import psutil

    end = time.monotonic() + timeout_s
    link = psutil.Process(dep.procs["superlink"].pid)
    while time.monotonic() < end:
        apps = []
        for p in link.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any("flwr-serverapp" in part for part in p.cmdline()):
                    apps.append(p)
        if not apps:
            return
        time.sleep(0.5)


def tree_cpu(roots: list[int], only: str | None = None) -> float:
    """CPU seconds (user + system) of processes ``roots`` and their descendants so far, the ones that ended
    and were reaped included (their parents' children times); with ``only``, of the processes whose command
    line names it (and theirs)."""
    import psutil

    procs: dict[int, Any] = {}
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for q in (root, *root.children(recursive=True)):
                procs[q.pid] = q
    total = 0.0
    for q in procs.values():
        with contextlib.suppress(psutil.Error):
            if only is not None and not any(only in part for part in q.cmdline()):
                continue
            t = q.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


class Cpu:
    """CPU seconds of the deployment's processes and of the service's (server, forkserver, workers)."""

    def __init__(self, dep: LocalDeployment, srv: Server | None) -> None:
        self.dep, self.srv = dep, srv

    def __call__(self) -> dict[str, float]:
        roots = [p.pid for p in self.dep.procs.values()]
        out = {"federation": tree_cpu(roots), "serverapp": tree_cpu(roots, "flwr-serverapp")}
        if self.srv is not None:
            out["service"] = tree_cpu([self.srv.proc.pid])
        return out


def per_iteration(first: tuple[int, float], report: dict[str, Any]) -> float:
    n, k = int(report["iterations"]), first[0]
    return (float(report["duration_s"]) - first[1]) / (n - k)


def run_flower(dep: LocalDeployment, tmp: Path, name: str, rounds: int, opts: FlowerOptions,
               cpu: Cpu) -> dict[str, Any]:
    """The job submitted to the deployment as ``sluice run --runtime flower`` submits it."""
    job = load_job("hfl", None, [*SETS, f"train.rounds={rounds}", f"termination.iterations={rounds}"])
    out = tmp / name
    work = tmp / f"{name}-work"
    work.mkdir(parents=True)
    t0 = time.monotonic()
    sub = submit(job.dump(), out, work, dep.home, run_config=opts.run_config(NODES))
    first: tuple[int, float] | None = None
    cpu0: dict[str, float] = {}
    end = t0 + 60 * rounds + 300
    while True:
        report = _read_json(out / "report.json")  # written whole (a rename)
        if report is not None:
            break
        err = out / "flower" / "server-error.txt"
        if err.exists():
            raise RuntimeError(f"{name}: the ServerApp failed: {err.read_text(encoding='utf-8')}")
        if time.monotonic() > end:
            raise TimeoutError(f"{name}: no report after {end - t0:.0f} s; see {dep.logs}")
        if first is None:
            st = _read_json(out / "status.json")
            if st is not None and int(st.get("iterations") or 0) >= 1:
                first = (int(st["iterations"]), float(st["elapsed_s"]))
                cpu0 = cpu()
        time.sleep(POLL_S if first is None else 1.0)
    wall = time.monotonic() - t0
    cpu1 = cpu()
    _serverapps_done(dep)
    return _result("flower", name, report, first, wall, cpu0, cpu1, run_id=sub.run_id)


def _status(proc: dict[str, Any]) -> dict[str, Any]:
    return next((v["attributes"]["vsData"] for v in proc.get("VsDataContainer", []) if v["id"] == "sluice-status"),
                {})


def run_service(srv: Server, dep: LocalDeployment, name: str, rounds: int, cpu: Cpu) -> dict[str, Any]:
    """The same job as a request on federation ``edge`` of the service."""
    body = request_body(name, job_dict(rounds), termination={"iterations": rounds})
    t0 = time.monotonic()
    checked(srv.http.put(srv.req(name), json=body), 201)
    uri = srv.proc_uri(f"{name}-1")
    first: tuple[int, float] | None = None
    cpu0: dict[str, float] = {}
    end = t0 + 60 * rounds + 300
    while True:
        req = srv.http.get(srv.req(name)).json()
        if req["attributes"]["requestStatus"] in ("FINISHED", "CANCELLED", "FAILED"):
            break
        if time.monotonic() > end:
            raise TimeoutError(f"{name}: not ended after {end - t0:.0f} s:\n{srv.log_text()}")
        if first is None:
            resp = srv.http.get(uri)
            if resp.status_code == 200:
                st = _status(resp.json())
                if int(st.get("iterations") or 0) >= 1:
                    first = (int(st["iterations"]), float(st["elapsed_s"]))
                    cpu0 = cpu()
        time.sleep(POLL_S if first is None else 1.0)
    wall = time.monotonic() - t0
    cpu1 = cpu()
    proc = srv.get(uri)
    ref = proc["attributes"].get("trainingReportRef")
    if proc["attributes"]["progressStatus"]["status"] != "FINISHED" or not ref:
        raise RuntimeError(f"{name}: {json.dumps(proc)[:2000]}\n{srv.log_text()}")
    rep = srv.get(srv.dn(ref))
    report = next(v["attributes"]["vsData"] for v in rep["VsDataContainer"] if v["id"] == "sluice-report")
    _serverapps_done(dep)
    return _result("service", name, report, first, wall, cpu0, cpu1)


def _result(variant: str, name: str, report: dict[str, Any], first: tuple[int, float] | None, wall: float,
            cpu0: dict[str, float], cpu1: dict[str, float], **extra: Any) -> dict[str, Any]:
    if report.get("cause") != "CRITERION_MET":
        raise RuntimeError(f"{name}: {report.get('cause')}: {report.get('detail')}")
    if first is None or first[0] >= int(report["iterations"]):
        raise RuntimeError(f"{name}: no live status seen before the last iteration")
    spans = int(report["iterations"]) - first[0]
    return {"variant": variant, "name": name, "iterations": int(report["iterations"]),
            "first_seen_iteration": first[0], "elapsed_at_first_s": first[1], "duration_s": float(report["duration_s"]),
            "s_per_iteration": per_iteration(first, report), "submit_to_end_s": wall,
            "cpu_s_per_iteration": {k: (cpu1[k] - cpu0[k]) / spans for k in cpu1},
            "load_avg_1m_at_end": os.getloadavg()[0],
            "test_accuracy": (report.get("performance") or {}).get("test_accuracy"), **extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="runs of each variant, alternating (default 3)")
    ap.add_argument("--rounds", type=int, default=6, help="iterations per run (default 6)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    if a.rounds < 2:
        ap.error("--rounds must be at least 2")

    def _term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    opts = FlowerOptions()
    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-service-federation-"))
    dep = LocalDeployment(tmp / "dep", nodes=NODES, tls=True)
    srv: Server | None = None
    cpu = Cpu(dep, None)
    runs: list[dict[str, Any]] = []
    ok = False
    load0 = os.getloadavg()[0]
    t_bench = time.monotonic()
    try:
        dep.start()
        srv = start_server(tmp, name="bench", extra=(str(service_config(tmp, dep, opts)),))
        cpu = Cpu(dep, srv)
        for k in range(a.pairs):
            order = ("flower", "service") if k % 2 == 0 else ("service", "flower")
            for variant in order:
                if variant == "flower":
                    r = run_flower(dep, tmp, f"A{k}", a.rounds, opts, cpu)
                else:
                    r = run_service(srv, dep, f"B{k}", a.rounds, cpu)
                runs.append(r)
                c = r["cpu_s_per_iteration"]
                print(f"{r['name']} {variant}: {r['s_per_iteration']:.3f} s/iteration (from iteration "
                      f"{r['first_seen_iteration']} to {r['iterations']}), {r['submit_to_end_s']:.1f} s in all; "
                      f"CPU s/iteration federation {c['federation']:.2f} (ServerApp {c['serverapp']:.2f}), service "
                      f"{c['service']:.3f}; load {r['load_avg_1m_at_end']:.1f}", flush=True)
    except BaseException:
        print(f"failed; the logs are in {tmp}", file=sys.stderr)
        raise
    else:
        ok = True
    finally:
        if srv is not None:
            stop_server(srv)
        dep.stop()
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.monotonic() - t_bench
    flower = [r["s_per_iteration"] for r in runs if r["variant"] == "flower"]
    service = [r["s_per_iteration"] for r in runs if r["variant"] == "service"]
    fm, sm = statistics.median(flower), statistics.median(service)
    overhead = sm / fm - 1

    def cpu_median(variant: str, part: str) -> float:
        return statistics.median(r["cpu_s_per_iteration"][part] for r in runs if r["variant"] == variant)

    parts = ("federation", "serverapp", "service")
    cpu_med = {v: {part: cpu_median(v, part) for part in parts} for v in ("flower", "service")}
    pairs = [runs[2 * k + (1 if runs[2 * k]["variant"] == "flower" else 0)]["s_per_iteration"]
             / runs[2 * k + (0 if runs[2 * k]["variant"] == "flower" else 1)]["s_per_iteration"] - 1
             for k in range(a.pairs)]
    args = "" if (a.pairs, a.rounds) == (3, 6) else f" --pairs {a.pairs} --rounds {a.rounds}"
    result = {
        "command": ".venv/bin/python bench/service_federation.py" + args,
        "machine": "2 cores, shared",
        "host": {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(),
                 "flower": FLOWER_VERSION, "load_avg_1m_at_start": load0, "load_avg_1m_at_end": os.getloadavg()[0]},
        "deployment": f"1 SuperLink + {NODES} SuperNodes on 127.0.0.1, TLS, kept for every run",
        "job": " ".join(SETS) + f" train.rounds={a.rounds}, termination iterations={a.rounds}",
        "run_config": opts.run_config(NODES),
        "measure": "(duration_s of the report − elapsed_s of the first live status showing an iteration) / "
                   "(iterations − that iteration); the training process's clock in the ServerApp on both sides",
        "pairs": a.pairs, "rounds": a.rounds, "runs": runs,
        "flower_s_per_iteration": flower, "service_s_per_iteration": service,
        "flower_median_s": fm, "service_median_s": sm, "overhead": overhead, "overhead_per_pair": pairs,
        "target": TARGET, "target_met": overhead <= TARGET,
        "cpu_note": "CPU seconds (user + system) per iteration over the same span, from the first live status seen "
                    "to the end seen (read every 1 s): 'federation' = the SuperLink, the SuperNodes and their "
                    "ServerApp and ClientApp processes ('serverapp' the ServerApp alone); 'service' = sluice serve, "
                    "its forkserver and workers",
        "cpu_median_s_per_iteration": cpu_med, "bench_wall_s": total,
    }
    result["service_cpu_share"] = service_cpu_share(result)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "service_federation.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    md = markdown(result)
    (out / "service_federation.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


def service_cpu_share(r: dict[str, Any]) -> float:
    """The service's CPU per iteration over the federation's, both of the service runs (medians)."""
    c = r["cpu_median_s_per_iteration"]["service"]
    return c["service"] / c["federation"]


def markdown(r: dict[str, Any]) -> list[str]:
    def each(xs: list[float]) -> str:
        return ", ".join(f"{x:.3f}" for x in xs)

    met = "met" if r["target_met"] else "**not met**"
    return [
        "# The service on a Flower federation vs `sluice run --runtime flower` (bench/service_federation.py)",
        "",
        f"`{r['command']}` — {r['machine']} (Python {r['host']['python']}, {r['host']['cpus']} CPUs; 1-min load "
        f"average {r['host']['load_avg_1m_at_start']:.1f} at the start, {r['host']['load_avg_1m_at_end']:.1f} at "
        f"the end), Flower {r['host']['flower']}, {r['deployment']}; {r['bench_wall_s'] / 60:.1f} min in all.",
        "",
        f"Job: {r['job']}. {r['pairs']} runs of each variant, alternating.",
        "",
        "| | s per iteration (each run, in order) | median |",
        "|---|---|---|",
        f"| `sluice run --runtime flower` (submitted to the deployment) | {each(r['flower_s_per_iteration'])} | "
        f"{r['flower_median_s']:.3f} |",
        f"| `sluice serve`, request with `federation = \"edge\"` | {each(r['service_s_per_iteration'])} | "
        f"{r['service_median_s']:.3f} |",
        "",
        f"Overhead (median service / median flower − 1): **{100 * r['overhead']:+.1f} %**; target ≤ "
        f"{100 * r['target']:.0f} %: {met}. Per pair: "
        + ", ".join(f"{100 * x:+.1f} %" for x in r["overhead_per_pair"]) + "."
        + (" The pairs differ by more than the target: the other work on the shared cores, not the variant, "
           "sets these seconds; the CPU seconds below depend on it far less."
           if max(r["overhead_per_pair"]) - min(r["overhead_per_pair"]) > 2 * r["target"] else ""),
        "",
        "CPU seconds per iteration (median; user + system over the same span, from the first live status seen to "
        "the end seen, read every 1 s):",
        "",
        "| | federation (SuperLink, SuperNodes, ServerApp, ClientApps) | of which the ServerApp | service "
        "(server, forkserver, workers) |",
        "|---|---|---|---|",
        *(f"| {v} | {c['federation']:.2f} | {c['serverapp']:.2f} | {c['service']:.3f}"
          + (" (idle) |" if v == "flower" else " |") for v, c in r["cpu_median_s_per_iteration"].items()),
        "",
        f"The service's CPU per iteration is {100 * r['service_cpu_share']:.2f} % of the federation's (service runs, "
        "medians).",
        "",
        "Per iteration: " + r["measure"] + ". Submission to the end of the run (start of the Flower run and round "
        "1 included), each run: " + ", ".join(f"{x['name']} {x['submit_to_end_s']:.1f} s" for x in r["runs"])
        + ".",
    ]


if __name__ == "__main__":
    main()
