"""The follower: judges the leader's proposal, then trains its part of the model step after step.

Lifecycle: ``propose`` -> ``accept`` or ``refuse`` (with the reason) -> setup requests (``profile_req``,
``ping``, link probes) -> ``start`` (with G) -> steps -> ``stop`` -> ``bye``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from sluice.errors import DataError, NegotiationError, SluiceError
from sluice.transport.link import Link
from sluice.transport.wire import encode_tensor

from .config import PartyPolicy, SplitDataConfig
from .data import load_table, party_data
from .grouping import split_batch
from .models import batch_coupled_layers, build_mlp, make_optimizer, num_params, part_seed
from .ops import follower_ops
from .party import Stopped, Worker, fail_peers, to_tensor
from .schedule import Op
from .task import PROTOCOL, BatchPlan, eval_due

_DT = {"float32": torch.float32, "float64": torch.float64}


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
    steps = proposal.get("steps")
    if steps is not None and steps > policy.max_steps:
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
        self.saved: dict[int, Any] = {}

    # -- negotiation -----------------------------------------------------------------------------
    def negotiate(self) -> None:
        msg = self.wait_control("leader", "propose", "the task proposal")
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
        self.topology = p["topology"]
        ds = SplitDataConfig(**p["dataset"])
        table = load_table(ds, p["seed"])
        self.dtype = _DT[p["model"]["dtype"]]
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
        self.steps = p.get("steps")
        self.eval_every = p.get("eval_every", 0)

    # -- setup requests until "start" ----------------------------------------------------------
    def setup(self) -> None:
        while True:
            q = self.controls["leader"]
            while q:
                msg, _, _ = q.popleft()
                if msg.type == "start":
                    self.groups = int(msg.body["groups"])
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

    def profile(self, batch: int, repeats: int = 3) -> dict[str, Any]:
        """Seconds of this party's operations for groups of ``n`` samples (linear fit ``a0 + a1 n`` from
        two sizes, best of ``repeats``) and encoded bytes of what it sends per group."""
        assert self.model is not None
        sizes = [max(1, batch // 16), max(2, batch)]
        width = self.proposal["model"]["in"]
        fwd, bwd = [], []
        for n in sizes:
            x = torch.randn(n, width, dtype=self.dtype, generator=torch.Generator().manual_seed(n))
            tf = tb = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                if self.topology == "5":
                    x.requires_grad_(True)
                h = self.model(x)
                t1 = time.perf_counter()
                h.backward(torch.ones_like(h))
                t2 = time.perf_counter()
                tf, tb = min(tf, t1 - t0), min(tb, t2 - t1)
                x.grad = None
            fwd.append(tf)
            bwd.append(tb)
        self.model.zero_grad(set_to_none=True)
        emb = self.proposal["model"]["out"]
        b = [len(encode_tensor(0, 0, "emb", torch.zeros(n, emb, dtype=self.dtype))) for n in sizes]

        def fit(v: list[float]) -> list[float]:
            a1 = max(0.0, (v[1] - v[0]) / (sizes[1] - sizes[0]))
            return [max(0.0, v[0] - a1 * sizes[0]), a1]

        return {"fwd": fit(fwd), "bwd": fit(bwd), "bytes": fit([float(v) for v in b])}

    # -- training --------------------------------------------------------------------------------
    def _execute(self, op: Op, step: int, groups: list[np.ndarray]) -> None:
        assert self.model is not None
        g = op.group
        if op.name == "bottom.fwd":
            h = self.model(self.X[groups[g]])
            self.saved[g] = h
            self.send_tensor("leader", step, g, "emb", h.detach())
        elif op.name == "bottom.bwd":
            grad = self.store.pop(("in", step, "grad", "leader", g))
            self.saved.pop(g).backward(grad)
        elif op.name == "middle.fwd":
            a = self.store.pop(("in", step, "act1", "leader", g)).requires_grad_(True)
            h = self.model(a)
            self.saved[g] = (a, h)
            self.send_tensor("leader", step, g, "act2", h.detach())
        elif op.name == "middle.bwd":
            a, h = self.saved.pop(g)
            h.backward(self.store.pop(("in", step, "grad2", "leader", g)))
            self.send_tensor("leader", step, g, "grad1", a.grad)
        else:  # pragma: no cover - graphs only contain the names above
            raise AssertionError(op.name)

    def step(self, s: int) -> None:
        assert self.model is not None
        self.reset_counters()
        groups = split_batch(self.plan.batch(s), self.groups)
        ops = follower_ops(self.topology, s, len(groups), "leader")
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
        assert self.model is not None
        with torch.no_grad():
            if self.topology == "5":
                key = ("in", s, "eval_act1", "leader", 0)
                t0 = time.perf_counter()
                self.wait_keys([key], f"evaluation data of step {s}")
                self.idle += time.perf_counter() - t0
                out = self.model(self.store.pop(key))
                self.send_tensor("leader", s, 0, "eval_act2", out)
            else:
                self.send_tensor("leader", s, 0, "eval_emb", self.model(self.X_test))

    def train(self) -> None:
        s = 0
        try:
            while self.steps is None or s < self.steps:
                if self.stop_requested:
                    break
                self.step(s)
                s += 1
        except Stopped:
            pass
        self.steps_done = s
        self.wait_control("leader", "stop", "the end of the task")

    def serve(self) -> dict[str, Any]:
        """Run the whole task; returns this party's summary. Tells the leader on failure."""
        try:
            self.negotiate()
            self.setup()
            self.train()
            stats = self.link.stats.as_dict()
            self.send_control("leader", "bye", {"steps": self.steps_done, "link": stats})
            self.link.flush(5.0)
            self.finished_peers.add("leader")
            self.close_links()
            return {"name": self.name, "steps": self.steps_done, "link": self.link.stats.as_dict()}
        except Stopped:
            self.close_links()
            return {"name": self.name, "steps": 0, "link": self.link.stats.as_dict()}
        except NegotiationError:
            self.close_links()
            raise
        except BaseException as exc:
            fail_peers(self, exc)
            raise
