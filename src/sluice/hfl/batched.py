"""The clients of a simulated round trained together: one batched computation instead of one client at a time.

:class:`BatchedFit` reproduces :meth:`sluice.hfl.learner.Learner.fit` — the default training loop — for many
clients at once. Each client's parameters are a slice of a stacked tensor (client × parameter shape); one
step evaluates every client's loss on its own batch with ``torch.func`` (``vmap`` of ``functional_call`` of
the task's model and loss), takes every client's gradient in one backward pass of the losses' sum (the
clients share no parameter) and applies the optimizer's update to the stacked tensors, written out as
``torch.optim``'s single-tensor arithmetic of SGD (momentum, dampening, Nesterov, weight decay), Adam and
AdamW. Every client keeps its own batch order: the ``torch.Generator`` of its seed draws ``randperm`` once
per epoch exactly as ``Learner.fit`` does, so its batches are the same.

Clients of different data sizes are handled by **grouping**, not masking: a client's ``t``-th batch is its
``t``-th step; at step ``t`` the clients that still have a batch are grouped by that batch's size (the full
batch size, or the smaller last batch of an epoch) and each group is one batched computation on exactly its
own samples — no padding, no masked samples, so a client's arithmetic is the one of its own loop (a group of
one client runs the plain step). A client that has run out of batches sits out the later steps. Clients are
trained in chunks whose stacked state (models, gradients, optimizer slots) stays under :data:`CHUNK_BYTES`.

On the CPU, for models of linear layers (the built-in MLP tasks), the update Δ is bitwise the one-by-one
loop's with every optimizer above (the batched matrix products run the same kernel per client), so the
uploads' bytes and the accuracy are the same; the mean training loss may differ in the last bit (the loss's
reduction under ``vmap``). ``vmap`` runs a convolution as one grouped convolution of all the clients, whose
sums round differently in the last bit (and which is slower than one by one on the CPU: :func:`pays`). On a
GPU the one-by-one loop replays a CUDA graph with the fused SGD kernel, so the two agree to floating-point
tolerance only. The uploads are encoded by each client's own compressor, one client after the other, from
its Δ (on the device when the learner is on a GPU).

:func:`unbatchable` says why a task cannot train this way (then the simulator trains one by one): a model
with buffers (BatchNorm), parameters that are not float32, datasets that are not tensors, or an optimizer
other than plain ``torch.optim.SGD``, ``Adam`` or ``AdamW`` with one parameter group (AMSGrad, ``maximize``
and the other options the single-tensor loop has no closed form for included).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call, vmap
from torch.utils.data import Dataset, TensorDataset

from sluice.hfl.client import Client
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.hfl.server import Server

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 30
"""Bytes of stacked state (parameters, gradients, optimizer slots) per chunk of clients trained together."""
AUTO_MIN_CLIENTS = 4
"""``train.batched_clients = "auto"`` trains a round's clients together when at least this many train."""
CONVOLUTIONS = (torch.nn.modules.conv._ConvNd,)
"""Layers that ``vmap`` runs as one grouped convolution of all the clients, slower on the CPU than one by one."""


def pays(learner: Learner, clients: int) -> bool:
    """Whether ``train.batched_clients = "auto"`` trains ``clients`` clients together: at least
    :data:`AUTO_MIN_CLIENTS`, and on the CPU only a model without convolutions (``bench/simulation.py``:
    ``mnist_cnn`` together on the CPU is several times slower than one by one)."""
    if clients < AUTO_MIN_CLIENTS:
        return False
    return learner.device.type != "cpu" or not any(isinstance(m, CONVOLUTIONS) for m in learner.model.modules())


@dataclass(frozen=True)
class Rule:
    """The optimizer's update, read from the ``torch.optim`` object the task builds."""

    kind: str  # "sgd" or "adam"
    lr: float
    weight_decay: float = 0.0
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    decoupled: bool = False

    @property
    def slots(self) -> int:
        """Per-parameter state tensors the update keeps (momentum buffer; Adam's two moments)."""
        return 2 if self.kind == "adam" else int(self.momentum != 0)


