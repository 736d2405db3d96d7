"""Split training behind the engine protocol of :mod:`sluice.engine` (one ``iterate`` = one step).

:class:`SplitEngine` is the one place that sets up a split-training task, however its parties run:

* ``transport.kind = "inproc"``: each follower in a thread of this process, over an emulated link
  (``transport.emulate``);
* ``transport.kind = "grpc"``: each follower in its own process on this machine (``sluice split party
  --role follower``), over loopback gRPC; their config (``party.toml``) and logs (``follower-N.log``) go
  to ``run_dir`` (a temporary directory, removed by ``stop``, when there is none);
* ``connect = [ADDR, ...]``: followers already listening elsewhere, one per address (gRPC).

With a ``run_dir`` the leader also appends every step's full record to ``steps.jsonl`` there: loss (and,
for classification, accuracy) of the batch, G, per-party idle and busy seconds, per-operation seconds and
counts, bytes each way, test metrics when evaluated (the events only carry the numbers the control plane
watches).

The leader's own task comes from ``[task]`` (:mod:`sluice.tasks.split`); an in-process follower loads
``[follower_tasks.<name>]`` (else ``[task]``) when the leader's ``hello`` names it, as a follower process does
from its own ``party.toml``. ``start`` builds the links (starting follower threads or processes) and the
leader, and aligns the rows (every follower loads its task, then the private set intersection of the ids);
the first ``iterate`` proposes the task (so ``limit_samples`` and ``set_trainable_layers`` may still be called
after ``start``), chooses G and runs step 0. ``default_iterations`` and ``num_samples`` depend on the aligned
rows and start the engine. The task is proposed for :attr:`~SplitEngine.default_iterations` steps (the
plan: evaluation runs after the last of them); the control plane may stop it earlier (the followers stop
at once) or go on (the leader extends the task by one epoch at a time). ``stop`` ends the task -- at any
point, even before the proposal -- and ends every process and thread ``start`` began, also after a
failure. ``suspend`` tells the followers to wait without their stall timeout until ``resume``. Between
``start`` and ``stop`` the interpreter's thread switch interval is ``pipeline.switch_interval_ms``.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sluice.engine import IterationEvent
from sluice.errors import ConfigError, TrainingError
from sluice.metrics import MetricSpec
from sluice.tasks.resolve import load_split_task
from sluice.tasks.split import SplitTask
from sluice.transport.link import Link

from .config import SplitConfig
from .follower import Follower
from .leader import Leader
from .links import FollowerProcesses, connect_followers, emulated_links
from .models import import_optimizer_modules, linear_layers
from .party import fail_peers
from .schedule import Decision

Record = dict[str, Any]
FollowerHook = Callable[[int, Follower], None]


def party_task(cfg: SplitConfig, party: str) -> SplitTask:
    """The task ``party`` (``"leader"`` or a follower's name) of ``cfg`` trains, loaded here."""
    return load_split_task(cfg.task_of(party), seed=cfg.seed, party=party, followers=cfg.followers,
                           topology=cfg.topology, builtin_args=cfg.builtin_args())


def task_loader(cfg: SplitConfig) -> Callable[[dict[str, Any]], SplitTask]:
    """How a follower of ``cfg`` loads its own task from the leader's ``hello``."""

    def load(hello: dict[str, Any]) -> SplitTask:
        mine = cfg.model_copy(update={"seed": int(hello["seed"]), "topology": str(hello["topology"]),
                                      "followers": int(hello["followers"])})
        return party_task(mine, str(hello["follower"]))

    return load


def follower_for(link: Link, cfg: SplitConfig) -> Follower:
    """The follower party of ``cfg`` at the end ``link`` (its policy, timeouts, queue threshold and device)."""
    return Follower(link, cfg.party, cfg.transport.timeout_s, cfg.pipeline.queue_threshold_bytes,
                    load=task_loader(cfg), device=cfg.train.device, setup_timeout_s=cfg.transport.setup_timeout_s)


class SplitEngine:
    """Pipelined split training as an :class:`~sluice.engine.Engine` (see the module docstring).

    ``steps``: the steps to propose (default: ``train.steps``, else ``train.epochs`` epochs). ``trace``
    keeps every scheduling decision of every in-process party (:meth:`traces`); ``follower_hook(i,
    follower)`` runs in in-process follower ``i``'s thread before it serves (tests inject failures with it).
    """

    def __init__(
        self,
        cfg: SplitConfig,
        connect: list[str] | None = None,
        run_dir: str | Path | None = None,
        steps: int | None = None,
        *,
        trace: bool = False,
        follower_hook: FollowerHook | None = None,
    ) -> None:
        if connect is not None and len(connect) != cfg.followers:
            raise ConfigError(
                f"config says followers = {cfg.followers} but {len(connect)} addresses were given; give one "
                "--connect ADDR per follower"
            )
        if steps is not None and steps < 1:
            raise ConfigError(f"steps must be >= 1, got {steps}")
        self.cfg = cfg
        self.connect = connect
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.trace = trace
        self.follower_hook = follower_hook
        self._steps = steps
        self._task: SplitTask | None = None
        self._metrics: dict[str, MetricSpec] | None = None
        self.leader: Leader | None = None
        self.followers: list[Follower] = []
        self.records: list[Record] = []
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._procs: FollowerProcesses | None = None
        self._tmp: Path | None = None
        self._limit: int | None = None
        self._layers: int | None = None
        self._suspended = False
        self._failed = False
        self._stopped = False
        self._old_switch: float | None = None
        self._t0 = 0.0
        self._resume: dict[str, Any] | None = None

    # -- what the control plane asks ---------------------------------------------------------------
    @property
    def metrics(self) -> dict[str, MetricSpec]:
        """What the leader's task reports (:meth:`SplitTask.declared_metrics` on the test rows; before the
        rows are agreed, on every row of its table) and ``idle_leader_s``."""
        aligned = self.leader is not None and self.leader.plan is not None
        if aligned and self._metrics is not None:
            return self._metrics
        rows = self.leader.test_rows if aligned else np.arange(len(self.task.table.ids) if self.task.table else 0)
        out = self.task.declared_metrics(rows, [MetricSpec("idle_leader_s", False, 0.0)])
        if aligned:
            self._metrics = out
        return out

    @property
    def model_type(self) -> str | None:
        return self.task.model_type

    counts_bytes = True

    @property
    def task(self) -> SplitTask:
        """The leader's own task (loaded on first use)."""
        if self._task is None:
            self._task = party_task(self.cfg, "leader")
        return self._task

    @property
    def plan(self) -> Any:
        """The agreed rows and the schedule (:class:`~sluice.split.plan.Plan`); starts the engine."""
        self.start()
        assert self.leader is not None and self.leader.plan is not None
        return self.leader.plan

    @property
    def _aligned(self) -> int:
        assert self.leader is not None
        return self.leader.aligned

    @property
    def default_iterations(self) -> int:
        """The planned steps: ``steps``, else ``train.steps``, else ``train.epochs`` epochs of the aligned
        training rows."""
        return self.plan.steps

    @property
    def num_samples(self) -> int:
        """Training rows in use."""
        n = len(self.plan.train_ids)
        return n if self._limit is None else min(n, self._limit)

    def limit_samples(self, n: int) -> None:
        """Use only the first ``n`` training rows (in the agreed id order); the followers get exactly these
        ids in the proposal. Only before the first step."""
        if n < 1:
            raise ConfigError(f"sample limit must be >= 1, got {n}")
        if self.leader is not None:
            self.leader.limit_samples(n)
        self._limit = n

    @property
    def num_layers(self) -> int:
        """Linear layers of the leader's top model (the part a ``layers`` requirement applies to)."""
        if self.leader is not None:
            return len(linear_layers(self.leader.top))
        from sluice.tasks.split import build_part

        return len(linear_layers(build_part(self.task, "top", self.cfg.seed, "leader.top")))

    def set_trainable_layers(self, layers: int) -> None:
        """Train only the last ``layers`` linear layers of the leader's top model; its earlier layers stay
        as initialised (the bottom and middle parts keep training, through the frozen layers)."""
        if not 1 <= layers <= self.num_layers:
            raise ConfigError(
                f"layers to train must be in 1..{self.num_layers} (the leader's top model has {self.num_layers} "
                f"linear layers), got {layers}"
            )
        self._layers = layers
        if self.leader is not None:
            self.leader.train_last_layers(layers)

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.leader is not None:
            return
        if self._stopped:
            raise TrainingError("the split-training engine was stopped; start a new one")
        torch.set_num_threads(1)
        cfg = self.cfg
        task = self.task
        self._t0 = time.perf_counter()
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "steps.jsonl").write_text("")
        if cfg.pipeline.switch_interval_ms is not None:  # restored by stop()
            self._old_switch = sys.getswitchinterval()
            sys.setswitchinterval(cfg.pipeline.switch_interval_ms / 1000.0)
        import_optimizer_modules()  # before the followers wait for the proposal
        links: dict[str, Link] = {}
        try:
            links = self._links()
            self.leader = Leader(cfg, links, task, self._steps)
            if self._resume is not None:
                self.leader.on_negotiated = self._load_resume
            if self._limit is not None:
                self.leader.limit_samples(self._limit)
            if self._layers is not None:
                self.leader.train_last_layers(self._layers)
            if self.trace:
                self.leader.trace = []
            self._serve_followers()
            self.leader.align()
        except BaseException as exc:
            if self.leader is not None:
                fail_peers(self.leader, exc)
            for link in links.values():
                link.close()
            self._release(3.0)
            self.leader, self.followers = None, []
            raise

    def _links(self) -> dict[str, Link]:
        """The leader's links: to in-process followers (started by :meth:`_serve_followers`), to follower
        processes it starts, or to the followers at ``connect``."""
        cfg = self.cfg
        names = [f"follower-{i + 1}" for i in range(cfg.followers)]
        if self.connect is not None:
            return connect_followers(cfg, names, self.connect)
        if cfg.transport.kind == "grpc":
            workdir = self.run_dir
            if workdir is None:
                workdir = self._tmp = Path(tempfile.mkdtemp(prefix="sluice-split-"))
            self._procs = FollowerProcesses(cfg, names, workdir)
            return connect_followers(cfg, names, self._procs.addresses)
        links, ends = emulated_links(cfg, names)
        for end in ends:
            f = follower_for(end, cfg)
            if self.trace:
                f.trace = []
            self.followers.append(f)
        return links

    def _serve_followers(self) -> None:
        """Start a thread for each in-process follower (once the leader is ready to propose)."""

        def serve(i: int, f: Follower) -> None:
            try:
                if self.follower_hook is not None:
                    self.follower_hook(i, f)
                f.serve()
            except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
                self._errors.append(exc)

        self._threads = [
            threading.Thread(target=serve, args=(i, f), daemon=True) for i, f in enumerate(self.followers)
        ]
        for t in self._threads:
            t.start()

    def iterate(self) -> IterationEvent:
        if self._stopped:
            raise TrainingError("the split-training engine was stopped; start a new one")
        self.start()
        leader = self.leader
        assert leader is not None
        if self._failed:
            raise TrainingError("the split-training task failed earlier; start a new one")
        if self._suspended:
            self.resume()
        try:
            if not leader.started:
                leader.start()
            s = leader.run_step()
            (rec,) = [r for r in leader.records(wait=True) if r["step"] == s]
        except BaseException as exc:
            self._failed = True
            fail_peers(leader, exc)
            raise
        self.records.append(rec)
        if self.run_dir is not None:
            with open(self.run_dir / "steps.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        metrics = {"train_loss": rec["loss"]}
        if "accuracy" in rec:
            metrics["train_accuracy"] = rec["accuracy"]
        anomaly, detail = None, ""
        if not math.isfinite(rec["loss"]):
            anomaly, detail = "DIVERGED", f"the training loss of step {s} is {rec['loss']}"
        metrics.update({k: rec[k] for k in self.metrics if k in rec and k not in ("train_loss", "train_accuracy")})
        metrics["idle_leader_s"] = rec["idle_s"]["leader"]
        return IterationEvent(
            iteration=s, metrics=metrics, bytes_up=rec["bytes_up"], bytes_down=rec["bytes_down"],
            seconds=rec["step_time_s"], anomaly=anomaly, detail=detail,
        )

    def stop(self) -> None:
        """End the task (the followers say goodbye), then every thread and process :meth:`start` began.
        After a clean end, an in-process follower's error is raised here."""
        if self._stopped:
            return
        self._stopped = True
        clean = False
        try:
            if self.leader is not None and not self._failed:
                try:
                    self.leader.finish()
                    clean = True
                except BaseException as exc:
                    self._failed = True
                    fail_peers(self.leader, exc)
                    raise
        finally:
            self._release(10.0 if clean else 3.0)  # after a failure, time to log the error they were sent
        if clean and self._errors:
            raise self._errors[0]

    def _release(self, grace_s: float) -> None:
        """Join the follower threads and wait up to ``grace_s`` for the follower processes to end by
        themselves (then end them), remove the temporary directory, restore the switch interval."""
        for t in self._threads:
            t.join(timeout=grace_s + 5.0)
        if self._procs is not None:
            self._procs.stop(grace_s)
            self._procs = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if self._old_switch is not None:
            sys.setswitchinterval(self._old_switch)
            self._old_switch = None

    def suspend(self) -> None:
        if self.leader is not None and not self._suspended and not self._failed:
            self.leader.pause()
            self._suspended = True

    def resume(self) -> None:
        if self.leader is not None and self._suspended:
            self.leader.resume()
            self._suspended = False

    def add_data(self, data: Any) -> None:
        raise ConfigError(
            "split training fixes its samples when the parties negotiate the task; start a new task "
            "with the added samples instead"
        )

    # -- checkpoints ---------------------------------------------------------------------------------
    def checkpoint(self) -> bytes:
        """Every party's weights and optimizer state and the next step (:func:`sluice.wire.state.pack`).

        Taken between steps: the followers' reports of the last step have arrived, so their optimizer step
        is done, and nothing of the next step can change a weight before the leader runs it. Each follower
        sends its own state over its link (``checkpoint_req``), wherever it runs."""
        from sluice.models.state import module_tree, optimizer_tree
        from sluice.wire.state import pack

        leader = self.leader
        if leader is None or not leader.started:
            raise TrainingError("nothing to checkpoint: no step has run")
        own = {"leader.top": module_tree(leader.top)}
        if leader.bottom is not None:
            own["leader.bottom"] = module_tree(leader.bottom)
        return pack({"kind": "split-engine", "step": leader.step_no, "leader": own,
                     "optimizer": optimizer_tree(leader.opt), "followers": leader.follower_states(),
                     "limit": self._limit, "layers": self._layers})

    def restore(self, buf: bytes) -> None:
        """Go on from a :meth:`checkpoint` of an engine with the same configuration: the parties negotiate
        the same task again, each loads its state before it starts (followers get theirs over their link:
        ``restore``), and the steps that follow are those the checkpointed engine would have run."""
        from sluice.wire.state import field, unpack

        if self.leader is not None:
            raise TrainingError("a checkpoint is restored before the engine starts")
        state = dict(zip(("step", "leader", "optimizer", "followers", "limit", "layers"), field(
            unpack(buf), "split-engine", "step", "leader", "optimizer", "followers", "limit", "layers"),
            strict=True))
        self._resume = state
        if state["limit"] is not None:
            self.limit_samples(int(state["limit"]))
        if state["layers"] is not None:
            self.set_trainable_layers(int(state["layers"]))

    def _load_resume(self) -> None:
        """Load the checkpoint into every party (called by the leader once the followers accepted)."""
        from sluice.models.state import load_module_tree, load_optimizer_tree

        leader, state = self.leader, self._resume
        assert leader is not None and state is not None
        if set(state["followers"]) != set(leader.followers):
            raise TrainingError(f"the checkpoint holds followers {sorted(state['followers'])}, this task "
                                f"{sorted(leader.followers)}")
        load_module_tree(leader.top, state["leader"]["leader.top"])
        if leader.bottom is not None:
            load_module_tree(leader.bottom, state["leader"]["leader.bottom"])
        load_optimizer_tree(leader.opt, state["optimizer"])
        leader.restore_followers(state["followers"])
        leader.step_no = int(state["step"])
        self._resume = None

    def save(self, path: str) -> str:
        """Save the weights of every part this process holds (the leader's, and those of in-process
        followers) with ``torch.save``, as part name -> state dict."""
        if self.leader is None:
            raise TrainingError("nothing to save: the engine has not started")
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.states(), p)
        return str(p)

    # -- what a run reports --------------------------------------------------------------------------
    def data_report(self) -> dict[str, Any]:
        """What the report says of the rows: the ids every party shares (``aligned_samples``), of them those
        trained on and tested on, and each party's table size (empty before the rows are agreed)."""
        leader = self.leader
        if leader is None or leader.plan is None:
            return {}
        plan = leader.plan
        return {"aligned_samples": self._aligned, "train_samples": len(plan.train_ids),
                "test_samples": len(plan.test_ids), "table_rows": dict(leader.rows)}

    def states(self) -> dict[str, dict[str, torch.Tensor]]:
        """Copies of the weights of every part this process holds (part name -> state dict)."""
        if self.leader is None:
            return {}
        out = self.leader.state()
        for f in self.followers:
            if f.model is not None:
                out[f.proposal["part"]] = {k: v.detach().clone() for k, v in f.model.state_dict().items()}
        return out

    def traces(self) -> dict[str, list[Decision]]:
        """Scheduling decisions of every in-process party (with ``trace=True``)."""
        out: dict[str, list[Decision]] = {}
        if self.leader is not None and self.leader.trace is not None:
            out["leader"] = self.leader.trace
        for f in self.followers:
            if f.trace is not None:
                out[f.name] = f.trace
        return out

    def summary(self, wall_s: float | None = None) -> dict[str, Any]:
        """What ``summary.json`` holds: the task, the steps, means per step (the first step, which pays for
        warm-up, left out), bytes on the wire per direction and the choice of G."""
        leader = self.leader
        records = self.records
        if wall_s is None:
            wall_s = time.perf_counter() - self._t0
        if leader is None:
            return {"topology": self.cfg.topology, "task": self.task.name, "steps": 0, "wall_s": round(wall_s, 3)}
        steady = records[1:] if len(records) > 2 else records
        evals = [r for r in records if "test_loss" in r]
        last = evals[-1] if evals else {}
        parties = ["leader", *leader.followers]

        def mean(xs: list[float]) -> float:
            return float(np.mean(xs)) if xs else 0.0

        op_means: dict[str, dict[str, float]] = {}
        for p in parties:
            names = sorted({k for r in steady for k in r["op_s"].get(p, {})})
            op_means[p] = {k: mean([r["op_s"][p].get(k, [0.0])[0] for r in steady]) for k in names}
        out: dict[str, Any] = {
            "topology": self.cfg.topology,
            "task": self.task.name,
            "followers": leader.followers,
            "table_rows": leader.rows,
            "aligned_samples": self._aligned,
            "psi": leader.psi,
            "train_samples": len(leader.plan.train_ids),
            "steps": len(records),
            "groups": leader.groups,
            "final_loss": records[-1]["loss"] if records else None,
            **{f"final_{k}": last.get(k) for k in self.metrics if k in last},
            "mean_step_time_s": mean([r["step_time_s"] for r in steady]),
            "mean_idle_s": {p: mean([r["idle_s"][p] for r in steady]) for p in parties},
            "mean_op_s": op_means,
            "total_bytes_up": int(sum(r["bytes_up"] for r in records)),
            "total_bytes_down": int(sum(r["bytes_down"] for r in records)),
            "setup_bytes_up": int(getattr(leader, "setup_bytes_up", 0)),
            "setup_bytes_down": int(getattr(leader, "setup_bytes_down", 0)),
            "link_bytes": {n: leader.links[n].stats.as_dict() for n in leader.followers},
            "accepted": {n: {**leader.ready.get(n, {}), **a} for n, a in leader.accepted.items()},
            "wall_s": round(wall_s, 3),
        }
        if leader.choice is not None:
            c = leader.choice
            out["group_choice"] = {
                "groups": c.groups,
                "seed_formula": c.seed_formula,
                "predicted_step_s": c.predicted_s,
                "predicted_serial_step_s": c.predicted_serial_s,
            }
            out["calibration"] = leader.calibration
        return out
