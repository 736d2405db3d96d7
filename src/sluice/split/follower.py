"""The follower: judges the leader's proposal, then trains its part of the model step after step.

Lifecycle: ``propose`` -> ``accept`` or ``refuse`` (with the reason) -> setup requests (``profile_req``,
``ping``, link probes) -> ``start`` (with G) -> the planned steps, each followed by ``step_done`` ->
``extend`` (more steps) or ``stop``. The leader may send ``stop`` at any point, even before the proposal;
the follower then abandons the step it is in (its weights keep the last finished step) and answers
``bye``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from sluice.errors import DataError, NegotiationError, SluiceError
from sluice.transport.link import Link
from sluice.wire.tensor import encode_tensor

from .config import PartyPolicy, SplitDataConfig
from .data import load_table, party_data
from .grouping import linear_fit, profile_sizes, split_batch
from .models import batch_coupled_layers, build_mlp, make_optimizer, num_params, part_seed, torch_dtype
from .party import Stopped, Worker, fail_peers, to_tensor
from .schedule import Op
from .task import PROTOCOL, BatchPlan, eval_due
from .topology import In, OpSpec, eval_tag, topology


def judge(policy: PartyPolicy, proposal: dict[str, Any], secure: bool) -> str | None:
    """Why this party refuses ``proposal`` (``None``: acceptable). Sample ids are checked later, with data."""
    if proposal.get("protocol") != PROTOCOL:
        return f"protocol version {proposal.get('protocol')} is not supported (this party speaks {PROTOCOL})"
    ds = proposal["dataset"]["dataset"]
    if ds not in policy.datasets:
        return f"dataset {ds!r} is not offered here (offered: {', '.join(policy.datasets)})"
    if policy.columns is not None:
        extra = sorted(set(proposal["columns"]) - set(policy.columns))
        if extra:
            return f"columns {extra[:8]} are not held here (held: {sorted(policy.columns)[:8]}...)"
    n = num_params(proposal["model"])
    if n > policy.max_params:
        return f"the proposed model part has {n} parameters; this party allows at most {policy.max_params}"
    steps = int(proposal["steps"])
    if steps > policy.max_steps:
        return f"{steps} steps proposed; this party allows at most {policy.max_steps}"
    if policy.require_tls and not secure:
        return "this party requires TLS (transport.tls) and the connection is not encrypted"
    if bool(proposal.get("tls")) != secure:
        state = "encrypted" if secure else "not encrypted"
        return f"the proposal says tls={proposal.get('tls')} but the connection is {state}"
    coupled = proposal["model"].get("batch_norm") and proposal.get("groups") != 1
    if coupled and not proposal.get("allow_batch_coupled"):
        return "BatchNorm in a bottom model with G > 1 would not give the full-batch update"
    return None


class Follower(Worker):
    """A party holding some feature columns (4A, 6) or the middle model (5), serving one leader's task."""

    def __init__(
        self, link: Link, policy: PartyPolicy, timeout_s: float, threshold: int | None = None
    ) -> None:
        super().__init__("follower", {"leader": link}, timeout_s, threshold)
        torch.set_num_threads(1)
        self.policy = policy
        self.link = link
        self.model: torch.nn.Module | None = None
        self.proposal: dict[str, Any] = {}
        self.steps_done = 0
        self.first_step = 0
        self.saved: dict[int, Any] = {}

    # -- negotiation -----------------------------------------------------------------------------
    def negotiate(self) -> None:
        msg = self.wait_control("leader", ("propose", "stop"), "the task proposal")
        if msg.type == "stop":
            raise Stopped
        p = msg.body
        try:
            reason = judge(self.policy, p, self.link.secure)
            if reason is None:
                self._prepare(p)
        except DataError as exc:
            reason = f"sample ids do not match: {exc}"
        except SluiceError as exc:
            reason = str(exc)
        except (KeyError, TypeError, ValueError) as exc:
            reason = f"malformed proposal ({type(exc).__name__}: {exc})"
        if reason is not None:
            self.send_control("leader", "refuse", {"reason": reason})
            self.link.flush(2.0)
            raise NegotiationError(f"refused the task of the leader: {reason}")
        assert self.model is not None
        self.send_control(
            "leader",
            "accept",
            {
                "name": self.name,
                "params": sum(q.numel() for q in self.model.parameters()),
                "secure": self.link.secure,
            },
        )

    def _prepare(self, p: dict[str, Any]) -> None:
        self.proposal = p
        self.name = p["follower"]
        self.topo = topology(p["topology"])
        self.ops = self.topo.specs("follower")
        ds = SplitDataConfig(**p["dataset"])
        table = load_table(ds, p["seed"])
        self.dtype = torch_dtype(p["model"]["dtype"])
        data = party_data(
            table,
            p["columns"],
            p["train_ids"],
            p["test_ids"],
            with_labels=False,
            dtype=np.float64,
            missing_ids=set(self.policy.missing_ids),
        )
        self.X = to_tensor(data.X_train, self.dtype)
        self.X_test = to_tensor(data.X_test, self.dtype)
        self.model = build_mlp(p["model"], part_seed(p["seed"], p["part"]))
        if batch_coupled_layers(self.model) and p.get("groups") != 1 and not p.get("allow_batch_coupled"):
            raise NegotiationError("BatchNorm with G > 1 refused")
        self.opt = make_optimizer(list(self.model.parameters()), p["hparams"])
        self.plan = BatchPlan(len(p["train_ids"]), p["hparams"]["batch_size"], p["seed"])
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
            self.pump(True, "the start of training")

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
        :meth:`sluice.split.leader.Leader._time`)."""
        assert self.model is not None
        sizes = profile_sizes(batch)
        width = self.proposal["model"]["in"]
        fwd, bwd = [], []
        for n in sizes:
            x = torch.randn(n, width, dtype=self.dtype, generator=torch.Generator().manual_seed(n))
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
        emb = self.proposal["model"]["out"]
        tag = self._forward.sends
        assert tag is not None
        b = [len(encode_tensor(0, 0, tag, torch.zeros(n, emb, dtype=self.dtype))) for n in sizes]
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
