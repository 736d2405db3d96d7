"""The service's store without a web server: Alembic migrations up and down on a real SQLite file, the
outbox written in the same transaction as its change (a rolled-back change leaves no notification),
notification ids that are never reused, subscription matching, and the CLI entry points staying light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sqlalchemy as sa

from sluice.service.db import MOI, Notification, alembic_config, make_engine, migrate
from sluice.service.nrm import MnSError, dn_to_ldn, error_body, ldn_to_dn, parse_ldn
from sluice.service.store import Store, subscription_matches


@pytest.fixture
def store(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(eng)
    yield Store(eng, "SubNetwork=SN1", lambda ldn: f"http://x/ProvMnS/v1/{ldn}")
    eng.dispose()


def _subscribe(store: Store, sid: str, **attrs) -> None:
    with store.write() as tx:
        tx.create(f"SubNetwork=SN1/NtfSubscriptionControl={sid}", "NtfSubscriptionControl",
                  {"notificationRecipientAddress": "http://127.0.0.1:9/n", **attrs})


def test_migrations_upgrade_and_downgrade(tmp_path):
    from alembic import command

    url = f"sqlite:///{tmp_path / 'm.db'}"
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