def optimizer_rule(learner: Learner, lr: float) -> Rule | str:
    """The :class:`Rule` of the task's optimizer with learning rate ``lr``, or why it has none."""
    opt = learner.task.make_optimizer(list(learner.model.parameters()), lr)
    kind = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adam"}.get(type(opt))
    if kind is None:
        return f"its optimizer {type(opt).__name__} is not SGD, Adam or AdamW"
    if len(opt.param_groups) != 1:
        return f"its optimizer has {len(opt.param_groups)} parameter groups"
    g = opt.param_groups[0]
    bad = [k for k in ("maximize", "differentiable", "amsgrad", "capturable") if g.get(k)]
    if bad or any(isinstance(g.get(k), torch.Tensor) for k in ("lr", "betas", "weight_decay", "momentum")):
        return f"its optimizer sets {', '.join(bad) or 'tensor hyperparameters'}"
    if kind == "sgd":
        return Rule("sgd", float(g["lr"]), float(g["weight_decay"]), float(g["momentum"]), float(g["dampening"]),
                    bool(g["nesterov"]))
    return Rule("adam", float(g["lr"]), float(g["weight_decay"]), betas=tuple(float(b) for b in g["betas"]),
                eps=float(g["eps"]), decoupled=bool(g.get("decoupled_weight_decay", type(opt) is torch.optim.AdamW)))


def unbatchable(learner: Learner, lr: float, client_cls: type = Client) -> str | None:
    """Why the clients of a simulator (``client_cls`` objects training with ``learner``) cannot train together
    (see the module docstring), or None; :func:`untensored` checks their data."""
    own = [m for m in ("train", "local_update", "upload") if getattr(client_cls, m, None) is not getattr(Client, m)]
    if own:
        return f"its client class {client_cls.__name__} has its own {own[0]}"
    if type(learner).fit is not Learner.fit:
        return f"its learner {type(learner).__name__} has its own training loop"
    if learner.num_buffers:
        return "its model has buffers (BatchNorm statistics)"
    if any(p.dtype != torch.float32 for p in learner.model.parameters()):
        return "its model has parameters that are not float32"
    rule = optimizer_rule(learner, lr)
    return rule if isinstance(rule, str) else None


def untensored(data: list[Dataset]) -> str | None:
    """Why the datasets ``data`` cannot train together (they are not ``(inputs, targets)`` tensor datasets on
    one device), or None."""
    if not all(isinstance(ds, TensorDataset) and len(ds.tensors) == 2 for ds in data):
        return "its datasets are not (inputs, targets) TensorDatasets"
    return None


@dataclass
class Job:
    """One client's local training: from the flat model ``params`` on ``data``, batches seeded by ``seed``."""

    params: np.ndarray
    data: TensorDataset
    seed: int


class Updates(Sequence):
    """The ``(Δ, mean loss)`` of each client: Δ = θ_local − θ in float64 (both widened from float32, as
    :meth:`Learner.fit` computes it), made when item ``i`` is read, so that only the clients' float32 models
    stay in memory. ``chunks`` holds the trained and the starting models (client × d) of each chunk."""

    def __init__(self, chunks: list[tuple[torch.Tensor, torch.Tensor]], losses: list[float]) -> None:
        self.chunks, self.losses = chunks, losses
        self.where = [(k, i) for k, (trained, _) in enumerate(chunks) for i in range(trained.shape[0])]

    def __len__(self) -> int:
        return len(self.losses)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, float]:  # type: ignore[override]
        k, j = self.where[i]
        trained, start = self.chunks[k]
        return trained[j].double() - start[j].double(), self.losses[i]


