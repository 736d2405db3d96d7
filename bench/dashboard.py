"""Benchmark: how fast the dashboard (``sluice dashboard``) renders and how late its live updates arrive.

The data are real: one ``sluice run`` of the default HFL job (5 clients, one hidden layer of 16, ``--rounds``
rounds, 1,000 by default) writes its run directory; its ``metrics.jsonl`` (byte counts from the encoded
messages) is the curve of every process shown.

1. **Render.** A folder of 20 finished copies of that run; headless Chromium (Debian's, Playwright) opens
   ``/#p=<first>&compare=*``: the process table with 20 rows, the first process's five charts with every
   point, and the comparison chart of all 20 runs. The time is from navigation start (the page's
   ``performance.now()``) until all of it is drawn, the median of ``--repeats`` fresh page loads
   (target: under 1 s).
2. **Live update.** The run's lines are appended, one every ``--interval-s``, to the ``metrics.jsonl`` of a
   run directory the dashboard shows while it is written (as a run writes them: the line, then a flush). For
   each line, the delay from its write to the page's drawing of that iteration (the page marks
   ``data-shown`` on ``<body>`` after the frame that drew an update; both sides read the same system clock)
   (target: every update within 500 ms).
3. **Live update, service.** ``sluice serve`` (default settings) trains an HFL request while the page shows it;
   for each update, the delay from the commit of the process's status in the service's store (the
   ``committed_at`` of its event) to the page's drawing of it. The worker's report before that commit (at
   most every ``progress_interval_s``) is not part of it.

    .venv/bin/python bench/dashboard.py              # about 1 min on 2 shared cores (measured: 64 s)
    .venv/bin/python bench/dashboard.py --quick      # 200 rounds, 2 repeats, 30 updates (smoke)

Writes ``bench/results/dashboard.md`` and ``.json``. Needs the ``dashboard`` extra and ``/usr/bin/chromium``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CHROMIUM = "/usr/bin/chromium"
JOB = ["--set", "data.num_clients=5", "--set", "model.hidden=[16]"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def real_run(rounds: int, out: Path) -> Path:
    cmd = [sys.executable, "-m", "sluice", "run", "--out", str(out), *JOB, "--set", f"train.rounds={rounds}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=out.parent)
    return out


@contextlib.contextmanager
def dashboard(folder: Path) -> Any:
    import httpx

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sluice", "dashboard", str(folder), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(root + "/dashboard/api/info", timeout=5).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() - t0 > 60:
                raise RuntimeError("sluice dashboard did not start")
            time.sleep(0.1)
        yield root
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(20)


DRAWN = """([rows, points]) => document.querySelectorAll('#procs tbody tr').length === rows
  && +document.querySelector('#c-metrics').dataset.points === points
  && +document.querySelector('#c-party').dataset.points === points
  && +document.querySelector('#cmp-chart').dataset.series === rows
  && +document.querySelector('#cmp-chart').dataset.points >= points"""


def render(browser: Any, run: Path, work: Path, processes: int, repeats: int) -> dict[str, Any]:
    folder = work / "many"
    for i in range(processes):
        shutil.copytree(run, folder / f"run-{i:02d}", ignore=shutil.ignore_patterns("*.png", "model.pt"))
    points = sum(1 for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip())
    times = []
    with dashboard(folder) as root:
        for _ in range(repeats):
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{root}/#p=run-00&compare=*")
            page.wait_for_function(DRAWN, arg=[processes, points], timeout=120_000, polling="raf")
            times.append(page.evaluate("performance.now()") / 1000)
            page.close()
    return {"processes": processes, "points_per_curve": points, "charts": 6, "repeats": repeats,
            "seconds": times, "median_s": statistics.median(times), "max_s": max(times)}


WATCH = """() => { window.__seen = [];
  new MutationObserver(() => { const [id, it, at, committed] = document.body.dataset.shown.split('@');
    window.__seen.push([id, +it, +at, committed === '' ? null : +committed]); })
  .observe(document.body, {attributes: true, attributeFilter: ['data-shown']}); }"""


def live(browser: Any, run: Path, work: Path, updates: int, interval_s: float) -> dict[str, Any]:
    folder = work / "live"
    target = folder / "writing"
    target.mkdir(parents=True)
    shutil.copy(run / "config.toml", target / "config.toml")
    lines = [line for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()][:updates]
    written: dict[int, float] = {}
    out = open(target / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - kept open as a run does
    out.write(lines[0] + "\n")
    out.flush()
    with out, dashboard(folder) as root:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            page.goto(f"{root}/#p=writing")
            page.wait_for_function("() => +document.querySelector('#c-metrics').dataset.points === 1", timeout=60_000)
            page.evaluate(WATCH)
            for line in lines[1:]:
                time.sleep(interval_s)
                written[json.loads(line)["round"]] = time.time()
                out.write(line + "\n")
                out.flush()
            last = json.loads(lines[-1])["round"]
            page.wait_for_function(f"() => window.__seen.some(s => s[1] >= {last})", timeout=60_000)
            seen = page.evaluate("window.__seen")
        finally:
            page.close()
    first_seen: dict[int, float] = {}
    for _, it, at, _committed in seen:
        for n in written:  # an update shows every iteration up to its own
            if n <= it and n not in first_seen:
                first_seen[n] = at / 1000
    delays = sorted((first_seen[n] - written[n]) * 1000 for n in written if n in first_seen)
    return {"updates": len(written), "interval_s": interval_s, "delays_ms": [round(d, 1) for d in delays],
            "median_ms": statistics.median(delays), "p95_ms": delays[int(0.95 * (len(delays) - 1))],
            "max_ms": max(delays), "missed": len(written) - len(delays)}


HFL = {"engine": "hfl", "seed": 0, "data": {"num_clients": 5}, "train": {"participation": 1.0, "local_epochs": 1},
       "model": {"hidden": [16]}}
TF = "SubNetwork=SN1/MLTrainingFunction=TF1"


@contextlib.contextmanager
def service(work: Path) -> Any:
    import httpx

    port = _free_port()
    work.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "sluice", "serve", "--port", str(port), "--database",
                             f"sqlite:///{work / 'svc.db'}"], cwd=work, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{root}/ready", timeout=5).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError("sluice serve did not start")
            time.sleep(0.1)
        yield root
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)


def service_live(browser: Any, work: Path, iterations: int) -> dict[str, Any]:
    """From a process's status committed by the service to the page's drawing of it (service mode)."""
    import httpx

    with service(work / "service") as root, httpx.Client(base_url=f"{root}/ProvMnS/v1920/", timeout=120) as http:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            page.goto(root + "/")
            page.wait_for_function("() => document.querySelector('#conn').dataset.state === 'live'", timeout=60_000)
            page.evaluate(WATCH)
            body = {"attributes": {}, "VsDataContainer": [
                {"id": "sluice-job", "attributes": {"vsData": HFL}},
                {"id": "sluice-termination", "attributes": {"vsData": {"iterations": iterations}}}]}
            http.put(f"{TF}/MLTrainingRequest=B1", json=body).raise_for_status()
            page.wait_for_function("() => [...document.querySelectorAll('#procs tbody tr')].some("
                                   "r => r.dataset.status === 'FINISHED')", timeout=300_000)
            seen = page.evaluate("window.__seen")
        finally:
            page.close()
    delays = sorted(at - committed * 1000 for _, _, at, committed in seen if committed is not None)
    return {"iterations": iterations, "updates": len(delays), "delays_ms": [round(d, 1) for d in delays],
            "median_ms": statistics.median(delays), "p95_ms": delays[int(0.95 * (len(delays) - 1))],
            "max_ms": max(delays), "progress_interval_s": 0.2}


def write(res: dict[str, Any], out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    r, lv = res["render"], res["live"]
    rows = [
        (f"page with {r['processes']} processes, {r['points_per_curve']} points per curve, {r['charts']} charts "
         f"drawn (median of {r['repeats']} loads; max)", f"{r['median_s']:.3f} s ({r['max_s']:.3f} s)", "under 1 s"),
        (f"delay from a `metrics.jsonl` line written to its iteration drawn, {lv['updates']} updates every "
         f"{lv['interval_s']} s: median, p95, max",
         f"{lv['median_ms']:.0f} ms, {lv['p95_ms']:.0f} ms, {lv['max_ms']:.0f} ms", "every update within 500 ms"),
        ("updates never drawn", str(lv["missed"]), "0"),
    ]
    sv = res.get("service")
    if sv:
        rows.append((f"`sluice serve`: delay from a process's status committed to its drawing, {sv['updates']} "
                     f"updates of a {sv['iterations']}-iteration HFL request: median, p95, max",
                     f"{sv['median_ms']:.0f} ms, {sv['p95_ms']:.0f} ms, {sv['max_ms']:.0f} ms",
                     "every update within 500 ms"))
    md = f"""# Dashboard: render time and live-update delay

