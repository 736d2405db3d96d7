"""``sluice run --runtime flower``: a Sluice job on Flower's deployment engine, start to finish.

Locally (the default) it starts a :class:`LocalDeployment` in ``<run>/flower`` (TLS with a CA made there,
one SuperNode per terminal), submits the job, follows the run directory the ServerApp writes (progress from
``metrics.jsonl``, the end from ``report.json``) and stops every process it started, on success, failure
and Ctrl-C alike. Against a SuperLink elsewhere (``superlink=HOST:PORT``) it submits the job and streams
the run's log; the run directory is then on the SuperLink's host, and the exit status is the one of the report
there, which the ServerApp prints at the end of the log. ``node_args`` (``--node-arg``) give each local node
its own task arguments.

Failures end with a report, never a hang: a ServerApp that fails writes its error next to the run, and
when the SuperLink dies the ServerApp's calls time out (``link_timeout_s``) and it reports
``ENGINE_FAILURE``; if no report comes within that time and a margin, this runner writes one itself. So it
does for a run the SuperLink accepts but does not start within ``start_timeout_s`` (its own executor cannot
reach it, say, because its certificate does not name 127.0.0.1): the report gives the SuperLink's reason,
from its log when it runs here, else from the run's status, and the run is stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sluice.runs import new_run_path
from sluice.runtimes.flower.deploy import (
    DeploymentError,
    LocalDeployment,
    _bin,
    flower_env,
    log_reason,
    run_status,
    submit,
    write_connection,
)
from sluice.runtimes.flower.failure import failure_report, records_of
from sluice.runtimes.flower.rounds import DEFAULT_EMPTY_ROUNDS
from sluice.runtimes.jobs import Job


@dataclass
class FlowerOptions:
    """How to run a job on Flower (``sluice run --runtime flower`` options)."""

    nodes: int | None = None  # local SuperNodes; default: one per terminal
    insecure: bool = False
    superlink: str | None = None  # HOST:PORT of a running SuperLink; None = start a local deployment
    root_certificates: str | None = None
    round_timeout_s: float = 60.0
    link_timeout_s: float = 30.0
    node_wait_s: float = 120.0
    poll_s: float = 0.05
    start_timeout_s: float = 120.0  # a run the SuperLink accepted and has not started by then fails
    empty_rounds: int = DEFAULT_EMPTY_ROUNDS  # rounds in a row no node answers that end the run
    node_args: list[str] = field(default_factory=list)  # --node-arg [C:]NAME=VALUE (see node_args())
    simulation: bool = False  # Flower's Simulation Engine (Ray) instead of SuperNode processes
    ray_cpus: int | None = None  # CPUs of the local Ray instance it starts (None: Ray's default, every CPU)
    client_cpus: int = 1  # CPUs Ray reserves for each ClientApp running at once

    def federation_config(self, nodes: int) -> dict[str, Any]:
        """``flwr run --federation-config`` of a simulation with ``nodes`` virtual SuperNodes. With ``RAY_ADDRESS``
        set, Ray joins that cluster, whose size is its own (then ``ray_cpus`` is refused)."""
        cfg: dict[str, Any] = {"num-supernodes": int(nodes), "client-resources-num-cpus": int(self.client_cpus)}
        if self.ray_cpus is not None:
            if os.environ.get("RAY_ADDRESS"):
                raise DeploymentError("--ray-cpus sizes the local Ray instance; with RAY_ADDRESS set Ray joins that "
                                      "cluster, which has its own CPUs: unset one of them")
            cfg["init-args-num-cpus"] = int(self.ray_cpus)
        return cfg

    def run_config(self, min_nodes: int = 0) -> dict[str, Any]:
        return {"round-timeout": float(self.round_timeout_s), "link-timeout": float(self.link_timeout_s),
                "node-wait": float(self.node_wait_s), "min-nodes": int(min_nodes), "poll-interval": float(self.poll_s),
                "empty-rounds": int(self.empty_rounds)}


def node_args(specs: list[str], nodes: int) -> dict[int, dict[str, Any]]:
    """The task arguments of each local node from ``--node-arg`` items: ``C:NAME=VALUE`` for node ``C`` alone,
    ``NAME=VALUE`` for every node, where ``{c}`` in the value becomes the node's terminal. A value is read as
    TOML (a number, true, a quoted string), else kept as a string; a later item wins."""
    from sluice.config import parse_value

    out: dict[int, dict[str, Any]] = {}
    for spec in specs:
        head, eq, text = spec.partition("=")
        where, colon, name = head.rpartition(":") if ":" in head else ("", "", head)
        if not eq or not name.strip() or (colon and not where.strip().isdigit()):
            raise DeploymentError(f"--node-arg expects [C:]NAME=VALUE (C a terminal, NAME an argument of the task), "
                                  f"got {spec!r}")
        targets = [int(where)] if colon else list(range(nodes))
        for c in targets:
            if not 0 <= c < nodes:
                raise DeploymentError(f"--node-arg {spec!r}: node {c} is not one of the {nodes} local nodes")
            value = parse_value(text.strip().replace("{c}", str(c)))
            if not isinstance(value, str | int | float | bool):
                raise DeploymentError(f"--node-arg {spec!r}: a node setting is a string, number or boolean")
            out.setdefault(c, {})[name.strip()] = value
    return out


def _terminals(job: Job) -> int:
    """The job's number of terminals (:func:`sluice.runtimes.flower.engine.terminals`), its task built here."""
    from sluice.runtimes.flower.engine import terminals
    from sluice.tasks import load_task

    cfg = job.config
    return terminals(load_task(cfg.task, seed=cfg.seed, data=cfg.data, hidden=cfg.model.hidden), cfg)[0]


