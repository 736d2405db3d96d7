"""The service's store without a web server, on a real SQLite file and on a real PostgreSQL database
(``db_url``): Alembic migrations up and down, the outbox written in the same transaction as its change (a
rolled-back change leaves no notification), notification ids that are never reused, delivery to a loopback
receiver in id order, writers serialised across processes on PostgreSQL, subscription matching, and the CLI
entry points staying light."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa

from sluice.service.db import MOI, Notification, alembic_config, make_engine, migrate
from sluice.service.nrm import MnSError, dn_to_ldn, error_body, ldn_to_dn, parse_ldn
from sluice.service.outbox import Outbox
from sluice.service.store import Store, subscription_matches
from test_service_support import Receiver


def _open(url: str) -> Store:
    eng = make_engine(url)
    migrate(eng)
    return Store(eng, "SubNetwork=SN1", lambda ldn: f"http://x/ProvMnS/v1/{ldn}")


@pytest.fixture
def store(db_url):
    st = _open(db_url)
    yield st
    st.engine.dispose()


def _subscribe(store: Store, sid: str, recipient: str = "http://127.0.0.1:9/n", **attrs) -> None:
    with store.write() as tx:
        tx.create(f"SubNetwork=SN1/NtfSubscriptionControl={sid}", "NtfSubscriptionControl",
                  {"notificationRecipientAddress": recipient, **attrs})


def test_migrations_upgrade_and_downgrade(db_url):
    from alembic import command

    url = db_url
    eng = make_engine(url)
    migrate(eng)
    assert {"moi", "notification", "artifact", "upload"} <= set(sa.inspect(eng).get_table_names())
    migrate(eng)  # idempotent
    command.downgrade(alembic_config(url), "base")
    assert set(sa.inspect(eng).get_table_names()) <= {"alembic_version"}
    eng.dispose()


def test_a_change_and_its_notification_commit_together(store):
    _subscribe(store, "S")
    with store.write() as tx:
        tx.create("SubNetwork=SN1/MLTrainingFunction=TF1", "MLTrainingFunction", {})
    with pytest.raises(RuntimeError), store.write() as tx:
        tx.create("SubNetwork=SN1/MLTrainingFunction=TF2", "MLTrainingFunction", {})
        raise RuntimeError("rolled back")
    with store.read() as s:
        rows = list(s.scalars(sa.select(Notification)))
        assert [r.payload["href"].rpartition("/")[2] for r in rows] == ["MLTrainingFunction=TF1"]
        assert s.get(MOI, "SubNetwork=SN1/MLTrainingFunction=TF2") is None
    with store.write() as tx:
        row = tx.get("SubNetwork=SN1/MLTrainingFunction=TF1")
        changed = tx.update(row, attributes={"userLabel": "x"})
        assert changed == {"userLabel": "x"}
        tx.s.execute(sa.delete(Notification))  # delivered and purged: ids must still never repeat
    with store.write() as tx:
        tx.update(tx.get("SubNetwork=SN1/MLTrainingFunction=TF1"), attributes={"userLabel": "y"})
    with store.read() as s:
        (last,) = list(s.scalars(sa.select(Notification)))
        assert last.id == 3
        assert last.payload["attributeListValueChanges"] == [{"userLabel": "y"}, {"userLabel": "x"}]


def test_the_outbox_delivers_each_subscriber_in_id_order(store):
    """Concurrent writers, one live and one dead subscriber: the live one receives every notification of
    its subscription exactly once, in increasing id order, and is not held up by the dead one, which is
    dropped after ``max_attempts``."""
    rec = Receiver()
    outbox = Outbox(store, timeout_s=2.0, max_attempts=2, backoff_s=0.05).start()
    try:
        _subscribe(store, "A", rec.url)
        _subscribe(store, "B", "http://127.0.0.1:9/gone", notificationTypes=["notifyMOICreation"])

        def writer(w: int) -> None:
            for i in range(5):
                ldn = f"SubNetwork=SN1/MLTrainingFunction=W{w}x{i}"
                with store.write() as tx:
                    tx.create(ldn, "MLTrainingFunction", {"userLabel": "a"})
                with store.write() as tx:
                    tx.update(tx.get(ldn), attributes={"userLabel": "b"})

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        with store.read() as s:
            want = list(s.scalars(sa.select(Notification.id).where(Notification.subscription_dn.endswith("=A"))
                                  .order_by(Notification.id)))
        assert len(want) == 40
        deadline = time.monotonic() + 30
        while len(rec.got) < len(want) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [n["notificationId"] for n in rec.got] == want
        assert {n["subscriptionId"] for n in rec.got} == {"SubNetwork=SN1,NtfSubscriptionControl=A"}
        while outbox.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        with store.read() as s:
            dead = list(s.scalars(sa.select(Notification).where(Notification.subscription_dn.endswith("=B"))))
            assert len(dead) == 20 and all(r.dropped and r.attempts == 2 for r in dead)
            assert all(r.delivered_at is None for r in dead)
    finally:
        outbox.stop()
        rec.close()


def test_writers_of_two_processes_take_turns_on_postgresql(new_pg_database):
    """Two stores with their own connection pools on one PostgreSQL database (two service processes): a
    write waits for the other's transaction to end, so ``seq`` values stay distinct and notification ids
    increase in commit order."""
    url = new_pg_database()
    a, b = _open(url), _open(url)
    try:
        _subscribe(a, "S")
        done = threading.Event()

        def second() -> None:
            with b.write() as tx:
                tx.create("SubNetwork=SN1/MLTrainingFunction=B", "MLTrainingFunction", {})
            done.set()

        t = threading.Thread(target=second)
        with a.write() as tx:
            tx.create("SubNetwork=SN1/MLTrainingFunction=A", "MLTrainingFunction", {})
            tx.s.flush()
            t.start()
            assert not done.wait(0.5), "the second writer did not wait for the first transaction"
        assert done.wait(10)
        t.join(10)
        with a.read() as s:
            rows = {r.dn.rpartition("=")[2]: r for r in s.scalars(sa.select(MOI).where(
                MOI.object_class == "MLTrainingFunction"))}
            ids = {n.payload["href"].rpartition("=")[2]: n.id for n in s.scalars(sa.select(Notification))}
        assert rows["A"].seq < rows["B"].seq
        assert ids["A"] < ids["B"]
    finally:
        a.engine.dispose()
        b.engine.dispose()


def test_both_backends_keep_and_refuse_the_same_values(store):
    """Values come back equal on both backends (JSON vs JSONB: key order, floats, large ints, nesting, non-ASCII
    text); what PostgreSQL cannot hold is refused with a 400 on both, and the transaction leaves nothing."""
    attrs = {"zeta": 1, "a": [1.5, 1e-9, 2**53 + 1, True, None, {"k": "é✓😀"}], "b": {"y": {}, "x": []}}
    with store.write() as tx:
        tx.create("SubNetwork=SN1/MLTrainingFunction=V", "MLTrainingFunction", attrs, vs_data={"c": {"n": -0.25}})
    row = store.get("SubNetwork=SN1/MLTrainingFunction=V")
    assert row.attributes == attrs and row.vs_data == {"c": {"n": -0.25}}
    bad = [("SubNetwork=SN1/MLTrainingFunction=" + "x" * 1000, {}, None),
           ("SubNetwork=SN1/MLTrainingFunction=N", {"userLabel": "a\x00b"}, None),
           ("SubNetwork=SN1/MLTrainingFunction=N", {"userLabel": "a\ud800"}, None),
           ("SubNetwork=SN1/MLTrainingFunction=N", {}, {"c": {"deep": ["\x00"]}}),
           ("SubNetwork=SN1/NtfSubscriptionControl=N", {"notificationRecipientAddress": "http://x/" + "a" * 2000},
            None)]
    for ldn, attributes, vs_data in bad:
        with pytest.raises(MnSError) as err, store.write() as tx:
            tx.create(ldn, ldn.rpartition("/")[2].partition("=")[0], attributes, vs_data)
        assert err.value.status == 400
    with store.write() as tx, pytest.raises(MnSError):
        tx.update(tx.get("SubNetwork=SN1/MLTrainingFunction=V"), attributes={"userLabel": "\x00"})
    with store.read() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(MOI)) == 1


def test_subscription_scope_types_and_filter(store):
    _subscribe(store, "A", scope={"scopeType": "BASE_NTH_LEVEL", "scopeLevel": 2},
               notificationTypes=["notifyMOICreation"])
    _subscribe(store, "B",
               notificationFilter="MLTrainingProcess | /SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=R1")
    with store.read() as s:
        a = s.get(MOI, "SubNetwork=SN1/NtfSubscriptionControl=A")
        b = s.get(MOI, "SubNetwork=SN1/NtfSubscriptionControl=B")
    tf = "SubNetwork=SN1/MLTrainingFunction=TF1"
    assert subscription_matches(a, f"{tf}/MLTrainingRequest=R1", "notifyMOICreation")
    assert not subscription_matches(a, tf, "notifyMOICreation")
    assert not subscription_matches(a, f"{tf}/MLTrainingRequest=R1", "notifyMOIDeletion")
    assert subscription_matches(b, f"{tf}/MLTrainingProcess=P9", "notifyMOIDeletion")
    assert subscription_matches(b, f"{tf}/MLTrainingRequest=R1", "notifyMOICreation")
    assert not subscription_matches(b, f"{tf}/MLTrainingRequest=R2", "notifyMOICreation")


def test_names_and_error_bodies():
    assert ldn_to_dn("SubNetwork=SN1/MLTrainingFunction=TF1") == "SubNetwork=SN1,MLTrainingFunction=TF1"
    assert dn_to_ldn("SubNetwork=SN1, MLTrainingFunction=TF1") == "SubNetwork=SN1/MLTrainingFunction=TF1"
    for bad in ("", "SubNetwork=", "SubNetwork=SN1\n", "=x", "Sub Network=1", "SubNetwork=SN1/"):
        with pytest.raises(MnSError) as err:
            parse_ldn(bad)
        assert err.value.status == 400
    e = MnSError(400, "bad", bad_attributes=["id"], bad_query_params=["q"])
    assert error_body(e, "GET") == {"status": "400", "type": "VALIDATION_ERROR", "title": "Bad Request",
                                    "reason": "bad", "badQueryParams": ["q"]}
    assert error_body(e, "PUT")["badAttributes"] == ["id"] and "badQueryParams" not in error_body(e, "PUT")


@pytest.mark.parametrize("argv", [["serve", "--help"], ["consumer", "--help"], ["consumer", "create", "--help"]])
def test_service_commands_answer_help_without_heavy_imports(argv):
    code = ("import contextlib, io, json, sys\nfrom sluice.cli import main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n    try:\n        main(sys.argv[1:])\n"
            "    except SystemExit:\n        pass\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    mods = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert not mods & {"torch", "sklearn", "fastapi", "sqlalchemy", "uvicorn", "httpx", "grpc"}
