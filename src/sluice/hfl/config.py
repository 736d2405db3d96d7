"""Configuration of horizontal FL (``sluice run``): data, model, local training and compression.

Every option has a default that runs: digits split by Dirichlet(0.3) over 20 clients, q = 0.25,
unbiased sampled uploads of 2 % of the coordinates a client on average (half of a round's budget split
evenly, half by the clients' aggregation weights) with sign values, server top-k with error feedback
(0.5 % of the coordinates in a round that aggregates 5 uploads of 20 clients, steps of one sign bit a
value) and a per-client sparse downlink. ``train.rounds`` is the default iteration limit of a job;
``[termination] iterations`` replaces it when given."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sluice.data.config import DataConfig
from sluice.schema import DEVICE_PATTERN, Section
from sluice.tasks.config import TABULAR_NAMES, TaskConfig

DOWN_BUDGET, DOWN_ADAPT = 0.02, 1.0
"""``compression.down_budget`` and ``down_adapt`` where they are unset and the client optimizer is not adaptive
(:mod:`sluice.hfl.fit`)."""


class ModelConfig(Section):
    hidden: list[int] = Field(default_factory=lambda: [128, 128], description="hidden layers of a built-in MLP task")

    @model_validator(mode="after")
    def _positive(self) -> ModelConfig:
        if any(h <= 0 for h in self.hidden):
            raise ValueError(f"hidden layer sizes must be positive integers, got {self.hidden}")
        return self


class TrainConfig(Section):
    rounds: int = Field(150, ge=1, description="rounds; the default iteration limit of a job")
    participation: float = Field(0.25, gt=0, le=1, description="fraction q of clients sampled per round")
    dropout: float = Field(0.0, ge=0, lt=1, description="probability a sampled client fails mid-round")
    local_epochs: int = Field(2, ge=1, description="epochs of local training per round")
    batch_size: int = Field(16, ge=1, description="local minibatch size")
    lr: float = Field(0.05, gt=0, description="local learning rate (the default SGD optimizer's)")
    server_lr: float = Field(1.0, gt=0, description="server step size eta on the aggregate")
    eval_every: int = Field(1, ge=1, description="evaluate the server model on the test set every this many rounds")
    device: str = Field("cpu", pattern=DEVICE_PATTERN, description="where local training and evaluation run: auto "
                        "(a CUDA GPU when there is one), cpu, cuda or cuda:N")
    batched_clients: bool | Literal["auto"] = Field(
        False, description="simulator: train the clients of a round together, as one batched computation "
        "(torch.func vmap; clients of different data sizes grouped by batch size), with the same batch order and, "
        "on the CPU, the same updates as one by one; a task with its own optimizer (not SGD, Adam or AdamW), a "
        "model with BatchNorm buffers or a client class of its own trains one by one, with a note; auto = "
        "together in rounds that train at least 4 clients, on the CPU only for models without convolutions "
        "(slower there together); false = one by one")


class CompressionConfig(Section):
    up: Literal["dense", "randk", "topk", "sample", "sketch"] = Field(
        "sample", description="upload compressor: unbiased importance sample, top-k, rand-k, count sketch or dense")
    uplink: str | None = Field(None, description="package.module:function returning your own upload compressor (a "
                               "sluice.compress Stage chain or Compressor), called with this [compression] section; "
                               "replaces up, up_values, up_feedback, up_sure_fp16, lossless and sketch_*; up_ratio "
                               "(each upload's k/d, split by up_by_weight) reaches it in the section it gets")
    up_ratio: float = Field(0.02, gt=0, le=1, description="k/d for rand-k, top-k and sample uploads (expected k "
                                                          "for sample)")
    up_values: Literal["auto", "fp32", "fp16", "int8", "sign"] = Field(
        "auto", description="upload value type; auto = fp32 for dense uploads, sign for sample uploads, int8 "
                            "(with a per-message scale) for other compressed ones; sign = one bit per value "
                            "times the mean magnitude"
    )
    up_sure_fp16: bool = Field(False, description="sample uploads with sign values: send the coordinates kept for "
                               "sure (above the sample's cap, where rounding to the signs' scale holds back most "
                               "of a large upload) in fp16 beside the signs; for an up_ratio above the default's "
                               "0.02")
    up_by_weight: float = Field(0.5, ge=0, le=1, description="share of a round's uplink budget (up_ratio times "
                                "the sampled clients) given out in proportion to the sampled clients' aggregation "
                                "weights n_c / sum n; the rest is split evenly (randk, topk, sample); 0: every "
                                "upload gets up_ratio")
    up_feedback: bool = Field(True, description="keep what an upload left out (top-k) or rounded (rand-k, "
                                                "sample) in the client's residual and send it with its next "
                                                "upload")
    sketch_rows: int = Field(5, ge=1, description="rows of a count-sketch upload")
    sketch_cols_ratio: float = Field(0.1, gt=0, le=1, description="sketch columns as a fraction of d")
    lossless: Literal["none", "zstd"] = Field("none", description="lossless compression of uploads")
    down: Literal["dense", "topk"] = Field("topk", description="server step: top-k of the aggregate with error "
                                           "feedback, or dense (FedAvg)")
    down_ratio: float | None = Field(None, gt=0, le=1, description="k/d the server applies per round (top-k); "
                                     "unset: down_budget times the share of the clients whose uploads it aggregated")
    down_budget: float | None = Field(None, gt=0, le=1, description="k/d the server applies in a round that "
                                      "aggregates an upload from every client, when down_ratio is unset: a round "
                                      "that aggregates M uploads of N clients applies down_budget*M/N; unset: "
                                      "0.02, or 0.05 when the client optimizer is adaptive (Adam, RMSprop...)")
    up_min: int | None = Field(None, ge=0, description="coordinates an upload (randk, topk, sample) keeps at least; "
                               "unset: 512 when the client optimizer is adaptive or the model has normalisation "
                               "or recurrent layers, else 0")
    down_min: int | None = Field(None, ge=0, description="coordinates the server's top-k step moves at least in a "
                                 "round (at the expected participation); unset: 256 when the client optimizer is "
                                 "adaptive or the model has normalisation or recurrent layers, else 0")
    down_values: Literal["auto", "fp32", "fp16", "int8", "sign"] = Field(
        "auto", description="type of the server's applied steps; auto = sign (one bit per value times the mean "
                            "magnitude) with top-k, fp32 with dense; int8 = with a per-step scale"
    )
    down_adapt: float | None = Field(
        None, ge=0, le=10, description="rate beta of the adaptive server step (top-k): the step's gain (1 to 10) is "
        "multiplied by exp(beta*(A - 1/2)) in a round where A, the share of the n heard coordinates of the last step "
        "where the new aggregate has the step's sign, is more than 1/(2*sqrt(n)) from 1/2 (rounds with fewer than 4 "
        "uploads or 8 heard coordinates pool their counts with the next ones'); 0: gain 1; unset: 1, or 0 when the "
        "client optimizer is adaptive (Adam, RMSprop...)")
    momentum: float = Field(0.0, ge=0, lt=1, description="server momentum rho")
    momentum_replay: float = Field(0.4, ge=0, le=10, description="with momentum and a top-k server step: share of "
                                   "the output layer's coordinates whose innovation the server sends in a round "
                                   "that aggregates an upload from every client (M uploads of N clients: "
                                   "momentum_replay*M/N, at most 1), the clients replaying the momentum on the "
                                   "whole output layer; 0: the output layer takes the sparse heavy ball as the "
                                   "rest of the model")
    downlink: Literal["dense", "initial", "per-client", "anchor"] = Field(
        "per-client", description="what a client receives: the steps it missed (per-client), a patch from the "
                                  "initial model or the last anchor, or the dense model")
    anchor_every: int = Field(10, ge=1, description="rounds between anchors (downlink anchor)")

    @field_validator("uplink")
    @classmethod
    def _reference(cls, ref: str | None) -> str | None:
        if ref is not None and (":" not in ref or not all(ref.partition(":")[::2])):
            raise ValueError("must be 'package.module:function'")
        return ref

    @property
    def weighted_uploads(self) -> bool:
        """Whether the uploads are sized by weight: ``up_by_weight > 0`` with randk, topk or sample uploads, or
        with the user's ``uplink`` (which reads its share as ``up_ratio``)."""
        return self.up_by_weight > 0 and (self.uplink is not None or self.up in ("randk", "topk", "sample"))

    def up_shares(self, sizes: list[float]) -> list[float]:
        """k/d of each upload in a round whose sampled clients hold ``sizes`` samples (their aggregation
        weights): ``up_ratio·((1 − a) + a·M·n_c/Σn)`` with ``a = up_by_weight`` and M clients, at most 1.

        The round's expected budget stays ``M·up_ratio``. The aggregate of sampled uploads has variance
        ``Σ w_c²·V_c/k_c`` (``V_c`` the spread of client c's update); at equal ``V_c`` it is smallest at
        ``k_c ∝ w_c``, which cuts it by ``M_eff/M`` (``M_eff = 1/Σ w_c²``) where the clients' sizes differ
        (an upload keeps at least one coordinate). The even part keeps every upload at ``(1 − a)·up_ratio`` or
        more, so that a client that weighs little still sends more than a few coordinates."""
        a, total, m = self.up_by_weight, float(sum(sizes)), len(sizes)
        if not self.weighted_uploads or total <= 0:
            return [self.up_ratio] * m
        return [min(1.0, max(1e-9, self.up_ratio * ((1 - a) + a * m * float(n) / total))) for n in sizes]

    def replay_share(self, uploads: int, clients: int) -> float:
        """Share of the output layer's coordinates in a round's innovation of replayed momentum, in a round
        that aggregated ``uploads`` uploads of ``clients`` clients: ``momentum_replay·uploads/clients``, at most 1
        (the innovation reaches every client, as the step does: see :meth:`down_share`)."""
        return min(1.0, self.momentum_replay * max(1, uploads) / max(1, clients))

    @property
    def budget(self) -> float:
        """``down_budget``, or :data:`DOWN_BUDGET` where it is unset (the engine fits it to the task first)."""
        return DOWN_BUDGET if self.down_budget is None else self.down_budget

    @property
    def adapt(self) -> float:
        """``down_adapt``, or :data:`DOWN_ADAPT` where it is unset (the engine fits it to the task first)."""
        return DOWN_ADAPT if self.down_adapt is None else self.down_adapt

    def down_share(self, uploads: int, clients: int) -> float:
        """k/d of the server's top-k in a round that aggregated ``uploads`` uploads of ``clients`` clients (at
        most 1): ``down_ratio``, or ``down_budget·uploads/clients``."""
        if self.down_ratio is not None:
            return self.down_ratio
        return min(1.0, self.budget * max(1, uploads) / max(1, clients))


class HFLData(DataConfig):
    dataset: Literal[TABULAR_NAMES] = Field("digits", description="the built-in dataset of the default MLP task")


class HFLConfig(Section):
    seed: int = Field(0, description="seeds the data split, the model, sampling and compression: the same "
                      "configuration gives the same numbers")
    task: TaskConfig = Field(default_factory=TaskConfig)
    data: HFLData = Field(default_factory=HFLData)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    compression: CompressionConfig = Field(default_factory=CompressionConfig)