def _iterations(job: Job) -> int:
    t = job.termination
    return int(t.iterations) if t is not None and t.iterations is not None else int(job.config.train.rounds)


def _started(status: dict[str, Any]) -> bool:
    """Whether Flower's status of a run (:func:`run_status`) says it started (running, or already over)."""
    return str(status.get("status", "")).startswith(("running", "finished"))


def _not_started(job: Job, out: Path, home: Path, run_id: int, status: dict[str, Any], opts: FlowerOptions,
                 log: Path | None = None) -> dict[str, Any]:
    """Stop run ``run_id``, which the SuperLink accepted and has not started, and report why: ``ENGINE_FAILURE``
    with the SuperLink's reason, from its ``log`` (when it runs on this host) or from the run's status."""
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run([_bin("flwr"), "stop", str(run_id), "sluice"], env=flower_env(home), capture_output=True,
                       timeout=60, check=False)
    state = str(status.get("status") or "unknown")
    details = str(status.get("status-details") or "N/A")
    why = log_reason(log)
    if why:
        why = f"the SuperLink's log ({log}) says: {why}"
    else:
        why = ("its log on its host says why; often its own executor cannot connect to it: a SuperLink listening "
               "on 0.0.0.0 is reached at 127.0.0.1, which its certificate must name (sluice certs DIR --host ADDR "
               "names 127.0.0.1 and localhost too)")
    detail = (f"the SuperLink accepted Flower run {run_id} but did not start it within {opts.start_timeout_s:g} s "
              f"(status {state}{'' if details == 'N/A' else ': ' + details}); {why}")
    return failure_report(job, out, detail)


def _await_start(home: Path, run_id: int, opts: FlowerOptions) -> dict[str, Any]:
    """Flower's status of run ``run_id`` once it started, or the last one seen after ``start_timeout_s`` (a read
    that failed does not replace it). Each read (``flwr ls``) has 60 s, whatever the start timeout: on a busy
    machine one can take longer than a short start timeout, and the run's status would never be read. The
    last read begins once the start timeout has passed."""
    end = time.monotonic() + opts.start_timeout_s
    seen: dict[str, Any] = {}
    while True:
        last = time.monotonic() >= end
        seen = run_status(home, run_id, timeout_s=60.0) or seen
        if _started(seen) or last:
            return seen
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))


