"""``sluice consumer ...``: the consumer side of the management service, over ProvMnS REST (httpx).

Every command talks to one producer, named by the URI of its ``MLTrainingFunction`` (``--producer``, or
the ``SLUICE_PRODUCER`` environment variable), with a bearer token (``--token`` or ``SLUICE_TOKEN``) and, over
HTTPS, a CA file (``--ca-file`` or ``SLUICE_CA_FILE``) and a client certificate where the producer asks for
one (``--client-cert``, ``--client-key``); ``fanout`` sends one request to several producers and
gathers their reports into one table (R4).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

WATCH_INTERVAL_S = 2.0
DEFAULT_PRODUCER = "http://127.0.0.1:8080/ProvMnS/v1920/SubNetwork=SN1/MLTrainingFunction=TF1"


def _client(args: argparse.Namespace, url: str | None = None) -> Any:
    from sluice.service.client import ProvMnSClient

    cert = (args.client_cert, args.client_key) if args.client_cert else None
    return ProvMnSClient(url or args.producer, timeout=args.timeout, token=args.token or None,
                         ca_file=args.ca_file or None, client_cert=cert)


def _doc(path: str, overrides: list[str]) -> dict[str, Any]:
    from sluice.config import read_toml

    return read_toml(path, overrides)


def _pairs(items: list[str]) -> dict[str, Any]:
    from sluice.config import apply_overrides

    return apply_overrides({}, items)


def _vs(resource: dict[str, Any], cid: str) -> Any:
    from sluice.service.client import vs_of

    return vs_of(resource, cid)


def _process_table(proc: dict[str, Any], title: str) -> Table:
    a = proc.get("attributes", {})
    ps = a.get("progressStatus", {})
    st = _vs(proc, "sluice-status") or {}
    table = Table(title=title)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    rows = [("process", proc.get("id", "")), ("status", ps.get("status", "")),
            ("progress", f"{ps.get('progressPercentage', 'n/a')} %"), ("state info", ps.get("progressStateInfo", "")),
            ("result", ps.get("resultStateInfo", "")), ("priority", str(a.get("priority", 0))),
            ("termination", a.get("terminationConditions", "")), ("iterations", str(st.get("iterations", 0)))]
    for k, v in sorted((st.get("metrics") or {}).items()):
        rows.append((k, f"{v:.4g}" if isinstance(v, float) else str(v)))
    for key in ("estimated_remaining_iterations", "estimated_remaining_s", "bytes_up", "bytes_down", "detail"):
        if st.get(key) is not None:
            v = st[key]
            rows.append((key.replace("_", " ") + (" (s)" if key.endswith("_s") else ""),
                         f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)))
    neg = _vs(proc, "sluice-negotiation") or {}
    if neg:
        rows.append(("negotiation", f"{neg.get('decidedBy')} / {neg.get('state')}"))
        for why in neg.get("rationale") or []:
            rows.append(("proposal", why))
    for label, key in (("report", "trainingReportRef"), ("model", "mLModelRef")):
        if a.get(key):
            rows.append((label, a[key]))
    for k, v in rows:
        table.add_row(k, v)
    return table


def _report_table(report: dict[str, Any], title: str) -> Table:
    from sluice.control.report import TrainingReport

    data = dict(_vs(report, "sluice-report") or {})
    data.pop("refused", None)
    table = Table(title=title)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    ref = report.get("attributes", {}).get("mLModelGeneratedRef")
    try:
        rows = TrainingReport.model_validate(data).rows()
    except ValueError:
        rows = [(k, json.dumps(v)) for k, v in data.items()]
    for k, v in rows:
        if k == "model path":  # the producer's own file; the consumer downloads the model by its reference
            continue
        table.add_row(k, v)
    table.add_row("mLModelGeneratedRef", ref or "none (no model was saved)")
    return table


# ------------------------------------------------------------------------------------------- commands


def _create(args: argparse.Namespace) -> int:
    doc = _doc(args.file, args.overrides)
    with _client(args) as c:
        out = c.create(doc, args.id)
        rid = out["id"]
        Console().print(f"created request [bold]{rid}[/] ({out['attributes']['requestStatus']})")
        if args.watch:
            return _watch_loop(c, rid, args.interval)
    return 0


def _list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        tree = c.tree()
        table = Table(title=f"Training requests — {c.url}")
        for col in ("request", "status", "process", "progress", "result"):
            table.add_column(col)
        for req in tree.get("MLTrainingRequest", []):
            procs = c.processes(req["id"], tree)
            p = procs[-1] if procs else {"id": "-", "attributes": {"progressStatus": {}}}
            ps = p["attributes"].get("progressStatus", {})
            table.add_row(req["id"], req["attributes"].get("requestStatus", ""), p["id"],
                          str(ps.get("progressPercentage", "")), ps.get("resultStateInfo", ""))
        Console().print(table)
    return 0


def _show(args: argparse.Namespace) -> int:
    with _client(args) as c:
        req = c.request(args.id)
        proc = c.process(args.id)
        if args.json:
            print(json.dumps({"request": req, "process": proc}, indent=2))
            return 0
        console = Console()
        console.print(f"request [bold]{args.id}[/]: {req['attributes'].get('requestStatus')}")
        console.print(_process_table(proc, f"Training process {proc['id']}"))
    return 0


def _watch_loop(c: Any, rid: str, interval: float) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    last: dict[str, Any] = {}
    with Progress(TextColumn("[bold blue]{task.fields[status]}"), BarColumn(), TextColumn("{task.percentage:>3.0f} %"),
                  TextColumn("it {task.fields[it]}"), TextColumn("{task.fields[metric]}"), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task(rid, total=100, status="…", it=0, metric="")
        for proc in c.watch(rid, interval=interval):
            last = proc
            ps = proc["attributes"].get("progressStatus", {})
            st = _vs(proc, "sluice-status") or {}
            metrics = st.get("metrics") or {}
            shown = next((f"{k} {metrics[k]:.4f}" for k in ("test_accuracy", "train_loss") if k in metrics), "")
            progress.update(task, completed=ps.get("progressPercentage") or 0, status=ps.get("status", ""),
                            it=st.get("iterations", 0), metric=shown)
    status = c.request(rid)["attributes"]["requestStatus"]
    console.print(f"request [bold]{rid}[/] {status}: {last.get('attributes', {}).get('progressStatus', {})}")
    try:
        console.print(_report_table(c.report(rid), f"Training report — {rid}"))
    except Exception as exc:  # noqa: BLE001 - a request cancelled early may have no report to show
        console.print(f"[yellow]{exc}[/]")
    return 0


def _watch(args: argparse.Namespace) -> int:
    with _client(args) as c:
        return _watch_loop(c, args.id, args.interval)


def _modify(args: argparse.Namespace) -> int:
    with _client(args) as c:
        term = _pairs(args.termination) if args.termination else None
        req = _pairs(args.requirements) if args.requirements else None
        c.modify(args.id, termination=term, requirements=req)
        if args.priority is not None:
            c.set_priority(args.id, args.priority)
        Console().print(f"modified request {args.id}")
    return 0


def _simple(verb: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        with _client(args) as c:
            out = getattr(c, verb)(args.id)
            Console().print(f"{verb} {args.id}: requestStatus {out.get('attributes', {}).get('requestStatus')}")
        return 0

    return run


def _accept(args: argparse.Namespace) -> int:
    with _client(args) as c:
        out = c.accept(args.id, _pairs(args.set) if args.set else None)
        Console().print(f"proposal of {args.id} {'modified' if args.set else 'accepted'}: "
                        f"{out['attributes'].get('terminationConditions')}")
    return 0


def _upload(args: argparse.Namespace) -> int:
    from sluice.control.inbox import load_arrays

    data = load_arrays(args.file)
    client = args.client if args.client is not None else data.get("client")
    with _client(args) as c:
        out = c.upload(args.id, data["X"], data["y"], client)
        Console().print(f"uploaded {data['X'].shape[0]} samples to {args.id}: "
                        f"{out.get('attributes', {}).get('progressStatus', {}).get('status')}")
    return 0


def _feedback(args: argparse.Namespace) -> int:
    with _client(args) as c:
        answer = c.feedback(args.id, args.metric, args.value)
        Console().print(f"feedback on {args.id}: {'accepted' if answer.get('accepted') else 'not accepted'} — "
                        f"{answer.get('reason', '')}")
    return 0


def _report(args: argparse.Namespace) -> int:
    with _client(args) as c:
        rep = c.report(args.id)
        if args.json:
            print(json.dumps(rep, indent=2))
        else:
            Console().print(_report_table(rep, f"Training report — {args.id}"))
    return 0


def _model(args: argparse.Namespace) -> int:
    with _client(args) as c:
        path = c.download_model(args.id, args.output)
        Console().print(f"model of {args.id} saved to {path} ({Path(path).stat().st_size} bytes)")
    return 0


def _fanout_one(args: argparse.Namespace, doc: dict[str, Any], url: str) -> tuple[str, dict[str, Any] | None, str]:
    """``(producer, its report or None, why there is none)``: what one producer of a fanout gave."""
    from sluice.service.client import MnSClientError, ProducerUnreachable

    step = "connecting"
    try:
        with _client(args, url) as c:
            step = "creating the request"
            out = c.create(doc, args.id)
            step = f"waiting for request {out['id']} to end"
            c.wait(out["id"], timeout=args.wait)
            step = f"reading the report of request {out['id']}"
            return url, c.report(out["id"]), ""
    except ProducerUnreachable as exc:
        return url, None, f"could not be reached while {step}: {exc}"
    except MnSClientError as exc:
        return url, None, f"answered HTTP {exc.status} while {step}: {exc}"
    except Exception as exc:  # noqa: BLE001 - one producer failing must not hide the others
        return url, None, f"failed while {step}: {exc}"


def _fanout(args: argparse.Namespace) -> int:
    """R4: the same requirements to several producers, their reports in one table; exit status 1 (and one
    line on stderr per producer, naming it and the cause) when a producer gave no report."""
    from concurrent.futures import ThreadPoolExecutor

    from rich.markup import escape

    doc = _doc(args.file, args.overrides)
    producers = args.to or [args.producer]
    with ThreadPoolExecutor(max_workers=len(producers)) as pool:
        results = list(pool.map(lambda url: _fanout_one(args, doc, url), producers))
    table = Table(title="Reports from every producer")
    for col in ("producer", "cause", "iterations", "duration s", "performance", "model"):
        table.add_column(col, overflow="fold")
    for url, rep, _ in results:
        if rep is None:
            table.add_row(url, "[red]no report[/]", "", "", "", "")
            continue
        r = _vs(rep, "sluice-report") or {}
        perf = ", ".join(f"{k} {v:.4g}" for k, v in sorted((r.get("performance") or {}).items())
                         if isinstance(v, float) and not k.startswith("train"))
        table.add_row(url, r.get("cause", ""), str(r.get("iterations", "")), f"{r.get('duration_s', 0):.2f}",
                      perf, rep["attributes"].get("mLModelGeneratedRef", "none"))
    Console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps([{"producer": u, "report": r, "error": e} for u, r, e in results],
                                              indent=2), encoding="utf-8")
    failed = [(url, err) for url, rep, err in results if rep is None]
    if not failed:
        return 0
    console = Console(stderr=True, soft_wrap=True)
    for url, err in failed:
        console.print(f"[bold red]error:[/] producer {escape(url)} gave no report: {escape(err)}", highlight=False)
    console.print(f"[bold red]error:[/] {len(failed)} of {len(results)} producers gave no report; the others' "
                  "reports are above", highlight=False)
    return 1


def _interval(q: argparse.ArgumentParser) -> None:
    q.add_argument("--interval", type=float, default=WATCH_INTERVAL_S, metavar="SECONDS",
                   help="seconds between two looks at the request while watching; each look fetches the "
                   "request and its processes only")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("consumer", help="ask a management service for models (ProvMnS client)",
                       description="Create, watch and steer training requests on a Sluice management service "
                       "(sluice serve) or any TS 28.105 ProvMnS producer.")
    p.add_argument("--producer", default=os.environ.get("SLUICE_PRODUCER", DEFAULT_PRODUCER),
                   help="URI of the producer's MLTrainingFunction (default: $SLUICE_PRODUCER or "
                   f"{DEFAULT_PRODUCER})")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for one HTTP answer")
    p.add_argument("--token", default=os.environ.get("SLUICE_TOKEN"),
                   help="bearer token (sluice token add; default: $SLUICE_TOKEN)")
    p.add_argument("--ca-file", default=os.environ.get("SLUICE_CA_FILE"),
                   help="CA certificates that verify an https producer (default: $SLUICE_CA_FILE, else the system's)")
    p.add_argument("--client-cert", help="client certificate (PEM) for a producer that asks for one (mutual TLS)")
    p.add_argument("--client-key", help="private key of --client-cert (default: in the certificate file)")
    cs = p.add_subparsers(dest="consumer_command", required=True, metavar="ACTION")

    def cmd(name: str, func: Any, help: str, with_id: bool = True) -> argparse.ArgumentParser:
        q = cs.add_parser(name, help=help, description=help)
        if with_id:
            q.add_argument("id", help="request id")
        q.set_defaults(func=func)
        return q

    q = cmd("create", _create, "create a training request from a job TOML file", with_id=False)
    q.add_argument("file", help="job TOML: engine, its sections, [model], [requirements], [termination], [request]")
    q.add_argument("--id", help="request id (default: the file's request.id, else the producer chooses)")
    q.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    q.add_argument("--watch", action="store_true", help="then watch it until it ends")
    _interval(q)
    cmd("list", _list, "list the producer's training requests", with_id=False)
    q = cmd("show", _show, "show a request and its training process")
    q.add_argument("--json", action="store_true")
    _interval(cmd("watch", _watch, "live progress of a request until it ends, then its report"))
    q = cmd("modify", _modify, "change termination parameters, requirements or priority of a request")
    q.add_argument("--termination", action="append", default=[], metavar="KEY=VALUE",
                   help="e.g. iterations=20 or performance.test_accuracy=0.9 (repeatable)")
    q.add_argument("--requirements", action="append", default=[], metavar="KEY=VALUE")
    q.add_argument("--priority", type=int)
    cmd("cancel", _simple("cancel"), "cancel a request")
    cmd("suspend", _simple("suspend"), "suspend a request")
    cmd("resume", _simple("resume"), "resume a suspended request")
    q = cmd("accept", _accept, "accept the producer's proposed parameters (or modify them with --set)")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    q = cmd("upload", _upload, "send training data (.npz with X, y) to a request's process")
    q.add_argument("file")
    q.add_argument("--client", type=int, help="federated runs: the client that gets the data")
    q = cmd("feedback", _feedback, "report a model's measured performance in use (may start a retraining)")
    q.add_argument("metric")
    q.add_argument("value", type=float)
    q = cmd("report", _report, "show the training report of a request")
    q.add_argument("--json", action="store_true")
    q = cmd("model", _model, "download the trained model of a request")
    q.add_argument("-o", "--output", required=True)
    q = cmd("fanout", _fanout, "send one request to several producers and gather their reports", with_id=False)
    q.add_argument("file")
    q.add_argument("--to", action="append", default=[], metavar="URL", help="a producer (repeatable)")
    q.add_argument("--id", help="request id used at every producer")
    q.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    q.add_argument("--wait", type=float, default=600.0, help="seconds to wait for each producer")
    q.add_argument("--json", help="also write the reports to this JSON file")
