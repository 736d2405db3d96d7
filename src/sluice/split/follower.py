"""The follower: loads its own task, answers the private set intersection, judges the leader's proposal,
then trains its part of the model step after step.

Lifecycle: ``hello`` -> this party loads its own task (``ready`` with its table's size, or ``refuse`` with the
reason) -> ``psi`` (answer one intersection of the leader's ids with this party's; topologies where followers
hold features) -> ``propose`` -> ``accept`` (its part's size and the shape of what it sends) or ``refuse``
(with the reason) -> setup requests (``profile_req``, ``ping``, link probes) -> ``start`` (with G) -> the
planned steps, each followed by ``step_done`` -> ``extend`` (more steps) or ``stop``. The leader may send
``stop`` at any point, even before the proposal; the follower then abandons the step it is in (its weights
keep the last finished step) and answers ``bye``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from sluice.errors import DataError, NegotiationError, SluiceError
from sluice.models.device import resolve_device
from sluice.tasks.split import SplitTask, build_part
from sluice.transport.link import Link
from sluice.wire.tensor import encode_tensor

from ._data import party_data
from .config import PartyPolicy
from .grouping import linear_fit, profile_sizes, split_batch
from .models import batch_coupled_layers, make_optimizer
from .party import Stopped, Worker, fail_peers
from .plan import PROTOCOL, BatchPlan, eval_due
from .schedule import Op
from .topology import In, OpSpec, eval_tag, topology

TaskLoader = Callable[[dict[str, Any]], SplitTask]
"""How a follower loads its own task from the leader's ``hello`` (its name, the topology, the seed...)."""


def judge(policy: PartyPolicy, proposal: dict[str, Any], secure: bool) -> str | None:
    """Why this party refuses ``proposal`` (``None``: acceptable). Its part and rows are checked later."""
    if proposal.get("protocol") != PROTOCOL:
        return f"protocol version {proposal.get('protocol')} is not supported (this party speaks {PROTOCOL})"
    steps = int(proposal["steps"])
    if steps > policy.max_steps:
        return f"{steps} steps proposed; this party allows at most {policy.max_steps}"
    if policy.require_tls and not secure:
        return "this party requires TLS (transport.tls) and the connection is not encrypted"
    if bool(proposal.get("tls")) != secure:
        state = "encrypted" if secure else "not encrypted"
        return f"the proposal says tls={proposal.get('tls')} but the connection is {state}"
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, DataError):
        return f"sample ids do not match: {exc}"
    if isinstance(exc, SluiceError):
        return str(exc)
    return f"malformed message ({type(exc).__name__}: {exc})"