def _serverapp_pids(dep: LocalDeployment) -> list[int]:
    import psutil

    proc = dep.procs.get("superlink")
    if proc is None or proc.poll() is not None:
        return []
    out = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any("flwr-serverapp" in part for part in p.cmdline()):
                out.append(p.pid)
    return out


@dataclass
class _Watch:
    """What :func:`follow` has seen of the run between its looks."""

    start_by: float  # monotonic time by which the run must have started
    started: bool = False
    link_dead_at: float | None = None
    finished_at: float | None = None
    next_check: float = 0.0


def _look(job: Job, out: Path, dep: LocalDeployment, run_id: int, w: _Watch, seen: int, *, console: Console,
          opts: FlowerOptions) -> dict[str, Any] | None:
    """One look at the run beside its rows: its report, or the one written for a run that failed, never
    started or ended without one; None while it goes on."""
    report = out / "report.json"
    if report.exists():
        with contextlib.suppress(ValueError):
            return json.loads(report.read_text(encoding="utf-8"))
    err = out / "flower" / "server-error.txt"
    if err.exists():
        time.sleep(1.0)  # the report of a failure during training follows the error
        if not report.exists():
            raise DeploymentError("the ServerApp failed: " + err.read_text(encoding="utf-8").strip())
    w.started = w.started or seen > 0 or (out / "config.toml").exists()  # written as the ServerApp begins
    link = dep.procs.get("superlink")
    if link is not None and link.poll() is not None and w.link_dead_at is None:
        w.link_dead_at = time.monotonic()
        console.print(f"[red]the SuperLink exited (status {link.returncode}); waiting up to "
                      f"{opts.link_timeout_s + 15:g} s for the ServerApp's report[/]")
    if w.link_dead_at is not None:
        if time.monotonic() - w.link_dead_at > opts.link_timeout_s + 15:
            return failure_report(job, out, f"at round {seen + 1} the SuperLink exited{dep.exit_reason()}; the "
                                             "ServerApp left no report")
        return None
    late = not w.started and time.monotonic() > w.start_by
    if late or time.monotonic() > w.next_check:
        w.next_check = time.monotonic() + 15.0
        status = run_status(dep.home, run_id)
        w.started = w.started or _started(status)
        if not w.started and time.monotonic() > w.start_by:
            return _not_started(job, out, dep.home, run_id, status, opts, dep.logs / "superlink.log")
        if str(status.get("status", "")).startswith("finished") and w.finished_at is None:
            w.finished_at = time.monotonic()
        if w.finished_at is not None and time.monotonic() - w.finished_at > 10:
            return failure_report(job, out, f"the Flower run ended ({status.get('status')}) without a report; "
                                             f"see {dep.logs}")
    return None


def follow(job: Job, out: Path, dep: LocalDeployment, run_id: int, *, console: Console,
           opts: FlowerOptions, on_round: Any = None) -> dict[str, Any]:
    """Follow the run until its report exists; return the report document."""
    import os

    total = _iterations(job)
    seen = 0
    watch = _Watch(start_by=time.monotonic() + opts.start_timeout_s, next_check=time.monotonic() + 15.0)
    progress = Progress(TextColumn("[bold blue]round (flower)"), MofNCompleteColumn(), BarColumn(),
                        TextColumn("acc {task.fields[acc]}"), TextColumn("up {task.fields[up]}"),
                        TextColumn("down {task.fields[down]}"), TimeElapsedColumn(), console=console)
    task = progress.add_task("train", total=total, acc="-", up="0", down="0")
    cancelled = False
    with progress:
        while True:
            try:
                records = records_of(out)
                for r in records[seen:]:
                    acc = r.get("test_accuracy")
                    progress.update(task, completed=r.get("round", seen + 1),
                                    acc=f"{acc:.4f}" if acc is not None else "-",
                                    up=f"{r.get('cum_bytes_up', 0) / 1e6:.3f} MB",
                                    down=f"{r.get('cum_bytes_down', 0) / 1e6:.3f} MB")
                    if on_round is not None:
                        on_round(r)
                seen = len(records)
                report = _look(job, out, dep, run_id, watch, seen, console=console, opts=opts)
                if report is not None:
                    return report
                time.sleep(0.5)
            except KeyboardInterrupt:
                if cancelled:
                    raise
                cancelled = True
                pids = _serverapp_pids(dep)
                console.print("[yellow]cancelling after this round (Ctrl-C again to abort)[/]")
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGINT)
                if not pids:
                    raise


