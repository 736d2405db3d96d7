"""Private set intersection (sluice.psi): exact results, what each side sees, byte counts, malformed messages.

Client and server run in two threads joined by queues; every message a side receives is recorded, so the
tests can check that no id outside the intersection crosses in plain text.
"""

from __future__ import annotations

import ast
import queue
import random
import string
import threading
from pathlib import Path

import pytest

from sluice.errors import ConfigError, DataError, WireError
from sluice.psi import PsiStats, intersect, serve

WAIT_S = 60.0
"""How long a side waits for its peer's next message before the test fails (never reached when it passes)."""


class QueueChannel:
    """One end of an in-process channel; records every message it sends and receives."""

    def __init__(self, out: queue.Queue[bytes], inbox: queue.Queue[bytes]) -> None:
        self.out, self.inbox = out, inbox
        self.sent: list[bytes] = []
        self.received: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)
        self.out.put(data)

    def recv(self) -> bytes:
        try:
            data = self.inbox.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no message from the peer within {WAIT_S:g} s") from None
        self.received.append(data)
        return data


def channel_pair() -> tuple[QueueChannel, QueueChannel]:
    a_to_b: queue.Queue[bytes] = queue.Queue()
    b_to_a: queue.Queue[bytes] = queue.Queue()
    return QueueChannel(a_to_b, b_to_a), QueueChannel(b_to_a, a_to_b)


def run_psi(client_ids: list[str], server_ids: list[str], fpr: float = 1e-9):
    """intersect() in this thread against serve() in another: (indices, client stats, server stats, client
    channel, server channel)."""
    client_ch, server_ch = channel_pair()
    result: dict[str, object] = {}

    def server() -> None:
        try:
            result["stats"] = serve(server_ids, server_ch, fpr=fpr)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            result["error"] = exc

    t = threading.Thread(target=server, daemon=True)
    t.start()
    found, cstats = intersect(client_ids, client_ch, fpr=fpr)
    t.join(WAIT_S)
    assert not t.is_alive(), "the server did not finish"
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    sstats = result["stats"]
    assert isinstance(sstats, PsiStats)
    return found, cstats, sstats, client_ch, server_ch


def random_ids(rng: random.Random, n: int) -> list[str]:
    alphabet = string.ascii_letters + string.digits
    return ["".join(rng.choices(alphabet, k=16)) for _ in range(n)]


def expected(client_ids: list[str], server_ids: list[str]) -> list[int]:
    theirs = set(server_ids)
    return [i for i, x in enumerate(client_ids) if x in theirs]


def plain_ids_in(messages: list[bytes], ids: list[str]) -> list[str]:
    """The ids that appear in any message in plain text, whole or their first or last 8 characters."""
    found = []
    for x in ids:
        parts = {x.encode(), x[:8].encode(), x[-8:].encode()}
        if any(p in m for p in parts for m in messages):
            found.append(x)
    return found


def test_small_sets_exact() -> None:
    client = ["alice", "bob", "carol", "dave", "erin"]
    server = ["zoe", "erin", "bob", "yann", "mallory", "alice"]
    found, cstats, sstats, _, _ = run_psi(client, server)
    assert found == [0, 1, 4]
    assert (cstats.own, cstats.common) == (5, 3)
    assert (sstats.own, sstats.common) == (6, None)
    assert cstats.seconds > 0 and sstats.seconds > 0


@pytest.mark.parametrize("seed, n_client, n_server, n_common", [
    (1, 300, 300, 150), (2, 50, 700, 20), (3, 700, 40, 40), (4, 200, 200, 0), (5, 120, 120, 120),
])
def test_random_sets_exact(seed: int, n_client: int, n_server: int, n_common: int) -> None:
    rng = random.Random(seed)
    pool = random_ids(rng, n_client + n_server - n_common)
    client = pool[:n_client]
    server = pool[n_client - n_common:]
    rng.shuffle(client)
    rng.shuffle(server)
    found, cstats, _, _, _ = run_psi(client, server)
    assert found == expected(client, server)
    assert len(found) == n_common == cstats.common


def test_duplicate_ids_are_answered_at_each_index() -> None:
    found, *_ = run_psi(["a", "b", "a", "c"], ["a", "a", "c"])
    assert found == [0, 2, 3]


def test_nothing_outside_the_intersection_crosses_in_plain_text() -> None:
    rng = random.Random(7)
    pool = random_ids(rng, 500)
    client, server = pool[:300], pool[200:]
    common = set(client) & set(server)
    outside = [x for x in pool if x not in common]
    found, _, _, client_ch, server_ch = run_psi(client, server)
    assert [client[i] for i in found] == [x for x in client if x in common]
    assert len(server_ch.received) == 1 and len(client_ch.received) == 2  # one round trip
    assert plain_ids_in(client_ch.received, outside) == []
    assert plain_ids_in(server_ch.received, client) == []  # the server sees none of the client's ids at all
    assert plain_ids_in(client_ch.received + server_ch.received, pool) == []