`python bench/dashboard.py{' --quick' if res['quick'] else ''}` on {res['machine']} ({res['cpus']} CPUs,
load average {res['load_average']:.1f} at the start), headless Chromium {res['chromium']}. The curves are one
real `sluice run` ({' '.join(JOB[1::2])}, {res['rounds']} rounds).

| what | measured | target |
|---|---|---|
""" + "".join(f"| {a} | {b} | {c} |\n" for a, b, c in rows)
    out.with_suffix(".md").write_text(md, encoding="utf-8")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--updates", type=int)
    ap.add_argument("--interval-s", type=float, default=0.1)
    ap.add_argument("--out", type=Path, default=RESULTS / "dashboard")
    args = ap.parse_args(argv)
    rounds = args.rounds or (200 if args.quick else 1000)
    repeats = args.repeats or (2 if args.quick else 5)
    updates = args.updates or (30 if args.quick else 100)
    t0 = time.time()
    res: dict[str, Any] = {"quick": args.quick, "rounds": rounds, "machine": platform.machine(),
                           "cpus": os.cpu_count(), "load_average": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-dashboard-") as tmp, sync_playwright() as p:
        work = Path(tmp)
        run = real_run(rounds, work / "source")
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            res["chromium"] = browser.version
            res["render"] = render(browser, run, work, 20, repeats)
            res["live"] = live(browser, run, work, updates, args.interval_s)
            res["service"] = service_live(browser, work, 50 if args.quick else 200)
        finally:
            browser.close()
    res["bench_wall_s"] = round(time.time() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(res, args.out)
    print(args.out.with_suffix(".md").read_text(encoding="utf-8"))
    return res


if __name__ == "__main__":
    main()
