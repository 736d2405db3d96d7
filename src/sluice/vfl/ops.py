"""Operation graphs of one step for each party of each topology (SPEC P3, P6).

Store keys: ``("in", step, tag, peer, group)`` for a received tensor, ``("loc", step, name, group)`` for
a tensor one operation of this party hands to another.

=========  ==========  =====================================  ===========================
topology   party       first type (subtype)                   second type
=========  ==========  =====================================  ===========================
4A         leader      head: top fwd+bwd (SENDS grad)         -
4A, 6      follower    bottom.fwd (SENDS emb)                 bottom.bwd
6          leader      head (SENDS grad), bottom.fwd (FEEDS)  bottom.bwd
5          leader      bottom.fwd (SENDS act1), head (SENDS)  bottom.bwd
5          follower    middle.fwd (SENDS), middle.bwd (SENDS) -
=========  ==========  =====================================  ===========================

In topology 6 this is the seed's FIG. 8: model C2 (head) runs as soon as a follower's group has arrived,
then forward of C1, and backward of C1 only when neither can run. The follower of 4A and 6 is FIG. 9.
"""

from __future__ import annotations

from .schedule import Op, OpType, Subtype

FIRST, SECOND = OpType.FIRST, OpType.SECOND
SENDS, FEEDS = Subtype.SENDS, Subtype.FEEDS


def leader_ops(topology: str, step: int, groups: int, followers: list[str]) -> list[Op]:
    out: list[Op] = []
    for g in range(groups):
        if topology == "6":
            out.append(Op("bottom.fwd", g, FIRST, FEEDS, (), 0))
            needs = (("loc", step, "h", g),) + tuple(("in", step, "emb", p, g) for p in followers)
            out.append(Op("head", g, FIRST, SENDS, needs, 1))
            out.append(Op("bottom.bwd", g, SECOND, None, (("loc", step, "gh", g),), 2))
        elif topology == "4A":
            needs = tuple(("in", step, "emb", p, g) for p in followers)
            out.append(Op("head", g, FIRST, SENDS, needs, 1))
        elif topology == "5":
            (p,) = followers
            out.append(Op("bottom.fwd", g, FIRST, SENDS, (), 0))
            out.append(Op("head", g, FIRST, SENDS, (("in", step, "act2", p, g),), 1))
            out.append(Op("bottom.bwd", g, SECOND, None, (("in", step, "grad1", p, g),), 2))
        else:
            raise ValueError(f"unknown topology {topology!r}")
    return out


def follower_ops(topology: str, step: int, groups: int, leader: str) -> list[Op]:
    out: list[Op] = []
    for g in range(groups):
        if topology in ("4A", "6"):
            out.append(Op("bottom.fwd", g, FIRST, SENDS, (), 0))
            out.append(Op("bottom.bwd", g, SECOND, None, (("in", step, "grad", leader, g),), 1))
        elif topology == "5":
            out.append(Op("middle.fwd", g, FIRST, SENDS, (("in", step, "act1", leader, g),), 0))
            out.append(Op("middle.bwd", g, FIRST, SENDS, (("in", step, "grad2", leader, g),), 1))
        else:
            raise ValueError(f"unknown topology {topology!r}")
    return out
