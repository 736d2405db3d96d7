"""The HFL simulator gives the numbers recorded before the server/client split (commit da5e499).

``tests/data/hfl_golden_da5e499.json`` holds, for several configurations run 12 rounds, every round's
metrics and the kind, chain-part count and length of every uplink and downlink message (an anchor
broadcast has a 4th element: the number of clients that receive it), and the sha256 of the final server
parameters. Metrics must be equal as floats, bit for bit.

Message lengths differ from the recorded ones only by the wire frame of format version 2, which adds
one kind byte to every framed message. A dense, sparse or sketch message is therefore 1 byte longer. A
patch chain is a frame whose parts are framed sparse messages, each preceded by its length as a varint:
it is ``1 + Σ_parts (1 + g_p)`` bytes longer, where ``g_p = len(varint(L_p)) − len(varint(L_p − 1))`` is
the growth of part p's length varint when its length ``L_p`` gains that byte (1 only when ``L_p − 1`` is
127 or 16,383, else 0) — so ``1 + parts`` for the chains recorded here. The test computes this delta
from each decoded message.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from sluice.config import load_config
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.wire.frame import varint
from sluice.wire.vector import PatchChain, decode, encode, payload_kind

GOLDEN = json.loads((Path(__file__).parent / "data" / "hfl_golden_da5e499.json").read_text())
METRICS = ("train_loss", "test_loss", "test_accuracy", "test_precision", "test_recall", "test_f1",
           "participants", "dropped")


def frame_delta(msg: bytes) -> int:
    """Bytes format version 2 adds to ``msg`` over format version 1 (see the module docstring)."""
    payload = decode(msg)
    if not isinstance(payload, PatchChain):
        return 1
    delta = 1
    for part in payload.parts:
        n = len(encode(part))
        delta += 1 + len(varint(n)) - len(varint(n - 1))
    return delta


def describe(msg: bytes) -> tuple[str, int, int]:
    """(kind, chain parts, length before the version-2 frame) of a message."""
    payload = decode(msg)
    parts = len(payload.parts) if isinstance(payload, PatchChain) else 0
    return payload_kind(payload), parts, len(msg) - frame_delta(msg)


def run_recorded(overrides: list[str], rounds: int) -> tuple[list[Any], list[dict[str, list]], HFLEngine]:
    """Run the simulator, collecting every message by wrapping the halves' public methods."""
    cfg = load_config(None, [*overrides, f"train.rounds={rounds}"], HFLConfig)
    eng = HFLEngine(cfg)
    eng.start()
    seen: dict[str, list] = {}
    server = eng.server
    message, close_round = server.message, server.close_round

    def recorded_message(client_id: int) -> bytes:
        out = message(client_id)
        seen["down"].append(list(describe(out)))
        seen["down_delta"].append(frame_delta(out))
        return out

    def recorded_close() -> bytes | None:
        out = close_round()
        if out is not None:
            seen["down"].append([*describe(out), len(eng.clients)])
            seen["down_delta"].append(len(eng.clients) * frame_delta(out))
        return out

    server.message, server.close_round = recorded_message, recorded_close
    for client in eng.clients:
        def recorded_train(*args: Any, _train: Any = client.train) -> bytes:
            out = _train(*args)
            seen["up"].append(list(describe(out)))
            seen["up_delta"].append(frame_delta(out))
            return out

        client.train = recorded_train
    events, messages = [], []
    for _ in range(rounds):
        seen.update(up=[], down=[], up_delta=[], down_delta=[])
        events.append(eng.iterate())
        messages.append(dict(seen))
    return events, messages, eng


@pytest.mark.parametrize("case", sorted(GOLDEN["cases"]))
def test_numbers_match_the_recording(case: str) -> None:
    rec = GOLDEN["cases"][case]
    events, messages, eng = run_recorded(rec["overrides"], GOLDEN["rounds"])
    for ev, msgs, want in zip(events, messages, rec["rounds"], strict=True):
        where = f"{case}, round {want['round']}"
        assert ev.iteration == want["round"]
        for name in METRICS:
            assert ev.metrics.get(name) == want["metrics"].get(name), f"{where}: {name}"
        assert msgs["up"] == want["up_messages"], where
        assert msgs["down"] == want["down_messages"], where
        # the event counts every framed byte: the recording's plus each message's frame delta
        assert ev.bytes_up == want["bytes_up"] + sum(msgs["up_delta"]), where
        assert ev.bytes_down == want["bytes_down"] + sum(msgs["down_delta"]), where
    assert hashlib.sha256(eng.params.tobytes()).hexdigest() == rec["final_params_sha"]


def test_frame_delta_counts_kind_bytes_of_a_chain_and_its_parts() -> None:
    import numpy as np

    from sluice.wire.vector import SparsePayload

    part = SparsePayload(d=100, values=np.ones(3, np.float16), indices=np.array([1, 5, 9]))
    chain = encode(PatchChain((part, part)))
    assert frame_delta(encode(part)) == 1
    assert frame_delta(chain) == 3
    assert describe(chain)[:2] == ("chain", 2)
