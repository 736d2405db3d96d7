"""What a job's engine can report, asked before any training, and the refusal of what it cannot.

A request is checked against the engine its job builds before the request is accepted: the metrics the
engine reports (with direction and range, :class:`sluice.metrics.MetricSpec`), whether it counts network
bytes, and the model type its task trains. :class:`Prober` asks a short-lived process (from the workers'
forkserver, so that torch and the datasets never load in the web server) to build the job's engine, not
start it, and read them; the answer is cached per engine configuration. A chained job reports what every
one of its producers' jobs reports (:func:`chain_capabilities`: each producer's job, overrides merged, is
probed here as that producer would build it). A job the probe cannot build, or a chained job whose
producers' jobs cannot all be probed here (one names no engine, or a task this service does not know), is
not checked here: its worker checks the same when it builds the engine and refuses the request before
training (``refused``, :mod:`sluice.service.worker`), and a producer refuses what it cannot report.

:func:`fit_job` refuses (400, with the 3GPP error body and the metrics the engine reports):

* a ``performanceRequirements`` metric the engine does not report. A 3GPP ``performanceMetric`` is free
  text: it names the reported metric as written, as a Sluice alias (``accuracy``), in any case (``RMSE`` is
  ``test_rmse``) or without the ``test_`` prefix; the requirement keeps the reported name;
* a termination or requirement criterion on a metric the engine does not report, or with a threshold
  outside the metric's range (accuracy 1.01), as :func:`sluice.control.monitor.check_criteria` judges it;
* a model type (``aIMLInferenceName`` or the job's ``model.type``) the job does not train: another than
  the type its task declares, if it declares one. A type is otherwise a label, unless the parameters in
  force judge it: a producer's proposal (:func:`fit_proposal`) or a consumer's ``training_error`` on the
  type's error metric (coverage or energy error) that the engine does not report is refused.

Without a probe's answer the thresholds of the metrics Sluice knows (:data:`sluice.metrics.KNOWN`) are
still held to their ranges.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sluice.errors import ConfigError
from sluice.metrics import KNOWN, MetricSpec, canonical
from sluice.service.nrm import MnSError
from sluice.service.vsdata import StoredJob

JOB = "VsDataContainer/sluice-job"
PERF = "performanceRequirements"
NAME = "aIMLInferenceName"
PROBED_KINDS = ("local", "hfl", "split")


@dataclass(frozen=True)
class Capabilities:
    """What the engine of one job reports."""

    kind: str
    metrics: dict[str, MetricSpec]
    counts_bytes: bool
    model_type: str | None

    @property
    def reporter(self) -> str:
        if self.kind == "chain":
            return "every producer's job of this chain"
        return f"the {self.kind} engine of this job"

    def listing(self) -> str:
        return ", ".join(sorted(self.metrics)) or "no metrics"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "counts_bytes": self.counts_bytes, "model_type": self.model_type,
                "metrics": {n: [s.higher_is_better, s.low, s.high] for n, s in self.metrics.items()}}

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> Capabilities | None:
        if not doc:
            return None
        metrics = {n: MetricSpec(n, bool(h), lo, hi) for n, (h, lo, hi) in doc["metrics"].items()}
        return cls(doc["kind"], metrics, bool(doc["counts_bytes"]), doc.get("model_type"))


def probe_main(kind: str, raw: dict[str, Any], conn: Any) -> None:
    """In a child process: build the engine of job ``raw`` (never started) and send what it reports."""
    try:
        from sluice.runtimes.jobs import job_from_dict

        engine = job_from_dict(kind, raw).build()
        specs = dict(engine.metrics)  # an engine that loads its task lazily loads it here
        task = getattr(engine, "task_def", None) or getattr(engine, "task", None)
        model_type = _model_type(getattr(task, "model_type", None))
        conn.send({"ok": True, "caps": Capabilities(kind, specs, bool(getattr(engine, "counts_bytes", True)),
                                                    model_type).to_json()})
    except Exception as exc:  # noqa: BLE001 - the worker reports it when it builds the job
        conn.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def _model_type(declared: Any) -> str | None:
    """The type a task declares (``"coverage problem analysis"``) as a job's ``model.type`` names it (the
    3GPP name); a type that does not normalise stays as declared."""
    from sluice.control.params import normalise_model_type

    if not isinstance(declared, str):
        return None
    try:
        return normalise_model_type(declared)
    except ValueError:
        return declared


class Prober:
    """Asks a child process of ``ctx`` what a job's engine reports; remembers the last ``size`` answers."""

    def __init__(self, ctx: Any, timeout_s: float = 60.0, size: int = 256) -> None:
        self.ctx, self.timeout_s, self.size = ctx, timeout_s, size
        self._cache: OrderedDict[str, Capabilities | None] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, kind: str, raw: dict[str, Any]) -> Capabilities | None:
        """What the engine of job ``raw`` reports; None when it cannot be asked here."""
        if kind not in PROBED_KINDS:
            return None
        model = {k: v for k, v in (raw.get("model") or {}).items() if k not in ("id", "version", "type")}
        raw = {**raw, "model": model} if "model" in raw else raw
        key = json.dumps([kind, raw], sort_keys=True, default=str)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        caps = self._probe(kind, raw)
        with self._lock:
            self._cache[key] = caps
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return caps

    def _probe(self, kind: str, raw: dict[str, Any]) -> Capabilities | None:
        parent, child = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=probe_main, args=(kind, raw, child), name="sluice-probe", daemon=True)
        try:
            proc.start()
            child.close()
            answer = parent.recv() if parent.poll(self.timeout_s) else {"ok": False}
        except (EOFError, OSError):
            answer = {"ok": False}
        finally:
            parent.close()
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        return Capabilities.from_json(answer.get("caps")) if answer.get("ok") else None


