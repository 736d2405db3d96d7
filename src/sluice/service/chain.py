"""Chained management functions: a service that is itself the consumer of other producer services.

A cross-domain service receives one ``MLTrainingRequest`` whose job is ``engine = "chain"`` and splits it
into one request per domain producer it names (TS 28.105 §4a: an MnS producer may consume the MnS of
other producers; seed 000 "cross-domain → domain management")::

    [sluice-job]                       # the request's job (vsData of the sluice-job container)
    engine = "chain"
    producers = ["east", "west"]      # names of the [producers] table of the service's configuration
    job = { engine = "local", data = { dataset = "digits" } }   # what each producer trains
    overrides = { west = { data = { test_fraction = 0.3 } } }  # per producer, merged into job (RFC 7396)

Where the producers are (their ``MLTrainingFunction`` URIs, tokens, CA files) is the operator's choice,
in the service's configuration (``[producers.east] url = "https://…"``), never the consumer's: the
service adds it when it starts the process. Each producer gets the chain's model identity and the
termination parameters and requirements in force (decided by the consumer, as far as the producer is
concerned); a change of them while training runs is passed on.

:class:`ChainEngine` speaks the engine protocol, so the chain's own process, report and notifications are
those of any other process:

* iteration ``k`` of the chain ends when every producer still training has done ``k`` iterations; its
  metrics are the unweighted mean over producers of each one's latest metrics;
* when every producer has ended, the chain ends at the iteration count of the one that trained longest
  (catching up one iteration per call when producers ended between two polls) with their combined cause:
  ``CRITERION_MET`` when each met its criterion, ``BUDGET_EXHAUSTED`` when one ran out of budget; the
  detail names each producer's cause and reason;
* a producer whose process fails ends the chain at once with that producer's cause and reason; one that
  cannot be reached for ``producer_timeout_s`` seconds (or that lost the request: HTTP 404) ends it with
  ``ENGINE_FAILURE`` naming the producer, its URI and the last error. The other producers' requests are
  cancelled, so no training is left running behind a chain that ended; a producer that cannot be reached
  then is asked again by the chain's service until it acknowledges (:mod:`sluice.service.chain_cancels`);
* ``suspend``/``resume`` are passed to every producer; ``save`` cancels producers still training (a
  criterion of the chain fired first), waits for their reports and writes one zip file holding each
  producer's model and a ``chain.json`` manifest of where each came from and how it ended;
* ``checkpoint``/``restore`` keep the producers' request ids, so a restarted service follows the same
  requests instead of starting new ones; a chain without a checkpoint starts again under the same chain id
  (the service derives it from the chain's process) and follows the requests its producers already hold
  (its iterations catch up with theirs, one per call);
* ``detach`` (the worker lost its service: it was stopped or killed) leaves the producers' requests
  training: ``iterate`` returns at once, and ``save`` and ``stop`` cancel nothing, so the restarted service
  follows them to their end.
"""

from __future__ import annotations

import json
import time
import uuid
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from sluice.config import merge_patch
from sluice.engine import IterationEvent
from sluice.errors import ConfigError, DataError, SluiceError
from sluice.metrics import KNOWN, MetricSpec
from sluice.schema import Section

ENDED = ("FINISHED", "CANCELLED", "FAILED")


class ProducerEndpoint(Section):
    """Where a domain producer is and how to reach it (the service's configuration, never a request)."""

    url: str = Field(description="URI of the producer's MLTrainingFunction (…/ProvMnS/v1920/SubNetwork=…/"
                                 "MLTrainingFunction=…)")
    token: str | None = Field(None, description="bearer token of this service at the producer")
    ca_file: str | None = Field(None, description="CA certificates that verify the producer's TLS certificate")
    timeout_s: float = Field(10.0, gt=0, description="timeout of one HTTP call to the producer")