class Follower(Worker):
    """A party holding some feature columns (4A, 6) or the middle model (5), serving one leader's task."""

    def __init__(
        self, link: Link, policy: PartyPolicy, timeout_s: float, threshold: int | None = None, *,
        load: TaskLoader, device: str = "cpu", setup_timeout_s: float | None = None,
    ) -> None:
        super().__init__("follower", {"leader": link}, timeout_s, threshold, setup_timeout_s)
        torch.set_num_threads(1)
        self.policy = policy
        self.link = link
        self.load = load
        self.device = resolve_device(device)
        self.task: SplitTask | None = None
        self.model: torch.nn.Module | None = None
        self.proposal: dict[str, Any] = {}
        self.steps_done = 0
        self.first_step = 0
        self.saved: dict[int, Any] = {}

    # -- negotiation -----------------------------------------------------------------------------
    def _refuse(self, reason: str) -> None:
        self.send_control("leader", "refuse", {"reason": reason})
        self.link.flush(2.0)
        raise NegotiationError(f"refused the task of the leader: {reason}")

    def negotiate(self) -> None:
        """``hello`` (load this party's task), the intersections the leader asks for, then the proposal."""
        msg = self.wait_control("leader", ("hello", "stop"), "the leader's hello", setup=True)
        if msg.type == "stop":
            raise Stopped
        try:
            if msg.body.get("protocol") != PROTOCOL:
                raise NegotiationError(f"protocol version {msg.body.get('protocol')} is not supported (this party "
                                       f"speaks {PROTOCOL})")
            self.name = str(msg.body["follower"])
            self.task = self.load(msg.body)
            self.topo = topology(msg.body["topology"])
            if self.topo.follower_features and self.task.table is None:
                raise NegotiationError(f"task {self.task.name!r} has no table, and in topology {self.topo.name} "
                                       "a follower holds features")
            self._build(msg.body)
        except (SluiceError, KeyError, TypeError, ValueError) as exc:
            self._refuse(_reason(exc))
        table = self.task.table
        assert self.model is not None
        self.send_control("leader", "ready", {"rows": 0 if table is None else len(table.ids),
                                              "params": sum(q.numel() for q in self.model.parameters()),
                                              "out_shape": list(self.out_shape)})
        while True:
            msg = self.wait_control("leader", ("psi", "propose", "stop"), "the task proposal", setup=True)
            if msg.type == "stop":
                raise Stopped
            if msg.type == "propose":
                break
            from sluice.psi import serve

            if table is None:
                self._refuse("this party holds no table to intersect")
            serve([str(i) for i in table.ids], self.channel("leader"))
        p = msg.body
        try:
            reason = judge(self.policy, p, self.link.secure)
            if reason is None:
                self._prepare(p)
        except (SluiceError, KeyError, TypeError, ValueError) as exc:
            reason = _reason(exc)
        if reason is not None:
            self._refuse(reason)
        assert self.model is not None
        self.send_control("leader", "accept", {"name": self.name, "secure": self.link.secure})

    def _build(self, hello: dict[str, Any]) -> None:
        """Build this party's part (seeded by the leader's seed and the part's name), check its size and find
        the shape of what it sends, on two of its rows or (U-shape) on what the leader's bottom sends."""
        assert self.task is not None
        model = build_part(self.task, "bottom", int(hello["seed"]), str(hello["part"])).to(self.device)
        n = sum(q.numel() for q in model.parameters())
        if n > self.policy.max_params:
            raise NegotiationError(f"this party's part has {n} parameters; it allows at most {self.policy.max_params}")
        self.dtype = next(q for q in model.parameters() if q.is_floating_point()).dtype
        if self.topo.follower_features:
            assert self.task.table is not None
            sample = torch.from_numpy(np.ascontiguousarray(self.task.table.X[:2], dtype=np.float64)).to(self.dtype)
        else:
            shape = tuple(int(d) for d in hello["in_shape"])
            sample = torch.zeros((2, *shape), dtype=getattr(torch, hello["in_dtype"]))
        self.in_shape = tuple(sample.shape[1:])
        with torch.no_grad():
            model.eval()
            try:
                self.out_shape = tuple(model(sample.to(self.device)).shape[1:])
            except Exception as exc:  # the user's model: any failure is a misfit
                what = "its rows" if self.topo.follower_features else "the leader's bottom output"
                first = (str(exc).splitlines() or [""])[0]
                raise NegotiationError(f"this party's part cannot take {what} ({self.in_shape} per sample): "
                                       f"{type(exc).__name__}: {first}") from None
            finally:
                model.train()
        self.model = model

    def _prepare(self, p: dict[str, Any]) -> None:
        """Check the proposal against the part, gather the agreed rows, make the optimizer."""
        assert self.task is not None and self.model is not None
        self.proposal = p
        self.ops = self.topo.specs("follower")
        coupled = batch_coupled_layers(self.model)
        if coupled and p.get("groups") != 1 and not p.get("allow_batch_coupled"):
            raise NegotiationError(f"this party's part has batch-coupled layers ({', '.join(coupled)}); with G > 1 "
                                   "the updates would not be the full-batch update")
        if self.topo.follower_features:
            data = party_data(self.task, p["train_ids"], p["test_ids"], self.dtype, False)
            self.X, self.X_test = data.X_train.to(self.device), data.X_test.to(self.device)
        hp = p["hparams"]
        params = list(self.model.parameters())
        self.opt = self.task.optimizer(params, hp["lr"]) if self.task.optimizer else make_optimizer(params, hp)
        self.plan = BatchPlan(len(p["train_ids"]), hp["batch_size"], p["seed"])
        self.steps = int(p["steps"])
        self.eval_every = int(p.get("eval_every", 0))

    # -- setup requests until "start" ----------------------------------------------------------
    def setup(self) -> None:
        while True:
            q = self.controls["leader"]
            while q:
                msg, _, _ = q.popleft()
                if msg.type == "start":
                    self.groups = int(msg.body["groups"])
                    self.first_step = int(msg.body.get("first_step", 0))
                    return
                if msg.type == "stop":
                    raise Stopped
                self._answer(msg.type, msg.body)
            while self.raws["leader"]:
                data, _ = self.raws["leader"].popleft()
                self.send_control("leader", "probe_ack", {"bytes": len(data)})
            self.pump(True, "the start of training", setup=True)

    def _answer(self, type_: str, body: dict[str, Any]) -> None:
        if type_ == "ping":
            self.send_control("leader", "pong", body)
        elif type_ == "probe_req":
            self.send_raw("leader", bytes(int(body["bytes"])))
        elif type_ == "profile_req":
            self.send_control("leader", "profile", self.profile(int(body["batch"])))
        elif type_ == "restore":  # a resumed task: the state follows as one raw message
            while not self.raws["leader"]:
                self.pump(True, "the checkpoint from the leader")
            self.load_state(self.raws["leader"].popleft()[0])

    # -- checkpoints -----------------------------------------------------------------------------
    def _on_control(self, peer: str, msg: Any, size: int, arrived: float) -> None:
        """Answer ``checkpoint_req`` wherever it arrives: the leader asks between its steps, after this
        party's report of the last one (its optimizer step done) and before anything of the next step can
        change a weight."""
        if msg.type == "checkpoint_req":
            self.send_raw("leader", self.state_bytes())
            return
        super()._on_control(peer, msg, size, arrived)

    def state_bytes(self) -> bytes:
        """This party's weights and optimizer state (:func:`sluice.wire.state.pack`)."""
        from sluice.models.state import module_tree, optimizer_tree
        from sluice.wire.state import pack

        assert self.model is not None
        return pack({"kind": "split-party", "part": self.proposal["part"], "model": module_tree(self.model),
                     "optimizer": optimizer_tree(self.opt)})

    def load_state(self, buf: bytes) -> None:
        """Load what :meth:`state_bytes` of the same part gave; :class:`sluice.errors.WireError` otherwise."""
        from sluice.errors import WireError
        from sluice.models.state import load_module_tree, load_optimizer_tree
        from sluice.wire.state import field, unpack

        part, model, opt = field(unpack(buf), "split-party", "part", "model", "optimizer")
        if part != self.proposal["part"]:
            raise WireError(f"a checkpoint of part {part} cannot restore part {self.proposal['part']}")
        assert self.model is not None
        load_module_tree(self.model, model)
        load_optimizer_tree(self.opt, opt)

    def profile(self, batch: int, repeats: int = 3) -> dict[str, Any]:
        """Seconds of this party's operations for groups of ``n`` samples (linear fit ``a0 + a1 n`` from
        two sizes, best of ``repeats``) and encoded bytes of what it sends per group. The seconds are the CPU
        time of this thread, which computes alone (one torch thread), as the leader times its own (see
        :func:`sluice.split._calibrate.profile_leader`)."""
        assert self.model is not None
        sizes = profile_sizes(batch)
        kept = {k: v.clone() for k, v in self.model.state_dict().items()}
        fwd, bwd = [], []
        for n in sizes:
            x = torch.randn((n, *self.in_shape), dtype=self.dtype, generator=torch.Generator().manual_seed(n))
            x = x.to(self.device)
            tf = tb = float("inf")
            for _ in range(repeats):
                t0 = time.thread_time()
                if self.topo.u_shape:  # the middle part sends the gradient of its input
                    x.requires_grad_(True)
                h = self.model(x)
                t1 = time.thread_time()
                h.backward(torch.ones_like(h))
                t2 = time.thread_time()
                tf, tb = min(tf, t1 - t0), min(tb, t2 - t1)
                x.grad = None
            fwd.append(tf)
            bwd.append(tb)
        self.model.zero_grad(set_to_none=True)
        self.model.load_state_dict(kept)  # running statistics (BatchNorm) as they were
        tag = self._forward.sends
        assert tag is not None
        b = [len(encode_tensor(0, 0, tag, torch.zeros((n, *self.out_shape), dtype=self.dtype))) for n in sizes]
        return {"fwd": linear_fit(sizes, fwd), "bwd": linear_fit(sizes, bwd),
                "bytes": linear_fit(sizes, [float(v) for v in b])}

    # -- training --------------------------------------------------------------------------------
    @property
    def _forward(self) -> OpSpec:
        """The forward operation of this party's part (what it sends first in a step)."""
        return self.ops[f"{self.topo.follower_part}.fwd"]

    def _received(self, need: In, step: int, g: int) -> torch.Tensor:
        return self.store.pop(("in", step, need.tag, "leader", g))

    def _execute(self, op: Op, step: int, groups: list[np.ndarray]) -> None:
        """Run one operation of the table (:mod:`sluice.split.topology`) on group ``op.group``."""
        assert self.model is not None
        g = op.group
        spec = self.ops[op.name]
        need = spec.needs[0] if spec.needs else None
        assert need is None or isinstance(need, In)
        if op.name == "bottom.fwd":
            h = self.model(self.X[groups[g]])
            self.saved[g] = h
        elif op.name == "middle.fwd":
            assert need is not None
            a = self._received(need, step, g).requires_grad_(True)
            h = self.model(a)
            self.saved[g] = (a, h)
        elif op.name == "bottom.bwd":
            assert need is not None
            self.saved.pop(g).backward(self._received(need, step, g))
            return
        elif op.name == "middle.bwd":
            assert need is not None
            a, out = self.saved.pop(g)
            out.backward(self._received(need, step, g))
            h = a.grad
        else:  # pragma: no cover - the table has no other follower operation
            raise AssertionError(op.name)
        assert spec.sends is not None
        self.send_tensor("leader", step, g, spec.sends, h.detach())

    def step(self, s: int) -> None:
        assert self.model is not None
        self.reset_counters()
        groups = split_batch(self.plan.batch(s), self.groups)
        ops = self.topo.ops("follower", s, len(groups), ["leader"])
        self.run_graph(
            ops, lambda op: self._execute(op, s, groups), f"step {s} data from the leader", abortable=True
        )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if eval_due(s, self.steps, self.eval_every):
            self._evaluate(s)
        ops_s = {k: [round(v[0], 6), v[1]] for k, v in self.op_seconds.items()}
        body = {
            "step": s, "idle_s": self.idle, "busy_s": self.busy, "ops": ops_s, "bytes": self.sent_by_step[s]
        }
        self.send_control("leader", "step_done", body)  # counted by the leader on arrival

    def _evaluate(self, s: int) -> None:
        """The forward operation on the test set, sent under ``eval_<tag>``."""
        assert self.model is not None
        fwd = self._forward
        assert fwd.sends is not None
        with torch.no_grad():
            if fwd.needs:
                (need,) = fwd.needs
                key = ("in", s, eval_tag(need.tag), "leader", 0)
                t0 = time.perf_counter()
                self.wait_keys([key], f"evaluation data of step {s}")
                self.idle += time.perf_counter() - t0
                x = self.store.pop(key)
            else:
                x = self.X_test
            self.send_tensor("leader", s, 0, eval_tag(fwd.sends), self.model(x))

    def train(self) -> None:
        """The planned steps from ``first_step`` on (0, or where a resumed task goes on), then more when the
        leader extends the task; ends by :class:`Stopped`."""
        s = self.first_step
        while True:
            while s < self.steps:
                if self.stop_requested:
                    raise Stopped
                self.step(s)
                s += 1
                self.steps_done = s
            msg = self.wait_control("leader", ("extend", "stop"), "the end of the task")
            if msg.type == "stop":
                raise Stopped
            steps = int(msg.body["steps"])
            if steps > self.policy.max_steps:
                raise NegotiationError(
                    f"the leader extended the task to {steps} steps; this party allows at most "
                    f"{self.policy.max_steps}"
                )
            self.steps = steps

    def serve(self) -> dict[str, Any]:
        """Run the whole task until the leader stops it; returns this party's summary. Tells the leader on
        failure (a refused proposal was already answered with ``refuse``)."""
        # torch.set_num_threads binds the calling thread only (OpenMP, MKL): __init__ may have run in another
        # thread (an in-process follower is built by the leader's thread and serves in its own), which would
        # leave this one computing with a team of one thread per core
        torch.set_num_threads(1)
        try:
            self.negotiate()
        except Stopped:
            pass
        except NegotiationError:
            self.close_links()
            raise
        except BaseException as exc:
            fail_peers(self, exc)
            raise
        try:
            if not self.stop_requested:
                self.setup()
                self.train()
        except Stopped:
            pass
        except BaseException as exc:
            fail_peers(self, exc)
            raise
        self.send_control("leader", "bye", {"steps": self.steps_done, "link": self.link.stats.as_dict()})
        self.link.flush(5.0)
        self.finished_peers.add("leader")
        self.close_links()
        return {"name": self.name, "steps": self.steps_done, "link": self.link.stats.as_dict()}