class BatchedFit:
    """Local training of many clients together with one learner's model and loss (module docstring)."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        model = learner.model
        self.names = [n for n, _ in model.named_parameters()]
        self.shapes = [p.shape for p in model.parameters()]
        self.sizes = [p.numel() for p in model.parameters()]
        self.device = learner.device
        loss = learner.loss

        def step_loss(train: dict[str, torch.Tensor], frozen: dict[str, torch.Tensor], x: torch.Tensor,
                      y: torch.Tensor) -> torch.Tensor:
            return loss(functional_call(model, {**train, **frozen}, (x,)), y)

        self._loss = step_loss
        self._vloss = vmap(step_loss)

    def _grads(self, train: dict[str, torch.Tensor], frozen: dict[str, torch.Tensor], x: torch.Tensor,
               y: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Each client's gradient (of the ``train`` parameters) and loss on its batch: the losses of the clients'
        models by ``vmap`` and their gradients by one backward pass of their sum (the clients share no
        parameter, so each gets the gradient of its own loss); for a group of one client the plain step."""
        if x.shape[0] > 1:
            leaves = {n: p.detach().requires_grad_() for n, p in train.items()}
            with torch.enable_grad():
                loss = self._vloss(leaves, frozen, x, y)
                grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
            return dict(zip(leaves, grads, strict=True)), loss.detach()
        leaves = {n: p[0].detach().requires_grad_() for n, p in train.items()}
        with torch.enable_grad():
            loss = self._loss(leaves, {n: p[0] for n, p in frozen.items()}, x[0], y[0])
            grads = torch.autograd.grad(loss, list(leaves.values()))
        return {n: g.unsqueeze(0) for n, g in zip(leaves, grads, strict=True)}, loss.detach().unsqueeze(0)

    def fit(self, jobs: list[Job], *, epochs: int, batch_size: int, lr: float,
            trainable: int | None = None) -> Updates:
        """``(Δ, mean loss)`` of each job, as :meth:`Learner.fit` gives them: Δ a float64 tensor on the
        learner's device, made when it is read (:class:`Updates`)."""
        rule = optimizer_rule(self.learner, lr)
        if isinstance(rule, str):
            raise ValueError(f"task {self.learner.task.name!r} cannot train batched: {rule}")
        keep = len(self.learner.layers) if trainable is None else trainable
        layers = self.learner.layers
        ids = {id(p) for i, group in enumerate(layers) if i >= len(layers) - keep for p in group}
        train = [n for n, p in zip(self.names, self.learner.model.parameters(), strict=True) if id(p) in ids]
        per_client = sum(self.sizes) * 4 * (4 + rule.slots)  # start, trained, gradient, slots
        chunk = max(1, CHUNK_BYTES // max(1, per_client))
        chunks, losses = [], []
        for s in range(0, len(jobs), chunk):
            trained, start, chunk_losses = self._fit_chunk(jobs[s : s + chunk], rule, set(train), epochs, batch_size)
            chunks.append((trained, start))
            losses += chunk_losses
        return Updates(chunks, losses)

    def _fit_chunk(self, jobs: list[Job], rule: Rule, train: set[str], epochs: int,
                   batch_size: int) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
        """The trained and the starting models (client × d, float32) of ``jobs`` and their mean losses."""
        start = torch.from_numpy(np.stack([np.ascontiguousarray(j.params, dtype=np.float32) for j in jobs]))
        start = start.to(self.device)
        params = dict(zip(self.names, self._unflatten(start), strict=True))
        xs, ys, idx, sizes = self._schedule(jobs, epochs, batch_size)
        total = torch.zeros(len(jobs), dtype=torch.float64, device=self.device)
        slots: dict[str, list[torch.Tensor]] = {}
        for t in range(sizes.shape[1]):
            col = sizes[:, t]
            for r in sorted(set(col.tolist()) - {0}):
                pos = torch.nonzero(col == r).flatten()
                whole = pos.shape[0] == len(jobs)
                pos_d = pos.to(self.device)
                sub = {n: (p if whole else p.index_select(0, pos_d)) for n, p in params.items()}
                gi = idx[pos, t, :r].to(self.device)
                grads, loss = self._grads({n: sub[n] for n in train}, {n: v for n, v in sub.items() if n not in train},
                                         xs[gi], ys[gi])
                total.index_add_(0, pos_d, loss.detach().double() * r)
                for n in train:
                    new = self._update(rule, n, sub[n], grads[n], slots, pos_d, whole, t, len(jobs))
                    if whole:
                        params[n] = new
                    else:
                        params[n].index_copy_(0, pos_d, new)
        flat = torch.cat([params[n].reshape(len(jobs), -1) for n in self.names], dim=1)
        total = total.cpu()
        return flat, start, [float(total[i]) / max(epochs * len(j.data), 1) for i, j in enumerate(jobs)]

    def _unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        parts = torch.split(flat, self.sizes, dim=1)
        return [p.reshape(flat.shape[0], *shape).clone() for p, shape in zip(parts, self.shapes, strict=True)]

    def _schedule(self, jobs: list[Job], epochs: int,
                  bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The chunk's samples stacked (inputs, targets), and per client and step the rows of its batch
        (``idx``: client × step × batch size, into the stacked samples) and the batch's size (0: no batch)."""
        xs = torch.cat([j.data.tensors[0].to(self.device) for j in jobs])
        ys = torch.cat([j.data.tensors[1].to(self.device) for j in jobs])
        ns = [len(j.data) for j in jobs]
        steps = max((epochs * math.ceil(n / bs) for n in ns), default=0)
        idx = torch.zeros(len(jobs), steps, bs, dtype=torch.int64)
        sizes = torch.zeros(len(jobs), steps, dtype=torch.int64)
        offset = 0
        for c, n in enumerate(ns):
            gen = torch.Generator().manual_seed(jobs[c].seed)
            order = torch.cat([torch.randperm(n, generator=gen) for _ in range(epochs)]) + offset
            nb = math.ceil(n / bs)
            if nb:
                pad = torch.zeros(epochs, nb * bs, dtype=torch.int64)
                pad[:, :n] = order.reshape(epochs, n)
                idx[c, : epochs * nb] = pad.reshape(epochs * nb, bs)
                per_epoch = torch.full((nb,), bs, dtype=torch.int64)
                per_epoch[-1] = n - (nb - 1) * bs
                sizes[c, : epochs * nb] = per_epoch.repeat(epochs)
            offset += n
        return xs, ys, idx, sizes

    @staticmethod
    def _update(rule: Rule, name: str, p: torch.Tensor, g: torch.Tensor, slots: dict[str, list[torch.Tensor]],
                pos: torch.Tensor, whole: bool, t: int, m: int) -> torch.Tensor:
        """Parameters ``p`` (the clients ``pos``) after one step with gradient ``g``, the optimizer slots in
        ``slots[name]`` (stacked over all ``m`` clients) updated: ``torch.optim``'s single-tensor arithmetic."""
        if name not in slots:
            slots[name] = [torch.zeros(m, *p.shape[1:], dtype=p.dtype, device=p.device) for _ in range(rule.slots)]
        state = slots[name]
        own = state if whole else [s.index_select(0, pos) for s in state]
        if rule.kind == "sgd":
            if rule.weight_decay != 0:
                g = g.add(p, alpha=rule.weight_decay)
            if rule.momentum != 0:
                buf = own[0]
                if t == 0:
                    buf = g.detach().clone()
                else:
                    buf.mul_(rule.momentum).add_(g, alpha=1 - rule.dampening)
                g = g.add(buf, alpha=rule.momentum) if rule.nesterov else buf
                own = [buf]
            new = p.add(g, alpha=-rule.lr)
        else:
            new = _adam(rule, p, g, own, t + 1)
        for s, o in zip(state, own, strict=True):
            if whole:
                s.copy_(o)
            else:
                s.index_copy_(0, pos, o)
        return new


def _adam(rule: Rule, p: torch.Tensor, g: torch.Tensor, own: list[torch.Tensor], step: int) -> torch.Tensor:
    """One Adam/AdamW step of ``p`` (in place on copies of its slots ``own``), as ``torch.optim.adam``'s
    single-tensor loop computes it."""
    beta1, beta2 = rule.betas
    exp_avg, exp_avg_sq = own
    p = p.clone()
    if rule.weight_decay != 0:
        if rule.decoupled:
            p.mul_(1 - rule.lr * rule.weight_decay)
        else:
            g = g.add(p, alpha=rule.weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = rule.lr / (1 - beta1**step)
    denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(rule.eps)
    p.addcdiv_(exp_avg, denom, value=-step_size)
    return p


class Together:
    """The clients of one simulated round that train together: :meth:`add` each (with the model it synced to),
    then :meth:`run`. ``fallback(why)`` is called when the batched computation fails (a loss ``vmap`` cannot
    batch...): the round's clients then train one by one from the same models, and so do later rounds."""

    def __init__(self, fit: BatchedFit, clients: list[Client], data: list[Dataset], cfg: HFLConfig,
                 fallback: Callable[[str], None]) -> None:
        self.fit, self.clients, self.data, self.cfg, self.fallback = fit, clients, data, cfg, fallback
        self.held: list[tuple[int, np.ndarray]] = []

    def add(self, client: int, held: np.ndarray) -> None:
        self.held.append((client, held))

    def run(self, rnd: int, budget: dict[int, dict[str, float]]) -> Iterator[tuple[int, bytes, float, float]]:
        """Train the clients together and yield each one's ``(client, upload, seconds, started)`` in the order
        added: its upload encoded by its own compressor (:meth:`Client.upload`), its seconds its share of the
        batched training plus its own encoding."""
        tr = self.cfg.train
        jobs = [Job(held, self.data[c], self.clients[c].batch_seed(rnd)) for c, held in self.held]
        started, t0 = time.time(), time.perf_counter()
        results: Updates | None
        try:
            results = self.fit.fit(jobs, epochs=tr.local_epochs, batch_size=tr.batch_size, lr=tr.lr,
                                   trainable=self.clients[self.held[0][0]].trainable_layers if self.held else None)
        except Exception as exc:  # noqa: BLE001 - any failure of the batched step: train one by one
            self.fallback(f"its training step does not run batched ({type(exc).__name__}: {exc})")
            results = None
        share = (time.perf_counter() - t0) / max(1, len(jobs))
        for i, (c, held) in enumerate(self.held):
            client, t1 = self.clients[c], time.perf_counter()
            if results is None:
                delta = client.local_update(held, jobs[i].data, rnd)
            else:
                delta, client.train_loss = results[i]
                on_device = client.updates_on_device and delta.device.type != "cpu"
                delta = delta if on_device else delta.cpu().numpy()
            upload = client.upload(delta, rnd, **budget.get(c, {}))
            yield c, upload, time.perf_counter() - t1 + (0.0 if results is None else share), started


class Batching:
    """Whether and how a simulator's rounds train their clients together (``train.batched_clients``).

    :meth:`together` gives the round's :class:`Together`, or None when its clients train one by one: the mode is
    off, ``"auto"`` finds it does not pay, or the task cannot (said once, through :meth:`one_by_one`, as a note
    appended to ``notes`` and a log line; from then on every round trains one by one). :meth:`messages` makes
    the round's downlink messages for clients trained together."""

    def __init__(self, learner: Learner, cfg: HFLConfig, client_cls: type, notes: list[str], task_name: str) -> None:
        self.learner, self.cfg, self.client_cls, self.notes, self.task_name = learner, cfg, client_cls, notes, task_name
        self.why: str | None = None  # why the clients cannot train together
        self._said = False
        self._fit: BatchedFit | None = None

    @staticmethod
    def messages(server: object, clients: list[int]) -> list[bytes]:
        """The round's downlink messages for ``clients``, in client order: by Sluice's server each different
        message encoded once (:meth:`Server.messages`), the same bytes as one by one."""
        if type(server).message is Server.message and hasattr(server, "messages"):
            return server.messages(clients)
        return [server.message(c) for c in clients]

    def together(self, sampled: np.ndarray, failed: np.ndarray, clients: list[Client],
                 data: list[Dataset]) -> Together | None:
        """The round's clients that train together, or None: one by one."""
        mode = self.cfg.train.batched_clients
        if mode is False or (mode == "auto" and not pays(self.learner, len(sampled) - int(failed.sum()))):
            return None
        if self.why is None and self._fit is None:
            self.why = unbatchable(self.learner, self.cfg.train.lr, self.client_cls)
        why = self.why or untensored([data[c] for c in sampled.tolist()])
        if why is None:
            self._fit = self._fit or BatchedFit(self.learner)
            return Together(self._fit, clients, data, self.cfg, self.one_by_one)
        self.one_by_one(why)
        return None

    def one_by_one(self, why: str) -> None:
        """From now on the clients train one by one, because ``why``: said once, as a note and a log line."""
        if not self._said:
            note = (f"train.batched_clients: the clients train one by one, task {self.task_name!r} cannot train "
                    f"together: {why}")
            self.notes.append(note)
            logger.warning(note)
            self._said = True
        self.why = why