def chain_capabilities(raw: dict[str, Any], probe: Any) -> Capabilities | None:
    """What a chained job ``raw`` can report: the metrics every producer's job reports (``probe(kind, job)``
    answers for one job), no network bytes (a chain counts none), the model type when all train the same one;
    None when a producer's job cannot be probed (it names no engine: the producer's default decides)."""
    from sluice.config import merge_patch

    inner = raw.get("job") if isinstance(raw.get("job"), dict) else {}
    overrides = raw.get("overrides") if isinstance(raw.get("overrides"), dict) else {}
    found: list[Capabilities] = []
    for name in raw.get("producers") or []:
        job = merge_patch(inner, overrides.get(name) or {})
        kind = job.pop("engine", None)
        caps = probe(kind, job) if kind in PROBED_KINDS else None
        if caps is None:
            return None
        found.append(caps)
    if not found:
        return None
    metrics = {n: s for n, s in found[0].metrics.items() if all(n in c.metrics for c in found[1:])}
    types = {c.model_type for c in found}
    return Capabilities("chain", metrics, False, types.pop() if len(types) == 1 else None)


# ------------------------------------------------------------------------------------------- the checks


def reported_name(metric: str, caps: Capabilities) -> str | None:
    """The reported metric a 3GPP ``performanceMetric`` names (see the module docstring), or None."""
    low = metric.strip().lower()
    for name in (metric, canonical(metric), low, canonical(low), f"test_{low}"):
        if name in caps.metrics:
            return name
    return None


def _refuse(problems: list[tuple[str, str]], caps: Capabilities | None) -> None:
    if not problems:
        return
    tail = f" ({caps.reporter} reports {caps.listing()})" if caps is not None else ""
    text = "; ".join(dict.fromkeys(p for _, p in problems))
    raise MnSError(400, f"the request asks for what its job cannot report: {text}{tail}",
                   bad_attributes=list(dict.fromkeys(a for a, _ in problems)))


def _where(line: str, from_3gpp: set[str]) -> str:
    """The attribute a problem of :func:`check_criteria` belongs to."""
    if line.startswith("requirements.performance"):
        name = line.partition("'")[2].partition("'")[0] or line.partition(" for ")[2].partition(" ")[0]
        return PERF if name in from_3gpp else "VsDataContainer/sluice-requirements"
    if line.startswith("requirements."):
        return "VsDataContainer/sluice-requirements"
    return "VsDataContainer/sluice-termination"