def run_on_flower(job: Job, out: str | None, opts: FlowerOptions, *, console: Console) -> int:
    """Run ``job`` on Flower (see the module docstring); return the exit status of its report."""
    from sluice.runtimes.flower.engine import node_data_refusal

    out_path = (Path(out) if out else new_run_path("run")).resolve()
    if out_path.exists() and any(out_path.iterdir()):
        raise DeploymentError(f"{out_path} exists and is not empty; name a new run directory with --out")
    refusal = node_data_refusal(job.requirements)
    if refusal is not None:
        raise DeploymentError(refusal)
    if opts.empty_rounds < 1:
        raise DeploymentError(f"--empty-rounds must be at least 1, got {opts.empty_rounds}")
    if opts.simulation and (opts.superlink is not None or opts.node_args):
        raise DeploymentError("--runtime flower-sim runs Flower's Simulation Engine here: --superlink and --node-arg "
                              "apply to --runtime flower")
    if opts.superlink is not None:
        if opts.node_args:
            raise DeploymentError("--node-arg sets up the nodes sluice run starts; the SuperNodes of a SuperLink "
                                  "elsewhere take theirs in --node-config 'task.NAME=VALUE'")
        return _run_remote(job, out_path, opts, console=console)
    terminals = _terminals(job)
    nodes = opts.nodes or terminals
    if not 1 <= nodes <= terminals:
        raise DeploymentError(f"--nodes must be in 1..{terminals} (data.num_clients: one terminal per node), "
                              f"got {nodes}")
    own = node_args(opts.node_args, nodes)
    work = out_path / "flower"
    work.mkdir(parents=True, exist_ok=True)
    federation = opts.federation_config(nodes) if opts.simulation else None
    dep = LocalDeployment(work, nodes=nodes, tls=not opts.insecure, terminals=terminals, node_args=own,
                          simulation=opts.simulation)
    try:
        dep.start()
        how = (f"Flower's Simulation Engine, {nodes} virtual SuperNodes" if opts.simulation else f"{nodes} SuperNodes")
        console.print(f"[bold]sluice run --runtime {'flower-sim' if opts.simulation else 'flower'}[/]: SuperLink "
                      f"{dep.address} ({'insecure' if opts.insecure else 'TLS, CA ' + str(dep.certs.ca)}), {how} "
                      f"for {terminals} terminals; logs in {dep.logs}")
        try:
            sub = submit(job.dump(), out_path, work, dep.home, run_config=opts.run_config(min(nodes, terminals)),
                         federation_config=federation)
        except DeploymentError as exc:
            link = dep.exit_reason()  # the SuperLink it started may have died since it listened
            raise DeploymentError(f"{exc}; the SuperLink exited{link}" if link else str(exc)) from None
        console.print(f"Flower run {sub.run_id}")
        report = follow(job, out_path, dep, sub.run_id, console=console, opts=opts)
        _write_flower_counts(out_path, dep.home, sub.run_id, console)
    finally:
        dep.stop()
    return _show(report, out_path, console)


