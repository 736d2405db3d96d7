"""The topologies of split training (SPEC P6) as one table: who holds which part, each party's operations
for one group of one step (SPEC P3), and the tensor tags the parties exchange.

=========  =========================  ==============  ==================================================
topology   leader parts               follower part   flow of one group
=========  =========================  ==============  ==================================================
4A         top                        bottom          follower bottom --emb--> leader top + loss
                                                      --grad--> follower bottom
5          bottom (A1), top (A2)      middle (B)      A1 --act1--> B --act2--> A2 + loss --grad2--> B
           (features and labels)      (no features)   --grad1--> A1 (U-shape)
6          bottom (C1), top (C2)      bottom (D)      C1 and every follower's D --emb--> C2 + loss
                                                      --grad--> D (and to C1 locally)
=========  =========================  ==============  ==================================================

Operations (``first`` = send-producing, with subtype ``SENDS``: its result is sent, or ``FEEDS``: its
result feeds a sending operation; ``second`` = local-only):

=========  ==========  ==============================================  ===========================
topology   party       first type                                      second type
=========  ==========  ==============================================  ===========================
4A         leader      head: top fwd+bwd (SENDS grad)                  -
4A, 6      follower    bottom.fwd (SENDS emb)                          bottom.bwd
6          leader      head (SENDS grad), bottom.fwd (FEEDS)           bottom.bwd
5          leader      bottom.fwd (SENDS act1), head (SENDS grad2)     bottom.bwd
5          follower    middle.fwd (SENDS act2), middle.bwd (SENDS     -
                       grad1)
=========  ==========  ==============================================  ===========================

In topology 6 this is the seed's FIG. 8: model C2 (head) runs as soon as a follower's group has arrived,
then forward of C1, and backward of C1 only when neither can run. The follower of 4A and 6 is FIG. 9.

Store keys of an operation graph: ``("in", step, tag, peer, group)`` for a tensor received from ``peer``,
``("loc", step, name, group)`` for a tensor one operation of this party hands to another. Evaluation
sends the forward tensors of the test set under ``eval_<tag>`` (group 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .schedule import Op, OpType, Subtype

TopologyName = Literal["4A", "5", "6"]
Role = Literal["leader", "follower"]

FIRST, SECOND = OpType.FIRST, OpType.SECOND
SENDS, FEEDS = Subtype.SENDS, Subtype.FEEDS


@dataclass(frozen=True)
class In:
    """An input received from every peer of the party: the tensor ``tag`` of this step and group."""

    tag: str


@dataclass(frozen=True)
class Local:
    """An input handed over by another operation of the same party under ``name``."""

    name: str


@dataclass(frozen=True)
class OpSpec:
    """One operation of a party, repeated for every group: what it needs, what it sends to its peers
    (``sends``: a tensor tag) and what it hands to another of its own operations (``hands``)."""

    name: str
    type: OpType
    subtype: Subtype | None
    needs: tuple[In | Local, ...] = ()
    sends: str | None = None
    hands: str | None = None


@dataclass(frozen=True)
class Topology:
    """One row of the table (see the module docstring)."""

    name: TopologyName
    description: str
    leader_bottom: bool  #: the leader holds feature columns and a bottom model
    follower_part: Literal["bottom", "middle"]  #: bottom: the follower holds features; middle: it does not
    max_followers: int
    leader_ops: tuple[OpSpec, ...]
    follower_ops: tuple[OpSpec, ...]

    @property
    def u_shape(self) -> bool:
        """The leader's bottom output goes through the follower's middle part before the leader's top."""
        return self.follower_part == "middle"

    @property
    def follower_features(self) -> bool:
        return self.follower_part == "bottom"

    def part(self, party: str) -> str:
        """Name of the part of the model ``party`` (``"leader"`` or a follower's name) trains below the top."""
        return f"{party}.bottom" if party == "leader" else f"{party}.{self.follower_part}"

    def top_inputs(self, followers: int) -> int:
        """How many embeddings are concatenated at the input of the leader's top model."""
        if self.u_shape:
            return 1
        return followers + int(self.leader_bottom)

    def specs(self, role: Role) -> dict[str, OpSpec]:
        """The operations of ``role`` by name."""
        return {o.name: o for o in (self.leader_ops if role == "leader" else self.follower_ops)}

    @property
    def tags(self) -> frozenset[str]:
        """Every tensor tag sent in a training step."""
        return frozenset(o.sends for o in self.leader_ops + self.follower_ops if o.sends is not None)

    def ops(self, role: Role, step: int, groups: int, peers: list[str]) -> list[Op]:
        """The operation graph of ``role`` for one step of ``groups`` groups (``peers``: the followers of
        the leader, or the follower's leader)."""
        out: list[Op] = []
        specs = self.leader_ops if role == "leader" else self.follower_ops
        for g in range(groups):
            for order, s in enumerate(specs):
                needs = tuple(
                    key
                    for n in s.needs
                    for key in (
                        [("loc", step, n.name, g)] if isinstance(n, Local)
                        else [("in", step, n.tag, p, g) for p in peers]
                    )
                )
                out.append(Op(s.name, g, s.type, s.subtype, needs, order))
        return out


def eval_tag(tag: str) -> str:
    """The tag under which the test-set counterpart of a training tensor ``tag`` is sent."""
    return f"eval_{tag}"


_BOTTOM_FOLLOWER = (
    OpSpec("bottom.fwd", FIRST, SENDS, (), sends="emb"),
    OpSpec("bottom.bwd", SECOND, None, (In("grad"),)),
)

TOPOLOGIES: dict[str, Topology] = {
    t.name: t
    for t in (
        Topology(
            "4A", "A's bottom model -> B's top model and loss -> gradient back to A", False, "bottom", 16,
            leader_ops=(OpSpec("head", FIRST, SENDS, (In("emb"),), sends="grad"),),
            follower_ops=_BOTTOM_FOLLOWER,
        ),
        Topology(
            "5", "U-shape: A1 at A -> B -> A2 at A (labels at A), gradients back through B to A1", True,
            "middle", 1,
            leader_ops=(
                OpSpec("bottom.fwd", FIRST, SENDS, (), sends="act1"),
                OpSpec("head", FIRST, SENDS, (In("act2"),), sends="grad2"),
                OpSpec("bottom.bwd", SECOND, None, (In("grad1"),)),
            ),
            follower_ops=(
                OpSpec("middle.fwd", FIRST, SENDS, (In("act1"),), sends="act2"),
                OpSpec("middle.bwd", FIRST, SENDS, (In("grad2"),), sends="grad1"),
            ),
        ),
        Topology(
            "6", "leader bottom C1 and follower bottoms D feed the leader's top C2", True, "bottom", 16,
            leader_ops=(
                OpSpec("bottom.fwd", FIRST, FEEDS, (), hands="h"),
                OpSpec("head", FIRST, SENDS, (Local("h"), In("emb")), sends="grad", hands="gh"),
                OpSpec("bottom.bwd", SECOND, None, (Local("gh"),)),
            ),
            follower_ops=_BOTTOM_FOLLOWER,
        ),
    )
}


def topology(name: str) -> Topology:
    """The row of ``name``; :class:`ValueError` for an unknown one."""
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown topology {name!r}; known: {', '.join(TOPOLOGIES)}") from None