def _known_ranges(termination: Any, requirements: Any, from_3gpp: set[str]) -> list[tuple[str, str]]:
    problems = []
    named = [("termination.performance", n, c.threshold) for n, c in termination.performance.items()]
    if requirements is not None:
        named += [("requirements.performance", n, v) for n, v in requirements.performance.items()]
    for where, name, value in named:
        if name in KNOWN:
            try:
                KNOWN[name].check_threshold(value, "threshold")
            except ValueError as exc:
                line = f"{where}: {exc}"
                problems.append((_where(line, from_3gpp) if where.startswith("req") else
                                 "VsDataContainer/sluice-termination", line))
    return problems


def fit_job(job: StoredJob, attrs: dict[str, Any], caps: Capabilities | None) -> StoredJob:
    """``job`` (the service's parsed job: ``model``, ``requirements``, ``termination``) with its 3GPP metric
    names replaced by the reported ones, after refusing (400) what its engine cannot report."""
    from sluice.control.monitor import check_criteria
    from sluice.control.params import Termination, parse_model, parse_requirements, parse_termination

    perf3 = [p["performanceMetric"] for p in attrs.get(PERF) or [] if isinstance(p, dict)]
    problems: list[tuple[str, str]] = []
    req = dict(job.requirements or {})
    if caps is not None and req.get("performance"):
        renamed = {}
        for name, value in req["performance"].items():
            got = reported_name(name, caps) if name in perf3 else name
            if got is None:
                problems.append((PERF, f"performanceRequirements: metric {name!r} is not reported"))
            renamed[got or name] = value
        req["performance"] = renamed
    _refuse(problems, caps)
    from_3gpp = {reported_name(n, caps) or n for n in perf3} if caps is not None else set(perf3)
    termination = parse_termination(job.termination) if job.termination else Termination()
    requirements = parse_requirements(req) if req else None
    model = parse_model(job.model)
    if caps is None:
        _refuse(_known_ranges(termination, requirements, from_3gpp), None)
        return job.model_copy(update={"requirements": req or job.requirements})
    type_at = NAME if attrs.get(NAME) else JOB
    if model.type is not None and caps.model_type is not None and model.type != caps.model_type:
        problems.append((type_at, f"model type {model.type} is not what this job trains ({caps.model_type})"))
    try:
        check_criteria(termination, requirements, model, caps.metrics, counts_bytes=caps.counts_bytes,
                       reporter=caps.reporter)
    except ConfigError as exc:
        for line in str(exc).split("\n  ")[1:]:
            problems.append((_where(line, from_3gpp), line.split("; " + caps.reporter)[0]))
    _refuse(problems, caps)
    return job.model_copy(update={"requirements": req or job.requirements, "reports": caps.to_json(),
                                  "type_at": type_at})


def fit_proposal(termination: dict[str, Any], job: StoredJob) -> None:
    """Refuse (400) termination parameters the producer proposed for ``job`` that its engine cannot honour."""
    from sluice.control.monitor import check_criteria
    from sluice.control.params import parse_model, parse_requirements, parse_termination

    caps = Capabilities.from_json(job.reports)
    if caps is None:
        return
    try:
        check_criteria(parse_termination(termination), parse_requirements(job.requirements) if job.requirements
                       else None, parse_model(job.model), caps.metrics, counts_bytes=caps.counts_bytes,
                       reporter=caps.reporter)
    except ConfigError as exc:
        lines = [line.split("; " + caps.reporter)[0] for line in str(exc).split("\n  ")[1:]]
        mtype = job.model.get("type")
        _refuse([(job.type_at or JOB, f"model type {mtype} is judged by its training error, and {line}")
                 if mtype and line.startswith("termination.training_error") else
                 ("VsDataContainer/sluice-negotiation", f"the producer's policy proposes {line}")
                 for line in lines], caps)


def inference_type(name: Any, model_type: str | None) -> str | None:
    """The model type an ``aIMLInferenceName`` names (None when it names none); 400 when the job's own
    ``model.type`` is another."""
    from sluice.control.params import normalise_model_type

    try:
        named = normalise_model_type(name) if isinstance(name, str) and name else None
        own = normalise_model_type(model_type) if isinstance(model_type, str) else None
    except ValueError:
        return None
    if named and own and named != own:
        raise MnSError(400, f"aIMLInferenceName names model type {named}; the job's model.type is {own}",
                       bad_attributes=[NAME, JOB])
    return named
