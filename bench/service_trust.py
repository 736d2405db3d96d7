"""Benchmark: what the management service keeps through a kill -9, and a soak of concurrent consumers.

1. **Restart after kill -9 mid-training.** A service (``checkpoint_every`` = 5, 3 workers) trains 3
   requests (local engine, digits, ``--iterations`` iterations each) with a notification receiver
   subscribed to everything. Once every process has a checkpoint of iteration >= 10, the service, its
   forkserver and its workers are killed with SIGKILL at once, and a new service starts on the same
   database. Measured: seconds from the restart command until every interrupted process trains again
   (its worker reported RUNNING), of which the new service's own start-up; iterations repeated per
   process (the iterations the store had seen before the kill minus the checkpoint's; the worker may
   have run a few more it never reported); whether every process then ends FINISHED by its iteration
   rule; notifications lost (rows in the outbox never received) and duplicated (a ``notificationId``
   received twice: only the one in flight at the kill may be, as delivery is at least once).
2. **Soak.** ``--requests`` requests created by ``--consumers`` consumer threads (each with its own
   token, subscription and receiver), each thread then modifying, suspending, resuming and cancelling its
   requests in random order (seeded) through :class:`sluice.service.client.ProvMnSClient`; at the end each
   thread cancels what has not ended. Counted: 5xx answers (must be 0), refusals (4xx: e.g. suspending
   an ended request; expected), requests not in a terminal state once everything settled (must be 0),
   and per consumer whether its notifications are complete (every outbox row of its subscription
   received) and in ``notificationId`` order. Run on SQLite and, where PostgreSQL is installed, on a
   throwaway PostgreSQL server (:func:`sluice.service.pgserver.running_postgres`).

    .venv/bin/python bench/service_trust.py            # full
    .venv/bin/python bench/service_trust.py --quick    # 40 requests, 4 consumers (smoke)

Writes ``bench/results/service_trust.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sluice.service.client import MnSClientError, ProvMnSClient  # noqa: E402
from test_service_restart import kill_all, stored  # noqa: E402
from test_service_support import Receiver, request_body, start_server, stop_server  # noqa: E402

TERMINAL = ("FINISHED", "CANCELLED")
EVERY = 5
TRAIN_JOB = {"engine": "local", "seed": 0, "train": {"iterations": 5, "batch_size": 32, "lr": 0.05},
             "model": {"hidden": [64]}}
TINY_JOB = {"engine": "local", "seed": 0, "train": {"iterations": 3, "batch_size": 128, "lr": 0.1},
            "model": {"hidden": [8]}}
TF = "SubNetwork=SN1/MLTrainingFunction=TF1"


@contextlib.contextmanager
def databases(tmp: Path, backends: list[str]) -> Iterator[dict[str, Any]]:
    """A factory of new empty store URLs per backend (PostgreSQL only when it can be started here)."""
    with contextlib.ExitStack() as stack:
        made: dict[str, Any] = {}
        for b in backends:
            if b == "sqlite":
                made[b] = lambda name: f"sqlite:///{tmp / (name + '.db')}"
            else:
                try:
                    from sluice.service.pgserver import running_postgres

                    pg = stack.enter_context(running_postgres())
                    made[b] = pg.new_database
                except Exception as exc:  # noqa: BLE001 - reported as not measured
                    made[b] = f"not measured: {type(exc).__name__}: {exc}"
        yield made


def notifications_check(rec: Receiver, url: str, sub_ldn: str, in_flight: set[int] | None = None) -> dict[str, Any]:
    """Lost / duplicated / out-of-order notifications of one subscription, against the outbox rows."""
    ids = [n["notificationId"] for n in rec.got]
    rows = {i for (i,) in stored(url, "SELECT id FROM notification WHERE subscription_dn = :s", s=sub_ldn)}
    once = list(dict.fromkeys(ids))
    dup = sorted({i for i in ids if ids.count(i) > 1})
    return {"received": len(ids), "outbox_rows": len(rows), "lost": len(rows - set(ids)), "duplicated": len(dup),
            "duplicated_in_flight_at_kill": len([i for i in dup if in_flight and i in in_flight]),
            "in_order": once == sorted(once)}


def wait_delivered(url: str, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while stored(url, "SELECT id FROM notification WHERE delivered_at IS NULL AND dropped = :f", f=False):
        if time.monotonic() - t0 > timeout:
            return
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------ restart


def restart(tmp: Path, url: str, n: int, iterations: int) -> dict[str, Any]:
    rec = Receiver()
    extra = ("--set", f"checkpoint_every={EVERY}", "--set", f"max_concurrent={n}")
    srv = start_server(tmp, name="restart", database=url, extra=extra)
    srv2 = None
    try:
        srv.http.put(srv.uri("SubNetwork=SN1/NtfSubscriptionControl=B"),
                     json={"id": "B", "attributes": {"notificationRecipientAddress": rec.url}}).raise_for_status()
        rids = [f"K{i}" for i in range(n)]
        for rid in rids:
            srv.http.put(srv.req(rid), json=request_body(rid, TRAIN_JOB, termination={"iterations": iterations})
                         ).raise_for_status()
        procs = [f"{TF}/MLTrainingProcess={rid}-1" for rid in rids]
        t0 = time.monotonic()
        while True:
            ck = dict(stored(url, "SELECT process_dn, iteration FROM checkpoint"))
            if all(ck.get(p, 0) >= 10 for p in procs):
                break
            if time.monotonic() - t0 > 300:
                raise RuntimeError(f"no checkpoints >= 10 for all processes: {ck}\n{srv.log_text()}")
            time.sleep(0.02)
        time.sleep(random.Random(n).uniform(0.0, 0.5))  # somewhere between two checkpoints
        kill_all(srv)
        ck = dict(stored(url, "SELECT process_dn, iteration FROM checkpoint"))
        seen = {}
        for p in procs:
            ((vs,),) = stored(url, "SELECT vs_data FROM moi WHERE dn = :p", p=p)
            vs = vs if isinstance(vs, dict) else json.loads(vs)
            seen[p] = int(vs["sluice-status"]["iterations"])
        in_flight = {max(n["notificationId"] for n in rec.got)} if rec.got else set()
        t_restart = time.monotonic()
        srv2 = start_server(tmp, name="restart", port=srv.port, database=url, extra=extra)
        t_up = time.monotonic()
        running: dict[str, float] = {}
        while len(running) < n and time.monotonic() - t_restart < 300:
            for p in procs:
                if p in running:
                    continue
                ps = srv2.get(srv2.uri(p))["attributes"]["progressStatus"]
                if ps["progressStateInfo"] == "TRAINING" or ps["status"] == "FINISHED":
                    running[p] = time.monotonic() - t_restart
            time.sleep(0.02)
        for rid in rids:
            srv2.wait_status(rid, TERMINAL, timeout=600)
        ends = []
        for p in procs:
            proc = srv2.get(srv2.uri(p))
            rep = srv2.get(srv2.dn(proc["attributes"]["trainingReportRef"]))
            r = next(c["attributes"]["vsData"] for c in rep["VsDataContainer"] if c["id"] == "sluice-report")
            ends.append({"status": proc["attributes"]["progressStatus"]["status"], "cause": r["cause"],
                         "rule": (r.get("criterion") or {}).get("rule"), "iterations": r["iterations"]})
        wait_delivered(url)
        time.sleep(0.5)
        notes = notifications_check(rec, url, "SubNetwork=SN1/NtfSubscriptionControl=B", in_flight)
        return {
            "processes": n, "iterations": iterations, "checkpoint_every": EVERY,
            "startup_s": round(t_up - t_restart, 3),
            "all_running_again_s": round(max(running.values()), 3) if len(running) == n else None,
            "running_again_s": {p.rpartition("=")[2]: round(v, 3) for p, v in running.items()},
            "checkpoint_iteration": {p.rpartition("=")[2]: ck.get(p) for p in procs},
            "iterations_seen_before_kill": {p.rpartition("=")[2]: seen[p] for p in procs},
            "iterations_repeated": {p.rpartition("=")[2]: max(0, seen[p] - ck.get(p, 0)) for p in procs},
            "ends": ends,
            "all_finished_by_rule": all(e["status"] == "FINISHED" and e["rule"] == "iterations"
                                        and e["iterations"] == iterations for e in ends),
            "notifications": notes,
        }
    finally:
        if srv2 is not None:
            stop_server(srv2)
        stop_server(srv, kill=True)
        rec.close()


# ------------------------------------------------------------------------------------------ soak


def soak(tmp: Path, url: str, requests: int, consumers: int, seed: int) -> dict[str, Any]:
    tokens: list[str | None] = [None] * consumers
    extra: tuple[str, ...] = ("--set", "max_concurrent=4", "--set", "checkpoint_every=1")
    auth, admin = "off", None
    try:
        from sluice.service.auth import add_token

        tfile = tmp / f"tokens-{url.rpartition('/')[2]}.toml"
        tokens = [add_token(tfile, f"consumer{i}") for i in range(consumers)]
        admin = add_token(tfile, "operator", admin=True)
        extra += ("--set", f"auth.tokens_file={json.dumps(str(tfile))}")
        auth = "one token per consumer"
    except ImportError:
        pass
    srv = start_server(tmp, name=f"soak-{seed}", database=url, extra=extra, token=admin)
    recs = [Receiver() for _ in range(consumers)]
    stats = [{"ops": 0, "http_5xx": 0, "refused_4xx": 0, "errors": []} for _ in range(consumers)]
    mine: list[list[str]] = [[] for _ in range(consumers)]
    lock = threading.Lock()
    try:
        def consumer(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            st = stats[i]
            with ProvMnSClient(srv.function, token=tokens[i]) as c:
                def call(fn: Any, *a: Any, **kw: Any) -> Any:
                    st["ops"] += 1
                    try:
                        return fn(*a, **kw)
                    except MnSClientError as exc:
                        if exc.status >= 500:
                            st["http_5xx"] += 1
                            st["errors"].append(f"{exc.status}: {str(exc)[:200]}")
                        else:
                            st["refused_4xx"] += 1
                    except Exception as exc:  # noqa: BLE001 - counted: a transport error is a failure too
                        st["http_5xx"] += 1
                        st["errors"].append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    return None

                call(c.subscribe, f"C{i}", recs[i].url)
                share = requests // consumers + (1 if i < requests % consumers else 0)
                for k in range(share):
                    rid = f"S{i}x{k}"
                    doc = {**TINY_JOB, "termination": {"iterations": rng.randint(2, 6)}}
                    if call(c.create, doc, rid) is not None:
                        with lock:
                            mine[i].append(rid)
                    for _ in range(rng.randint(0, 2)):
                        target = rng.choice(mine[i]) if mine[i] else None
                        if target is None:
                            continue
                        op = rng.choice(("modify", "suspend", "resume", "cancel", "modify", "resume"))
                        if op == "modify":
                            call(c.modify, target, termination={"iterations": rng.randint(2, 8)})
                        elif op == "suspend":
                            call(c.suspend, target)
                        elif op == "resume":
                            call(c.resume, target)
                        else:
                            call(c.cancel, target)
                for rid in mine[i]:  # end what is left: resume the suspended, cancel what still waits
                    req = call(c.request, rid)
                    status = (req or {}).get("attributes", {}).get("requestStatus")
                    if status == "SUSPENDED" and rng.random() < 0.5:
                        call(c.resume, rid)
                    elif status not in TERMINAL and status != "CANCELLING":
                        call(c.cancel, rid)

        t0 = time.monotonic()
        threads = [threading.Thread(target=consumer, args=(i,)) for i in range(consumers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ops_s = time.monotonic() - t0
        deadline = time.monotonic() + 600
        left: list[str] = []
        while time.monotonic() < deadline:
            left = []
            for i in range(consumers):
                with ProvMnSClient(srv.function, token=tokens[i]) as c:
                    for rid in mine[i]:
                        s = c.request(rid)["attributes"]["requestStatus"]
                        if s not in TERMINAL:
                            left.append(f"{rid}:{s}")
            if not left:
                break
            time.sleep(1.0)
        settle_s = time.monotonic() - t0
        wait_delivered(url)
        time.sleep(0.5)
        per = [notifications_check(recs[i], url, f"SubNetwork=SN1/NtfSubscriptionControl=C{i}")
               for i in range(consumers)]
        finals: dict[str, int] = {}
        for i in range(consumers):
            with ProvMnSClient(srv.function, token=tokens[i]) as c:
                for rid in mine[i]:
                    s = c.request(rid)["attributes"]["requestStatus"]
                    finals[s] = finals.get(s, 0) + 1
        return {
            "requests": sum(len(m) for m in mine), "consumers": consumers, "auth": auth,
            "operations": sum(s["ops"] for s in stats), "http_5xx": sum(s["http_5xx"] for s in stats),
            "refused_4xx": sum(s["refused_4xx"] for s in stats),
            "errors": [e for s in stats for e in s["errors"]][:10],
            "final_states": finals, "not_terminal": left,
            "notifications_received": sum(p["received"] for p in per),
            "consumers_complete": sum(1 for p in per if p["lost"] == 0),
            "consumers_in_order": sum(1 for p in per if p["in_order"]),
            "duplicates": sum(p["duplicated"] for p in per),
            "operations_s": round(ops_s, 1), "until_all_terminal_s": round(settle_s, 1),
        }
    finally:
        stop_server(srv)
        for r in recs:
            r.close()


# ------------------------------------------------------------------------------------------ report


def write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "service_trust.json").write_text(json.dumps(results, indent=1))
    lines = ["# Service trust: restart after kill -9, and a soak of concurrent consumers", "",
             f"{results['when']} · {results['machine']} · `{results['command']}`", "",
             "## Restart after kill -9 mid-training", "",
             "| store | processes | start-up s | all running again s | iterations repeated (≤ interval) | "
             "finished by rule | notifications lost | duplicated |", "|---|---|---|---|---|---|---|---|"]
    for b, r in results["restart"].items():
        if isinstance(r, str):
            lines.append(f"| {b} | {r} | | | | | | |")
            continue
        rep = ", ".join(str(v) for v in r["iterations_repeated"].values())
        n = r["notifications"]
        lines.append(f"| {b} | {r['processes']} | {r['startup_s']} | {r['all_running_again_s']} | {rep} "
                     f"(≤ {r['checkpoint_every']}) | {r['all_finished_by_rule']} | {n['lost']} | {n['duplicated']} |")
    lines += ["", "## Soak", "",
              "| store | requests | consumers | operations | 5xx | 4xx refusals | final states | not terminal | "
              "consumers complete | in order | duplicates | seconds |", "|---" * 12 + "|"]
    for b, r in results["soak"].items():
        if isinstance(r, str):
            lines.append(f"| {b} | {r} |" + " |" * 10)
            continue
        lines.append(f"| {b} | {r['requests']} | {r['consumers']} | {r['operations']} | {r['http_5xx']} | "
                     f"{r['refused_4xx']} | {r['final_states']} | {len(r['not_terminal'])} | "
                     f"{r['consumers_complete']}/{r['consumers']} | {r['consumers_in_order']}/{r['consumers']} | "
                     f"{r['duplicates']} | {r['until_all_terminal_s']} |")
    lines += ["", "Iterations repeated = iterations the store had seen before the kill − the checkpoint's, at "
              "least 0 (progress is stored at most every progress_interval_s, so the store may not have seen "
              "the checkpoint's iteration yet; the worker may have run a few it never reported). A duplicate "
              "can only be the notification whose POST was in flight at the kill (delivery is at least once; "
              "its notificationId tells)."]
    (out / "service_trust.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--consumers", type=int, default=8)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=150)
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    if args.quick:
        args.requests, args.consumers, args.iterations = 40, 4, 60
    results: dict[str, Any] = {"when": datetime.now().isoformat(timespec="seconds"),
                               "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                               "command": " ".join(["bench/service_trust.py", *sys.argv[1:]]),
                               "restart": {}, "soak": {}}
    with tempfile.TemporaryDirectory(prefix="sluice-trust-") as d, databases(Path(d), args.backends.split(",")) as dbs:
        for b, make in dbs.items():
            if isinstance(make, str):
                results["restart"][b] = results["soak"][b] = make
                continue
            print(f"[{b}] restart", flush=True)
            results["restart"][b] = restart(Path(d), make(f"restart_{b}"), args.processes, args.iterations)
            print(json.dumps(results["restart"][b]), flush=True)
            print(f"[{b}] soak", flush=True)
            results["soak"][b] = soak(Path(d), make(f"soak_{b}"), args.requests, args.consumers, seed=1)
            print(json.dumps(results["soak"][b]), flush=True)
    write(results, Path(args.out))
    print((Path(args.out) / "service_trust.md").read_text())


if __name__ == "__main__":
    main()