def _write_flower_counts(out: Path, home: Path, run_id: int, console: Console) -> None:
    """``flower.json``: Sluice's payload bytes beside what Flower counted for the whole run."""
    from rich.table import Table

    records = records_of(out)
    status: dict[str, Any] = {}
    for _ in range(10):  # the run's counters are final once Flower marks it finished
        status = run_status(home, run_id)
        if str(status.get("status", "")).startswith("finished") or not status:
            break
        time.sleep(1.0)
    traffic = status.get("network-traffic", {})
    doc = {
        "run_id": run_id, "flower_status": status.get("status"),
        "sluice_bytes_up": sum(int(r.get("bytes_up", 0)) for r in records),
        "sluice_bytes_down": sum(int(r.get("bytes_down", 0)) for r in records),
        "flower_object_bytes_up": sum(int(r.get("flower_bytes_up", 0)) for r in records),
        "flower_object_bytes_down": sum(int(r.get("flower_bytes_down", 0)) for r in records),
        "superlink_inbound_bytes": traffic.get("inbound-bytes"),
        "superlink_outbound_bytes": traffic.get("outbound-bytes"),
        "compute_time": status.get("compute-time"),
        "rounds": len(records),
    }
    (out / "flower.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    table = Table(title="Bytes: Sluice payload vs Flower")
    table.add_column("")
    table.add_column("up (terminals → server)", justify="right")
    table.add_column("down (server → terminals)", justify="right")
    table.add_row("Sluice messages (len)", str(doc["sluice_bytes_up"]), str(doc["sluice_bytes_down"]))
    table.add_row("Flower objects of those messages", str(doc["flower_object_bytes_up"]),
                  str(doc["flower_object_bytes_down"]))
    table.add_row("SuperLink traffic counter (whole run)", str(doc["superlink_inbound_bytes"]),
                  str(doc["superlink_outbound_bytes"]))
    console.print(table)


def _show(report: dict[str, Any], out: Path, console: Console) -> int:
    from sluice.control import TrainingReport
    from sluice.runtimes.training import report_table

    parsed = TrainingReport.model_validate(report)
    console.print(report_table(parsed, f"Training report — {out}"))
    return parsed.exit_code


def _run_remote(job: Job, out: Path, opts: FlowerOptions, *, console: Console) -> int:
    """Submit to a running SuperLink, wait until it starts the run (else report ``ENGINE_FAILURE``), then
    stream the run's log until it ends."""
    import tempfile

    if not opts.insecure and not opts.root_certificates:
        raise DeploymentError("a SuperLink elsewhere needs --root-certificates CA.pem (its CA), or --insecure "
                              "for a SuperLink started with --insecure")
    with tempfile.TemporaryDirectory(prefix="sluice-flower-") as tmp:
        work = Path(tmp)
        home = work / "flwr-home"
        write_connection(home, "sluice", opts.superlink,
                         None if opts.insecure else Path(opts.root_certificates))
        sub = submit(job.dump(), out, work, home, run_config=opts.run_config())
        console.print(f"Flower run {sub.run_id} on {opts.superlink}; the run directory {out} is written on "
                      "the SuperLink's host")
        stop = [_bin("flwr"), "stop", str(sub.run_id), "sluice"]
        try:
            status = _await_start(home, sub.run_id, opts)
            if not _started(status):
                console.print(f"[red]Flower run {sub.run_id} did not start within {opts.start_timeout_s:g} s[/]")
                return _show(_not_started(job, out, home, sub.run_id, status, opts), out, console)
            code = stream_log(home, sub.run_id)
        except KeyboardInterrupt:
            subprocess.run(stop, env=flower_env(home), check=False, timeout=60)
            raise
        status = str(run_status(home, sub.run_id).get("status", ""))
    console.print(f"Flower run {sub.run_id}: {status or 'status unknown'}")
    local_report = out / "report.json"
    if local_report.exists():  # the SuperLink runs on this host
        return _show(json.loads(local_report.read_text(encoding="utf-8")), out, console)
    if code is not None:  # the report's exit status, as the ServerApp printed it
        return code
    return 0 if status == "finished:completed" else 9


_EXIT_LINE = re.compile(r"sluice: training finished, exit status (\d+)")


def stream_log(home: Path, run_id: int) -> int | None:
    """Print the run's log here as it comes (``flwr log --stream``) until the run ends; the exit status of its
    report, which the ServerApp prints last (None when the log does not say: the run ended otherwise)."""
    import sys

    proc = subprocess.Popen([_bin("flwr"), "log", str(run_id), "sluice", "--stream"], env=flower_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    code = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            found = _EXIT_LINE.search(line)
            if found:
                code = int(found.group(1))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return code
