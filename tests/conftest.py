"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def digits():
    """The digits dataset, split with seed 0."""
    from sluice.data import load_dataset

    return load_dataset("digits", seed=0)


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    """One ``sluice serve`` (real loopback port, real SQLite file) shared by the service and consumer tests;
    see tests/test_service_support.py. Its whole process group is ended afterwards."""
    from test_service_support import running_server

    tmp = tmp_path_factory.mktemp("service")
    extra = ("--set", "policy.default_iterations=4", "--set", "policy.plateau_patience=50")
    with running_server(tmp, extra=extra) as s:
        yield s


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL server for the whole session (``sluice.service.pgserver.running_postgres``),
    stopped and removed at the end. ``postgres.new_database(name)`` gives the URL of a new empty database;
    ``new_pg_database()`` below picks a unique name. Tests using it are marked ``postgres``
    (``-m "not postgres"`` deselects them where no PostgreSQL is installed)."""
    from sluice.service.pgserver import running_postgres

    with running_postgres() as pg:
        yield pg


@pytest.fixture
def new_pg_database(postgres):
    """A factory of new empty databases on the session's PostgreSQL server: ``new_pg_database()`` → URL."""
    import uuid

    return lambda: postgres.new_database(f"t_{uuid.uuid4().hex[:16]}")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    """The SQLAlchemy URL of a new empty store, once per backend: a SQLite file in ``tmp_path``, then a new
    database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("new_pg_database")()


def pytest_collection_modifyitems(items):
    """Mark ``postgres`` every test that asks for the PostgreSQL server itself."""
    for item in items:
        if {"postgres", "new_pg_database"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)
