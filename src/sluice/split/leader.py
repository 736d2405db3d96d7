"""The leader: holds the labels and the top model, starts the task, aligns the rows, negotiates, chooses G,
drives steps.

Lifecycle: :meth:`Leader.align` (every follower loads its own task, then the private set intersection of the
ids and the agreed rows), :meth:`Leader.limit_samples` / :meth:`Leader.train_last_layers` (optional, before
the proposal), :meth:`Leader.start` (negotiate, then choose G -- measuring the links and the parties' compute
when ``pipeline.groups`` is ``"auto"`` or ``"seed"`` -- and send ``start``), :meth:`Leader.run_step` per step
(past the proposed steps it sends ``extend``), :meth:`Leader.records` for finished step records,
:meth:`Leader.finish` (``stop``/``bye``; possible at any point, even before the proposal).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from sluice.errors import ConfigError, DataError, NegotiationError, TaskError, TrainingError
from sluice.metrics import classification_metrics, regression_metrics
from sluice.models.device import resolve_device
from sluice.tasks.split import SplitTask, build_part, fit_shapes
from sluice.transport.link import Link

from ._calibrate import choose_g
from ._data import party_data
from .config import SplitConfig
from .grouping import GroupChoice, split_batch
from .models import check_exact, group_loss, make_optimizer, train_last_layers
from .party import Worker, params_of
from .plan import BatchPlan, Plan, agree_rows, eval_due, hello_for, make_plan, proposal_for
from .schedule import Op
from .topology import In, Local, eval_tag, topology


class Leader(Worker):
    def __init__(self, cfg: SplitConfig, links: dict[str, Link], task: SplitTask, steps: int | None = None) -> None:
        super().__init__("leader", links, cfg.transport.timeout_s, cfg.pipeline.queue_threshold_bytes,
                         cfg.transport.setup_timeout_s)
        torch.set_num_threads(1)
        self.cfg = cfg
        self.party_task = task
        self.topo = topology(cfg.topology)
        self.ops = self.topo.specs("leader")
        self.followers = [f"follower-{i + 1}" for i in range(cfg.followers)]
        if sorted(links) != sorted(self.followers):
            raise ConfigError(f"the leader needs one link per follower {self.followers}, got {sorted(links)}")
        self.device = resolve_device(cfg.train.device)
        self.kind = task.kind  # classification or regression
        self.bottom = build_part(task, "bottom", cfg.seed, "leader.bottom").to(self.device) \
            if self.topo.leader_bottom else None
        self.top = build_part(task, "top", cfg.seed, "leader.top").to(self.device)
        self.dtype = next(p for p in params_of(self.bottom, self.top) if p.is_floating_point()).dtype
        params = params_of(self.bottom, self.top)
        self.opt = task.optimizer(params, cfg.train.lr) if task.optimizer else make_optimizer(params, {
            "optimizer": cfg.train.optimizer, "lr": cfg.train.lr, "momentum": cfg.train.momentum,
            "weight_decay": cfg.train.weight_decay})
        self._steps = steps
        self.plan: Plan | None = None
        self.rows: dict[str, int] = {}
        self.ready: dict[str, dict[str, Any]] = {}
        self.aligned = 0
        self.psi: dict[str, dict[str, Any]] = {}
        self.groups = 1
        self.choice: GroupChoice | None = None
        self.calibration: dict[str, Any] = {}
        self.accepted: dict[str, dict[str, Any]] = {}
        self.proposed = False
        self.started = False
        self.step_no = 0
        self.on_negotiated: Callable[[], None] | None = None
        """Called once the followers accepted and G is chosen, before they start (a resumed task loads
        every part's state there and sets :attr:`step_no`)."""
        self._pending: dict[int, dict[str, Any]] = {}
        self._reports: dict[int, dict[str, tuple[dict[str, Any], int, float]]] = {}
        self._t_end: float | None = None
        self._saved: dict[int, torch.Tensor] = {}

    # -- the rows every party holds ----------------------------------------------------------------
    def align(self) -> None:
        """Every follower loads its own task and builds its part (``hello``); the top model is checked against
        what the bottom models send (:class:`TaskError` naming every shape); then the private set intersection
        of the ids with each follower in turn (the leader's ids, then those the earlier followers share), the
        agreed rows and this party's data. :class:`DataError` when fewer than ``data.min_common_ids`` ids are
        shared."""
        from sluice.psi import intersect

        table = self.party_task.table
        assert table is not None
        self.rows = {"leader": len(table.ids)}
        own = self._sample_shape(table.X, self.bottom) if self.bottom is not None else None
        for name in self.followers:
            self.send_control(name, "hello", hello_for(self.cfg, name, own, str(self.dtype).removeprefix("torch."))
                              if self.topo.u_shape else hello_for(self.cfg, name))
        for name in self.followers:
            msg = self.wait_control(name, ("ready", "refuse"), "the follower's task", setup=True)
            self._refused(name, msg)
            self.ready[name] = msg.body
            self.rows[name] = int(msg.body.get("rows", 0))
        shapes = [] if own is None or self.topo.u_shape else [("leader", own)]
        shapes += [(n, tuple(self.ready[n]["out_shape"])) for n in self.followers]
        fit_shapes(self.top, shapes, self.dtype)
        self.top_in = tuple(torch.cat([torch.zeros((1, *s)) for _, s in shapes], dim=1).shape[1:])
        common = np.arange(len(table.ids))
        if self.topo.follower_features:
            for name in self.followers:
                self.send_control(name, "psi", {"items": len(common)})
                found, stats = intersect([str(i) for i in table.ids[common]], self.channel(name))
                common = common[np.asarray(found, dtype=np.int64)]
                self.psi[name] = {"seconds": round(stats.seconds, 4), "bytes_sent": stats.sent_bytes,
                                  "bytes_received": stats.received_bytes, "common": len(common)}
        least = self.cfg.data.min_common_ids
        if len(common) < least:
            shared = ", ".join(f"{n} {v['common']:,}" for n, v in self.psi.items())
            raise DataError(f"{len(common):,} of {len(table.ids):,} ids in common (the leader's table and every "
                            f"follower's{': ' + shared if len(self.psi) > 1 else ''}); at least {least:,} are "
                            "needed (data.min_common_ids)")
        self.aligned = len(common)
        train_ids, test_ids = agree_rows(self.cfg, table, common)
        self.plan = make_plan(self.cfg, train_ids, test_ids, self._steps)
        self._load_data()

    def _refused(self, name: str, msg: Any) -> None:
        if msg.type == "refuse":
            self.finished_peers.add(name)
            raise NegotiationError(f"{name} refused the task: {msg.body.get('reason', 'no reason given')}")

    def _load_data(self) -> None:
        plan = self.plan
        assert plan is not None
        data = party_data(self.party_task, plan.train_ids, plan.test_ids, self.dtype, True)
        self.X = data.X_train.to(self.device)
        self.X_test = data.X_test.to(self.device)
        assert data.y_train is not None and data.y_test is not None
        y = torch.from_numpy(np.ascontiguousarray(data.y_train))
        self.y = (y if self.kind == "classification" else y.to(self.dtype)).to(self.device)
        self.y_test = data.y_test
        self.metric_fns = self.party_task.metric_fns(data.test_rows)
        self.test_rows = data.test_rows
        self.batches = BatchPlan(len(plan.train_ids), plan.hparams["batch_size"], self.cfg.seed)
        self.steps = plan.steps

    def limit_samples(self, n: int) -> None:
        """Use only the first ``n`` training rows (in the agreed id order); the followers learn which
        rows from the proposal, so this is possible only before it."""
        if self.proposed:
            raise TrainingError("the training samples were fixed when the task was proposed to the followers")
        if n < 1:
            raise ConfigError(f"sample limit must be >= 1, got {n}")
        assert self.plan is not None
        self.plan = dataclasses.replace(self.plan, train_ids=self.plan.train_ids[:n])
        self._load_data()

    def train_last_layers(self, layers: int) -> None:
        """Train only the last ``layers`` linear layers of the top model."""
        train_last_layers(self.top, layers)

    # -- negotiation (SPEC P7) -----------------------------------------------------------------
    def _sample_shape(self, X: np.ndarray, model: torch.nn.Module) -> tuple[int, ...]:
        """The shape of one sample of ``model``'s output on two rows of ``X`` (this party's features)."""
        x = torch.from_numpy(np.ascontiguousarray(X[:2], dtype=np.float64)).to(self.dtype).to(self.device)
        with torch.no_grad():
            model.eval()
            try:
                return tuple(model(x).shape[1:])
            except Exception as exc:  # the user's model: any failure is a misfit
                raise TaskError(f"task {self.party_task.name!r}: the leader's bottom model cannot take its rows "
                                f"({tuple(x.shape[1:])} per sample): {type(exc).__name__}: "
                                f"{(str(exc).splitlines() or [''])[0]}") from None
            finally:
                model.train()

    def negotiate(self) -> None:
        """Propose the plan to every follower."""
        plan = self.plan
        assert plan is not None
        groups = self.cfg.pipeline.groups
        self.proposed = True
        for i, name in enumerate(self.followers):
            self.send_control(name, "propose", proposal_for(
                plan, i, groups, self.links[name].secure, allow_batch_coupled=self.cfg.model.allow_batch_coupled))
        for name in self.followers:
            msg = self.wait_control(name, ("accept", "refuse"), "an answer to the proposal", setup=True)
            self._refused(name, msg)
            self.accepted[name] = msg.body

    def start(self) -> None:
        """Negotiate, choose G and tell the followers to start."""
        self.negotiate()
        g = self.cfg.pipeline.groups
        if g == "auto":
            self.groups = choose_g(self)
        elif g == "seed":
            choose_g(self)
            assert self.choice is not None
            B = self.cfg.train.batch_size
            top = max(1, min(self.cfg.pipeline.max_groups, B))
            self.groups = int(min(top, max(1, round(self.choice.seed_formula))))
        else:
            self.groups = int(g)
        for part, module in (("leader.bottom", self.bottom), ("leader.top", self.top)):
            if module is not None:
                check_exact(module, part, self.groups, self.cfg.model.allow_batch_coupled)
        if self.on_negotiated is not None:
            self.on_negotiated()
        for name in self.followers:
            self.send_control(name, "start", {"groups": self.groups, "first_step": self.step_no})
        self.started = True
        self._t_end = time.perf_counter()
        self.setup_bytes_down = self.setup_sent
        self.setup_bytes_up = sum(link.stats.bytes_received for link in self.links.values())

    # -- one step --------------------------------------------------------------------------------
    def _input(self, need: In | Local, step: int, g: int) -> list[torch.Tensor]:
        """The tensors an operation needs: one handed over locally, or one from every follower."""
        if isinstance(need, Local):
            return [self.store.pop(("loc", step, need.name, g))]
        return [self.store.pop(("in", step, need.tag, p, g)) for p in self.followers]

    def _hand(self, name: str, step: int, g: int, tensor: torch.Tensor) -> None:
        key = ("loc", step, name, g)
        self.store[key] = tensor
        assert self.graph is not None
        self.graph.offer(key)

    def _execute(self, op: Op, step: int, groups: list[torch.Tensor], batch: int) -> None:
        """Run one operation of the table (:mod:`sluice.split.topology`) on group ``op.group``."""
        g = op.group
        idx = groups[g]
        spec = self.ops[op.name]
        if op.name == "bottom.fwd":
            assert self.bottom is not None
            h = self.bottom(self.X[idx])
            self._saved[g] = h
            if spec.hands is not None:
                self._hand(spec.hands, step, g, h)
            if spec.sends is not None:
                for p in self.followers:
                    self.send_tensor(p, step, g, spec.sends, h.detach())
        elif op.name == "head":
            yb = self.y[idx]
            kinds: list[In | Local] = []
            inputs: list[torch.Tensor] = []
            for need in spec.needs:
                for x in self._input(need, step, g):
                    kinds.append(need)
                    inputs.append(x.detach().requires_grad_(True))
            z = self.top(torch.cat(inputs, dim=1) if len(inputs) > 1 else inputs[0])
            loss = group_loss(self.party_task, z, yb, batch)
            loss.backward()
            senders = iter(self.followers)
            for need, x in zip(kinds, inputs, strict=True):
                if isinstance(need, Local):
                    assert spec.hands is not None
                    self._hand(spec.hands, step, g, x.grad)
                else:
                    assert spec.sends is not None
                    self.send_tensor(next(senders), step, g, spec.sends, x.grad)
            self._loss += float(loss.detach())
            if self.kind == "classification":
                self._correct += int((z.detach().argmax(1) == yb).sum())
        elif op.name == "bottom.bwd":
            (grad,) = self._input(spec.needs[0], step, g)
            self._saved.pop(g).backward(grad)
        else:  # pragma: no cover - the table has no other leader operation
            raise AssertionError(op.name)

    def run_step(self) -> int:
        """Run the leader's part of the next step (the record is finished when reports arrive)."""
        s = self.step_no
        if s >= self.steps:  # past the plan: extend the task by whole epochs
            while s >= self.steps:
                self.steps += self.batches.per_epoch
            for name in self.followers:
                self.send_control(name, "extend", {"steps": self.steps})
        self.reset_counters()
        batch = self.batches.batch(s)
        groups = [torch.from_numpy(g) for g in split_batch(batch, self.groups)]
        self._loss, self._correct = 0.0, 0
        ops = self.topo.ops("leader", s, len(groups), self.followers)
        self.run_graph(
            ops, lambda op: self._execute(op, s, groups, len(batch)), f"step {s} data from the followers"
        )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        rec: dict[str, Any] = {
            "step": s,
            "epoch": self.batches.epoch(s),
            "loss": self._loss,
            "groups": len(groups),
            "batch": len(batch),
        }
        if self.kind == "classification":
            rec["accuracy"] = self._correct / len(batch)
        if eval_due(s, self.steps, self.cfg.train.eval_every):
            rec.update(self.evaluate(s))
        rec["_done"] = time.perf_counter()
        rec["_idle"], rec["_busy"] = self.idle, self.busy
        rec["_ops"] = {k: [round(v[0], 6), v[1]] for k, v in self.op_seconds.items()}
        self._pending[s] = rec
        self.step_no += 1
        return s

    def evaluate(self, s: int) -> dict[str, float]:
        """Metrics of the model after step ``s`` on the agreed test samples: the forward operations of the
        table on the test set, their tensors sent under ``eval_<tag>``."""
        with torch.no_grad():
            h = self.bottom(self.X_test) if self.bottom is not None else None
            fwd = self.ops.get("bottom.fwd")
            if fwd is not None and fwd.sends is not None:
                assert h is not None
                for p in self.followers:
                    self.send_tensor(p, s, 0, eval_tag(fwd.sends), h)
            inputs: list[torch.Tensor] = []
            for need in self.ops["head"].needs:
                if isinstance(need, Local):
                    assert h is not None
                    inputs.append(h)
                else:
                    keys = [("in", s, eval_tag(need.tag), p, 0) for p in self.followers]
                    self.wait_keys(keys, f"evaluation data of step {s}")
                    inputs += [self.store.pop(k) for k in keys]
            z = self.top(torch.cat(inputs, dim=1) if len(inputs) > 1 else inputs[0]).float().cpu()
        pred = z.numpy()
        if self.kind == "classification":
            out = classification_metrics(z, self.y_test, int(z.shape[1]), auc=True)
        else:
            out = regression_metrics(pred, self.y_test)
        for name, fn in self.metric_fns.items():  # a scenario's type-specific errors
            out[name] = float(fn(pred, self.y_test))
        return out

    # -- records -----------------------------------------------------------------------------------
    def _collect_reports(self) -> None:
        for name in self.followers:
            while True:
                item = self.take_control(name, "step_done")
                if item is None:
                    break
                msg, size, arrived = item
                self._reports.setdefault(int(msg.body["step"]), {})[name] = (msg.body, size, arrived)

    def records(self, wait: bool) -> list[dict[str, Any]]:
        """Step records whose follower reports have arrived, in step order (``wait``: all of them)."""
        out = []
        while self._pending:
            s = min(self._pending)
            self.pump(False)
            self._collect_reports()
            while wait and len(self._reports.get(s, {})) < len(self.followers):
                self.pump(True, f"the step {s} reports")
                self._collect_reports()
            reps = self._reports.get(s, {})
            if len(reps) < len(self.followers):
                break
            out.append(self._finish_record(s, self._pending.pop(s), self._reports.pop(s)))
        return out

    def _finish_record(self, s: int, rec: dict[str, Any], reps: dict[str, Any]) -> dict[str, Any]:
        t_end = max([rec.pop("_done")] + [r[2] for r in reps.values()])
        assert self._t_end is not None
        rec["step_time_s"] = t_end - self._t_end
        self._t_end = t_end
        rec["idle_s"] = {"leader": rec.pop("_idle"), **{n: reps[n][0]["idle_s"] for n in self.followers}}
        rec["busy_s"] = {"leader": rec.pop("_busy"), **{n: reps[n][0]["busy_s"] for n in self.followers}}
        rec["op_s"] = {"leader": rec.pop("_ops"), **{n: reps[n][0]["ops"] for n in self.followers}}
        rec["bytes_up"] = sum(r[0]["bytes"] + r[1] for r in reps.values())
        rec["bytes_down"] = self.sent_by_step.get(s, 0)
        return rec

    # -- the end -----------------------------------------------------------------------------------
    def finish(self) -> list[dict[str, Any]]:
        """Wait for the last reports, stop the followers (at any point of the task, even before the
        proposal), collect their goodbyes, close the links."""
        recs = self.records(wait=True) if self.started else []
        peers = [n for n in self.followers if n not in self.finished_peers]
        for name in peers:
            self.send_control(name, "stop")
        for name in peers:
            self.wait_control(name, "bye", "the goodbye")
            self.finished_peers.add(name)
        for link in self.links.values():
            link.flush(5.0)
        self.close_links()
        return recs

    def pause(self) -> None:
        for name in self.followers:
            self.send_control(name, "pause")

    def resume(self) -> None:
        for name in self.followers:
            self.send_control(name, "resume")

    def follower_states(self) -> dict[str, bytes]:
        """Every follower's :meth:`~sluice.split.follower.Follower.state_bytes`, asked for between steps."""
        for name in self.followers:
            self.send_control(name, "checkpoint_req")
        out = {}
        for name in self.followers:
            while not self.raws[name]:
                self.pump(True, f"the checkpoint of {name}")
            out[name] = self.raws[name].popleft()[0]
        return out

    def restore_followers(self, states: dict[str, bytes]) -> None:
        """Send each follower its state (before ``start``: it loads it while it waits to start)."""
        for name in self.followers:
            self.send_control(name, "restore")
            self.send_raw(name, states[name])

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        out = {"leader.top": {k: v.detach().clone() for k, v in self.top.state_dict().items()}}
        if self.bottom is not None:
            out["leader.bottom"] = {k: v.detach().clone() for k, v in self.bottom.state_dict().items()}
        return out