def test_the_plain_text_check_finds_a_leak() -> None:
    ids = ["Zq81mPx0aa7LkT2w", "Bn4oQe9sVc3yR1ud"]
    assert plain_ids_in([b"\x00\x12" + b"Zq81mPx0" + b"\xff"], ids) == ["Zq81mPx0aa7LkT2w"]
    assert plain_ids_in([b"prefix Bn4oQe9sVc3yR1ud"], ids) == ["Bn4oQe9sVc3yR1ud"]
    assert plain_ids_in([b"nothing here"], ids) == []


def test_the_server_learns_only_the_size_of_the_clients_set() -> None:
    """Two different client sets of one size give requests of one length: the request's only visible
    feature; its content is points blinded with a key the server never sees."""
    rng = random.Random(11)
    server = random_ids(rng, 100)
    lengths = set()
    for client in (random_ids(rng, 80), server[:80], server[:40] + random_ids(rng, 40)):
        _, _, _, _, server_ch = run_psi(client, server)
        lengths.add(len(server_ch.received[0]))
    assert len(lengths) == 1


def test_byte_counts_are_the_recorded_messages() -> None:
    rng = random.Random(3)
    pool = random_ids(rng, 400)
    _, cstats, sstats, client_ch, server_ch = run_psi(pool[:250], pool[150:])
    assert cstats.sent_bytes == sum(map(len, client_ch.sent)) == sum(map(len, server_ch.received))
    assert cstats.received_bytes == sum(map(len, client_ch.received)) == sum(map(len, server_ch.sent))
    assert sstats.sent_bytes == cstats.received_bytes and sstats.received_bytes == cstats.sent_bytes
    assert cstats.sent_bytes > 250 * 33  # one compressed P-256 point an id at least


@pytest.mark.parametrize("client, server", [([], ["a", "b"]), (["a", "b"], []), ([], [])])
def test_empty_sets(client: list[str], server: list[str]) -> None:
    found, cstats, sstats, client_ch, server_ch = run_psi(client, server)
    assert found == [] and cstats.common == 0
    assert (cstats.own, sstats.own) == (len(client), len(server))
    assert cstats.sent_bytes == sum(map(len, client_ch.sent))
    assert sstats.sent_bytes == sum(map(len, server_ch.sent))


def test_ids_must_be_str() -> None:
    sink = QueueChannel(queue.Queue(), queue.Queue())
    with pytest.raises(DataError, match=r"ids\[1\] is a int"):
        intersect(["a", 2], sink)  # type: ignore[list-item]
    with pytest.raises(DataError, match="not one string"):
        serve("abc", sink)
    with pytest.raises(ConfigError, match="fpr"):
        intersect(["a"], sink, fpr=0.0)
    assert sink.sent == []  # nothing was sent


def answers_from_a_real_server(client_ids: list[str], server_ids: list[str]) -> list[bytes]:
    """A real server's setup message and response to a request for ``client_ids``."""
    *_, client_ch, _ = run_psi(client_ids, server_ids)
    return list(client_ch.received)


def client_against(replies: list[bytes], ids: list[str]) -> None:
    """intersect() with ``replies`` waiting in its inbox as the server's messages."""
    inbox: queue.Queue[bytes] = queue.Queue()
    for r in replies:
        inbox.put(r)
    intersect(ids, QueueChannel(queue.Queue(), inbox))


def test_a_malformed_request_is_a_wire_error() -> None:
    for bad, match in ((b"\xff" * 40, "request is malformed"), (b"", "size only")):
        inbox: queue.Queue[bytes] = queue.Queue()
        inbox.put(bad)
        ch = QueueChannel(queue.Queue(), inbox)
        with pytest.raises(WireError, match=match):
            serve(["a", "b"], ch)
        assert ch.sent == []


def test_malformed_answers_are_wire_errors() -> None:
    ids = ["a", "b", "c", "d"]
    setup, response = answers_from_a_real_server(ids, ["b", "d", "e"])
    client_against([setup, response], ids)  # the untouched answers are accepted
    with pytest.raises(WireError, match="setup message is malformed"):
        client_against([b"\xff" * len(setup), response], ids)
    with pytest.raises(WireError, match="response is malformed"):
        client_against([setup, response[:-5]], ids)
    with pytest.raises(WireError, match="answers 3 ids, but the request asked about 4"):
        client_against([setup, response[: len(response) * 3 // 4]], ids)
    with pytest.raises(WireError, match="setup message is malformed"):
        client_against([response, setup], ids)  # in the wrong order


def test_psi_imports_nothing_of_sluice_but_errors() -> None:
    src = Path(__file__).resolve().parents[1] / "src" / "sluice" / "psi"
    imported = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
    assert {m for m in imported if m.split(".")[0] == "sluice"} == {"sluice.errors"}