class ChainConfig(Section):
    """The job of a chained request (see the module docstring)."""

    producers: list[str] = Field(min_length=1, description="producers (names of the service's [producers])")
    job: dict[str, Any] = Field(default_factory=dict, description="the job each producer trains")
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                                 description="per producer, merged into job (RFC 7396)")
    poll_interval_s: float = Field(0.5, gt=0, description="how often the producers are asked for progress")
    producer_timeout_s: float = Field(30.0, gt=0, description="how long a producer may stay unreachable")
    model: dict[str, Any] = Field(default_factory=dict, description="only the identity (id, version, type)")
    endpoints: dict[str, ProducerEndpoint] = Field(default_factory=dict,
                                                   description="filled in by the service from [producers]")
    chain_id: str | None = Field(None, pattern=r"^chain-[A-Za-z0-9_.\-~:]+$",
                                 description="filled in by the service from the chain's process (its producers' "
                                 "requests are <chain_id>-<producer>); None: a random one")

    @field_validator("producers")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"producers must be distinct, got {v}")
        return v

    @field_validator("model")
    @classmethod
    def _identity_only(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v:
            raise ValueError(f"a chain's [model] holds only id, version and type; model settings go in job "
                             f"(got {sorted(v)})")
        return v


@dataclass
class _Producer:
    """One producer of the chain and what was last seen of its request."""

    name: str
    endpoint: ProducerEndpoint
    client: Any = None
    rid: str | None = None
    last_ok: float = field(default_factory=time.monotonic)
    last_error: str = ""
    status: str = "NOT_STARTED"
    iterations: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    cause: str = ""
    detail: str = ""
    cancelled: bool = False  # by the chain itself

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def where(self) -> str:
        return f"producer {self.name} ({self.endpoint.url})"


class ChainEngine:
    """Trains a job at several producer services and reports them as one process (module docstring)."""

    def __init__(self, cfg: ChainConfig, *, clock: Any = time.monotonic, sleep: Any = time.sleep) -> None:
        missing = [p for p in cfg.producers if p not in cfg.endpoints]
        if missing:
            raise ConfigError(f"no endpoint for producer(s) {', '.join(missing)}: the service's configuration "
                              "must name them under [producers]")
        unknown = sorted(set(cfg.overrides) - set(cfg.producers))
        if unknown:
            raise ConfigError(f"overrides name producers that are not in the chain: {', '.join(unknown)}")
        self.cfg = cfg
        self.clock, self.sleep = clock, sleep
        self.producers = [_Producer(n, cfg.endpoints[n]) for n in cfg.producers]
        self.chain_id = cfg.chain_id or f"chain-{uuid.uuid4().hex[:10]}"
        self.k = 0
        self.termination: dict[str, Any] | None = None
        self.requirements: dict[str, Any] | None = None
        self.identity: dict[str, Any] = {}
        self._started = False
        self._detached = False

    # ------------------------------------------------------------------ engine protocol
    @property
    def metrics(self) -> Mapping[str, MetricSpec]:
        """Every metric Sluice knows: a producer refuses criteria on metrics its engine does not report."""
        return KNOWN

    @property
    def counts_bytes(self) -> bool:
        return False

    def delegate(self, termination: Any, requirements: Any, model: Any) -> None:
        """The termination parameters, requirements and model identity in force (the process calls this
        before training and after every change); passed on to producers already training."""
        self.termination = None if termination is None else termination.model_dump(mode="json", exclude_none=True)
        self.requirements = None if requirements is None else requirements.model_dump(
            mode="json", exclude_none=True, exclude_defaults=True)
        self.identity = {k: v for k, v in model.model_dump(mode="json").items() if v is not None}
        if self._started:
            for p in self.producers:
                if p.rid and not p.ended:
                    self._try(p, lambda c, p=p: c.modify(p.rid, termination=self.termination,
                                                         requirements=self.requirements))

    def start(self) -> None:
        if self._started:
            return
        created: list[_Producer] = []
        try:
            for p in self.producers:
                p.client = self._client(p.endpoint)
            for p in self.producers:
                if p.rid is None:
                    p.rid = f"{self.chain_id}-{p.name}"
                    self._create(p)
                created.append(p)
        except BaseException:  # the process calls stop() only after a successful start
            self._cancel_all(created)
            self._close()
            raise
        self._started = True

    def iterate(self) -> IterationEvent:
        t0 = self.clock()
        while True:
            if self._detached:
                return IterationEvent(self.k + 1, self._metrics(), seconds=self.clock() - t0, anomaly="CANCELLED",
                                      detail="the chain's service went away; its producers' requests go on")
            for p in self.producers:
                if not p.ended:
                    self._poll(p)
            failed = self._failure()
            if failed is not None:
                self._cancel_all(self.producers)
                return IterationEvent(self.k + 1, self._metrics(), seconds=self.clock() - t0,
                                      anomaly=failed[0], detail=failed[1])
            training = [p for p in self.producers if not p.ended]
            if not training:
                self.k += 1
                if max(p.iterations for p in self.producers) > self.k:  # producers ended between two polls:
                    return IterationEvent(self.k, self._metrics(), seconds=self.clock() - t0)  # catch up
                bad = [p for p in self.producers if p.cause != "CRITERION_MET"]
                cause = "CRITERION_MET" if not bad else "BUDGET_EXHAUSTED"
                return IterationEvent(self.k, self._metrics(), seconds=self.clock() - t0, anomaly=cause,
                                      detail="every producer ended: " + self._summary())
            if min(p.iterations for p in training) > self.k:
                self.k += 1
                return IterationEvent(self.k, self._metrics(), seconds=self.clock() - t0)
            self.sleep(self.cfg.poll_interval_s)

    def suspend(self) -> None:
        for p in self.producers:
            if p.rid and not p.ended:
                self._try(p, lambda c, p=p: c.suspend(p.rid))

    def resume(self) -> None:
        for p in self.producers:
            if p.rid and not p.ended:
                self._try(p, lambda c, p=p: c.resume(p.rid))

    def stop(self) -> None:
        """Cancel what still trains (unless detached) and close the connections."""
        self._cancel_all(self.producers)
        self._close()

    def detach(self) -> None:
        """The service that steers this chain went away (stopped or killed): leave the producers' requests
        training, for the restarted service to follow; end at once (called from another thread)."""
        self._detached = True

    def add_data(self, data: Any) -> None:
        self.check_data(data)

    def check_data(self, data: Any) -> None:
        raise DataError("a chained request takes no training data: send it to the producers' requests")

    def save(self, path: str) -> str:
        """One zip: each producer's model as ``<producer>/<file>`` and ``chain.json`` (see the module
        docstring). Producers still training are cancelled first; their model so far is kept. Detached: only
        the manifest, nothing is cancelled or fetched."""
        if self._detached:
            out = Path(path).with_suffix(".zip")
            with zipfile.ZipFile(out, "w") as zf:
                zf.writestr("chain.json", json.dumps({"chain": self.chain_id, "detached": True,
                                                      "requests": {p.name: p.rid for p in self.producers}}))
            return str(out)
        self._cancel_all(self.producers)
        deadline = self.clock() + self.cfg.producer_timeout_s
        while any(not p.ended for p in self.producers if p.rid) and self.clock() < deadline:
            for p in self.producers:
                if p.rid and not p.ended:
                    self._poll(p)
            if any(not p.ended for p in self.producers if p.rid):
                self.sleep(self.cfg.poll_interval_s)
        out = Path(path).with_suffix(".zip")
        manifest: dict[str, Any] = {"chain": self.chain_id, "producers": {}}
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for p in self.producers:
                entry: dict[str, Any] = {"url": p.endpoint.url, "request": p.rid, "status": p.status,
                                         "cause": p.cause, "detail": p.detail, "iterations": p.iterations,
                                         "metrics": p.metrics}
                try:
                    model = p.client.model(p.rid)
                    blob = p.client.download_model(p.rid, out.parent / f".{p.name}.model")
                    name = f"{p.name}/{_model_file(model)}"
                    zf.write(blob, name)
                    blob.unlink()
                    entry["model"] = name
                except SluiceError as exc:
                    entry["model"] = None
                    entry["model_error"] = str(exc)
                manifest["producers"][p.name] = entry
            zf.writestr("chain.json", json.dumps(manifest, indent=2))
        return str(out)

    def checkpoint(self) -> bytes:
        """The producers' request ids and the chain's iteration."""
        return json.dumps({"chain": self.chain_id, "k": self.k,
                           "requests": {p.name: p.rid for p in self.producers}}).encode()

    def restore(self, buf: bytes) -> None:
        state = json.loads(buf)
        self.chain_id, self.k = state["chain"], int(state["k"])
        for p in self.producers:
            p.rid = state["requests"].get(p.name)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _client(ep: ProducerEndpoint) -> Any:
        from sluice.service.client import ProvMnSClient

        return ProvMnSClient(ep.url, timeout=ep.timeout_s, token=ep.token, ca_file=ep.ca_file)

    def _close(self) -> None:
        for p in self.producers:
            if p.client is not None:
                p.client.close()
                p.client = None

    def _job_for(self, p: _Producer) -> dict[str, Any]:
        doc = merge_patch(self.cfg.job, self.cfg.overrides.get(p.name) or {})
        doc["model"] = {**(doc.get("model") or {}), **self.identity}
        if self.termination is not None:
            doc["termination"] = self.termination
            doc["request"] = {"decided_by": "consumer"}
        if self.requirements:
            doc["requirements"] = self.requirements
        return doc

    def _create(self, p: _Producer) -> None:
        """Create the producer's request, or follow it when the producer holds it already (the chain starts
        again after a restart of its service); retrying while it is unreachable for up to the timeout."""
        from sluice.service.client import MnSClientError

        deadline = self.clock() + self.cfg.producer_timeout_s
        sent = False  # a create whose answer was lost may still have been carried out
        while True:
            try:
                if not self._held(p):
                    sent = True
                    p.client.create(self._job_for(p), p.rid)
                p.last_ok = self.clock()
                return
            except MnSClientError as exc:
                if sent and self._held_now(p):
                    p.last_ok = self.clock()
                    return
                raise SluiceError(f"{p.where()} refused the request: {exc}") from exc
            except SluiceError as exc:
                if self.clock() >= deadline:
                    raise SluiceError(f"{p.where()} could not be reached for {self.cfg.producer_timeout_s:g} s: "
                                      f"{exc}") from exc
                self.sleep(self.cfg.poll_interval_s)

    @staticmethod
    def _held(p: _Producer) -> bool:
        """Whether the producer holds request ``p.rid`` (HTTP 200; 404: it does not)."""
        from sluice.service.client import MnSClientError

        try:
            p.client.request(p.rid)
        except MnSClientError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _held_now(self, p: _Producer) -> bool:
        """Whether the producer holds the request, False when that cannot be told."""
        try:
            return self._held(p)
        except SluiceError:
            return False

    def _poll(self, p: _Producer) -> None:
        from sluice.service.client import MnSClientError, vs_of

        try:
            proc = p.client.process(p.rid)
        except MnSClientError as exc:
            p.last_error = str(exc)
            if exc.status == 404:
                p.status, p.cause = "FAILED", "ENGINE_FAILURE"
                p.detail = f"{p.where()} no longer knows request {p.rid}: {exc}"
            return
        except SluiceError as exc:
            p.last_error = str(exc)
            return
        p.last_ok = self.clock()
        ps = proc.get("attributes", {}).get("progressStatus") or {}
        st = vs_of(proc, "sluice-status") or {}
        p.status = ps.get("status", p.status)
        p.iterations = int(st.get("iterations") or 0)
        p.metrics = {k: float(v) for k, v in (st.get("metrics") or {}).items() if isinstance(v, int | float)}
        if p.ended:
            p.cause = ps.get("resultStateInfo") or st.get("cause") or p.status
            p.detail = st.get("detail") or ""

    def _failure(self) -> tuple[str, str] | None:
        """``(cause, detail)`` of the first producer that failed or vanished, else None."""
        now = self.clock()
        for p in self.producers:
            if p.status in ("FAILED", "CANCELLED") and not p.cancelled:
                from sluice.control.params import Cause

                cause = p.cause if p.cause in Cause._value2member_map_ else "ENGINE_FAILURE"
                return cause, f"{p.where()} ended {p.status} ({p.cause}): {p.detail}"
            if not p.ended and now - p.last_ok > self.cfg.producer_timeout_s:
                return "ENGINE_FAILURE", (f"{p.where()} could not be reached for {now - p.last_ok:.0f} s "
                                          f"(limit {self.cfg.producer_timeout_s:g} s): {p.last_error}")
        return None

    def _metrics(self) -> dict[str, float]:
        sums: dict[str, list[float]] = {}
        for p in self.producers:
            for k, v in p.metrics.items():
                sums.setdefault(k, []).append(v)
        return {k: sum(v) / len(v) for k, v in sums.items()}

    def outcome(self) -> str:
        """How each producer ended (the process adds it to the chain's report, also when the chain's own
        criterion fired before the producers were seen to end)."""
        return self._summary()

    def _summary(self) -> str:
        return "; ".join(f"{p.name} {p.status} {p.cause} after {p.iterations} iterations"
                         + (f" ({p.detail})" if p.detail else "") for p in self.producers)

    def _try(self, p: _Producer, call: Any) -> None:
        try:
            call(p.client)
        except SluiceError as exc:
            p.last_error = str(exc)

    def _cancel_all(self, producers: list[_Producer]) -> None:
        if self._detached:
            return
        for p in producers:
            if p.rid and p.client is not None and not p.ended:
                p.cancelled = True
                self._try(p, lambda c, p=p: c.cancel(p.rid))


def _model_file(model: dict[str, Any]) -> str:
    from sluice.service.client import vs_of

    return Path((vs_of(model, "sluice-model") or {}).get("file") or "model.pt").name


def engine_from_config(cfg: ChainConfig) -> ChainEngine:
    return ChainEngine(cfg)
