"""Configuration of pipelined split training (``sluice split run`` / ``sluice split party``).

Every option has a default that runs: breast cancer split as FATE does (leader x0-x9 and the label,
one follower x10-x29), topology 6 (leader bottom + follower bottom -> leader top), G chosen
automatically, leader and follower in separate processes over loopback gRPC.

``[task]`` is this party's own task (:mod:`sluice.tasks.split`): a built-in split task (by default the one
``[data] dataset`` names, its parts MLPs of ``[model]``) or ``factory = "package.module:function"``. A
follower's task is its own ``[task]`` (``sluice split party --role follower``); ``sluice split run``, which
starts the followers on this machine, gives follower ``name`` the section ``[follower_tasks.<name>]``, else
the leader's ``[task]`` (a factory then gets ``party = "<name>"``). The leader never sends a task to a
follower: the parties find the ids they share by private set intersection and agree on the rows.

A built-in scenario is split by its own vertical feature groups, sized by ``[data.scenario]``: a
classification one (``kpi_anomaly``, ``coverage`` with ``target = "problems"``) trains with cross-entropy, a
regression one (``energy``, ``coverage`` with ``target = "signals"``) with the mean squared error over its
standardised targets and reports ``test_mse``, ``test_mae``, ``test_rmse``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sluice.data.config import ScenarioTable
from sluice.schema import DEVICE_PATTERN, Section
from sluice.tasks.config import SPLIT_BUILTIN_NAMES, SplitTaskConfig

from .topology import TOPOLOGIES, TopologyName


class SplitDataConfig(Section):
    dataset: str = Field("breast_cancer", description="the built-in split task when [task] names none: "
                         + ", ".join(SPLIT_BUILTIN_NAMES))
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of the aligned rows held out for testing "
                                 "(stratified by the leader's labels), unless the leader's table marks its own")
    min_common_ids: int = Field(10, ge=2, description="fewest ids every party must share (else refused before "
                                "training)")
    # make_classification ("classification") only
    n_samples: int = Field(20_000, ge=20)
    n_features: int = Field(64, ge=2)
    n_informative: int = Field(16, ge=1)
    n_classes: int = Field(2, ge=2, le=100)
    leader_columns: list[int] | None = Field(
        None, description="feature columns of the leader (default: per dataset and topology)"
    )
    follower_columns: list[list[int]] | None = Field(
        None, description="feature columns of each follower (default: per dataset and topology)"
    )
    scenario: ScenarioTable = Field(default_factory=dict)

    @field_validator("dataset")
    @classmethod
    def _builtin(cls, v: str) -> str:
        if v not in SPLIT_BUILTIN_NAMES:
            raise ValueError(f"must be one of {', '.join(SPLIT_BUILTIN_NAMES)} (a built-in split task; your own "
                             "tables: [task] factory)")
        return v


class SplitModelConfig(Section):
    """The MLP parts of a built-in split task (a task of your own brings its own parts);
    ``allow_batch_coupled`` applies to every task."""

    bottom_hidden: list[int] = Field(default_factory=lambda: [32])
    embedding: int = Field(16, ge=1, description="width of what a bottom model sends")
    top_hidden: list[int] = Field(default_factory=lambda: [32])
    middle_hidden: list[int] = Field(default_factory=lambda: [32], description="follower model B (U-shape)")
    activation: Literal["relu", "tanh"] = "relu"
    batch_norm: bool = Field(False, description="BatchNorm after each hidden layer of bottom models")
    allow_batch_coupled: bool = Field(
        False,
        description="accept batch-coupled layers (BatchNorm) with G > 1: updates are then NOT exactly the "
        "full-batch update",
    )
    dtype: Literal["float32", "float64"] = "float32"

    @field_validator("bottom_hidden", "top_hidden", "middle_hidden")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(h <= 0 for h in v):
            raise ValueError(f"hidden layer sizes must be positive integers, got {v}")
        return v


class SplitTrainConfig(Section):
    epochs: int = Field(30, ge=1)
    steps: int | None = Field(None, ge=1, description="total steps (overrides epochs)")
    batch_size: int = Field(64, ge=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    eval_every: int = Field(10, ge=0, description="evaluate every N steps and after the last (0: last only)")
    eval_samples: int = Field(2000, ge=1, description="at most this many test samples per evaluation")
    device: str = Field("cpu", pattern=DEVICE_PATTERN, description="where this party's parts train: auto, cpu, "
                        "cuda or cuda:N (each party its own)")


class PipelineConfig(Section):
    groups: int | Literal["auto", "seed"] = Field(
        "auto",
        description="G: groups per batch; 'auto': measure, then minimise the predicted step time; 'seed': "
        "measure, then the seed's formula (transfer time / compute time of a batch, rounded)",
    )
    max_groups: int = Field(32, ge=1, description="largest G 'auto' may choose")
    switch_interval_ms: float | None = Field(
        0.5, gt=0, description="Python thread switch interval while parties run (restored afterwards); "
        "a short one hands the interpreter back to the compute thread quickly after transport threads ran. "
        "None: leave it alone"
    )
    op_overhead_ms: float = Field(
        0.3, ge=0, description="per-operation cost that isolated timing misses (dispatch, scheduling, "
        "message handling); used only by the automatic choice of G"
    )
    queue_threshold_bytes: int | None = Field(
        None, ge=1, description="P4 back-pressure threshold; default: 1% of available memory, 1-256 MB"
    )

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"groups must be a positive integer, 'auto' or 'seed', got {v}")
        return v


class EmulationConfig(Section):
    """The in-process link (``transport.kind = "inproc"``)."""

    bandwidth_mbps: float | None = Field(None, gt=0, description="each direction; None: unlimited")
    latency_ms: float = Field(0.0, ge=0, description="one-way")
    burst_bytes: int = Field(16 * 1024, ge=1)


class TlsConfig(Section):
    enabled: bool = False
    cert: str | None = Field(None, description="PEM certificate of this party")
    key: str | None = Field(None, description="PEM private key of this party")
    ca: str | None = Field(None, description="PEM CA that signed the peers' certificates (mutual TLS)")
    server_name: str | None = Field(None, description="name to expect in the follower's certificate")

    @model_validator(mode="after")
    def _files(self) -> TlsConfig:
        if self.enabled and (not self.cert or not self.key):
            raise ValueError("tls.enabled needs tls.cert and tls.key (PEM files); tls.ca turns on mutual TLS")
        return self


class TransportConfig(Section):
    kind: Literal["grpc", "inproc"] = Field("grpc", description="grpc: separate processes; inproc: threads")
    timeout_s: float = Field(30.0, gt=0, description="a silent peer is an error after this many seconds")
    setup_timeout_s: float = Field(300.0, gt=0, description="the same before training, while a peer loads its task, "
                                   "intersects ids with the other parties or measures itself (at least timeout_s)")
    connect_timeout_s: float = Field(20.0, gt=0)
    listen: str = Field("127.0.0.1:0", description="where followers listen (split run: loopback)")
    emulate: EmulationConfig = Field(default_factory=EmulationConfig)
    tls: TlsConfig = Field(default_factory=TlsConfig)


class PartyPolicy(Section):
    """What a follower accepts when the leader proposes a task (``sluice split party``)."""

    name: str = "follower"
    require_tls: bool = False
    max_params: int = Field(50_000_000, ge=1)
    max_steps: int = Field(10_000_000, ge=1)


class SplitConfig(Section):
    seed: int = 0
    topology: TopologyName = "6"
    followers: int = Field(1, ge=1, le=16)
    data: SplitDataConfig = Field(default_factory=SplitDataConfig)
    model: SplitModelConfig = Field(default_factory=SplitModelConfig)
    train: SplitTrainConfig = Field(default_factory=SplitTrainConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    transport: TransportConfig = Field(default_factory=TransportConfig)
    party: PartyPolicy = Field(default_factory=PartyPolicy)
    task: SplitTaskConfig = Field(default_factory=SplitTaskConfig)
    follower_tasks: dict[str, SplitTaskConfig] = Field(
        default_factory=dict, description="sluice split run: the task of each follower it starts, by name "
        "(follower-1...); default: [task]")

    def task_of(self, party: str) -> SplitTaskConfig:
        """The ``[task]`` section ``party`` trains (``"leader"`` or a follower's name)."""
        return self.task if party == "leader" else self.follower_tasks.get(party, self.task)

    def builtin_args(self) -> dict[str, Any]:
        """What a built-in split task takes from ``[data]`` and ``[model]``."""
        d, m = self.data, self.model
        return {"dataset": d.dataset, "n_samples": d.n_samples, "n_features": d.n_features,
                "n_informative": d.n_informative, "n_classes": d.n_classes, "leader_columns": d.leader_columns,
                "follower_columns": d.follower_columns, "scenario": dict(d.scenario),
                "bottom_hidden": list(m.bottom_hidden), "embedding": m.embedding, "top_hidden": list(m.top_hidden),
                "middle_hidden": list(m.middle_hidden), "activation": m.activation, "batch_norm": m.batch_norm,
                "dtype": m.dtype}

    @field_validator("topology", mode="before")
    @classmethod
    def _topology_name(cls, v: object) -> object:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _check(self) -> SplitConfig:
        most = TOPOLOGIES[self.topology].max_followers
        if self.followers > most:
            raise ValueError(f"topology {self.topology} has at most {most} follower(s); set followers <= {most}"
                             + (" (U-shape: the follower holds model B)" if TOPOLOGIES[self.topology].u_shape else ""))
        unknown = sorted(set(self.follower_tasks) - {f"follower-{i + 1}" for i in range(self.followers)})
        if unknown:
            raise ValueError(f"follower_tasks names {unknown}; the followers are follower-1..follower-{self.followers}")
        if (
            self.model.batch_norm
            and not self.model.allow_batch_coupled
            and self.pipeline.groups != 1
        ):
            raise ValueError(
                "model.batch_norm couples the samples of a batch, so groups would not reproduce the "
                "full-batch update; use pipeline.groups = 1 or set model.allow_batch_coupled = true to "
                "accept approximate updates"
            )
        return self
