"""Fixtures shared by several test modules, and how the suite is spread over pytest-xdist workers.

The README's ``.venv/bin/pytest`` runs the tests in parallel (``addopts`` in pyproject.toml: ``-n``, ``--dist
loadgroup``, see :func:`pytest_xdist_make_scheduler`). The tests of a file that defines a module-scoped fixture
(a service, a Flower deployment) are kept on one worker, so that fixture starts once; every other test goes
wherever a worker is free. Each worker has its own session fixtures (its own ``sluice serve`` and PostgreSQL
server, on free ports), its own ``tmp_path`` tree and its own process (``os.environ`` changes stay in it). The
longest end-to-end tests are handed out first, and no more than two Flower deployments run at once.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
from pathlib import Path

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


def pytest_configure(config):
    """One intra-op thread for torch in the test processes, as every engine sets for itself: two workers on two
    cores, each with a thread team per core, would spin on each other's cores (and what a test computes before
    an engine ran would depend on the order the tests run in). The heavy modules a test would otherwise import
    first (torch's first optimizer imports torch._dynamo and sympy; scikit-learn; Flower) are imported here,
    when a worker starts: a timeout that struck inside such an import would leave the worker with a module
    half imported, and every later test on it failing."""
    if getattr(config.option, "numprocesses", None):
        return  # the xdist controller runs no test (its workers come here with numprocesses unset)
    import importlib
    import warnings

    import torch

    torch.set_num_threads(1)
    for name in ("torch._dynamo", "sympy", "sklearn.model_selection", "scipy.stats", "flwr.serverapp",
                 "flwr.clientapp"):
        try:
            with warnings.catch_warnings():  # Flower's generated protobuf modules warn of their gencode version,
                warnings.simplefilter("ignore", UserWarning)  # and its CLI's typer of click's deprecations
                warnings.simplefilter("ignore", DeprecationWarning)
                importlib.import_module(name)
        except ImportError:  # an optional extra that is not installed: its tests skip themselves
            pass


_SHARED_SCOPE = re.compile(r"""scope\s*=\s*["'](module|class|package)["']""")


@functools.cache
def _shares_a_fixture(path: Path) -> bool:
    """Whether the test file ``path`` defines a fixture wider than a test (module, class or package scope)."""
    try:
        return _SHARED_SCOPE.search(path.read_text(encoding="utf-8")) is not None
    except OSError:
        return False


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` for this suite: a file that defines a module-scoped fixture (a service, a Flower
    deployment) is one unit of work, on one worker, so the fixture starts once and its tests run in their order;
    every other test is a unit of its own, handed to whichever worker is free. Units go out in collection order
    (``--no-loadscope-reorder``), which :func:`pytest_collection_modifyitems` makes longest-first. (xdist's own
    loadgroup, for ``xdist_group`` marks, does nothing under pytest 9: it renames node ids, which pytest 9 no
    longer lets it do, pytest-xdist #1386.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureFiles(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if _shares_a_fixture(config.rootpath / path) else nodeid

    return SharedFixtureFiles(config, log)


def _kind(item) -> int:
    """0 for a Flower run (the longest), 1 for the other end-to-end tests and the files sharing a fixture, 2 for
    the rest."""
    if item.get_closest_marker("flower"):
        return 0
    if any(item.get_closest_marker(m) for m in ("slow", "fuzz", "postgres", "netns")) or _shares_a_fixture(
            item.path):
        return 1
    return 2


def _unit(item) -> str:
    """The unit of work the scheduler hands out that ``item`` belongs to (see :func:`pytest_xdist_make_scheduler`)."""
    return str(item.path) if _shares_a_fixture(item.path) else item.nodeid


def pytest_collection_modifyitems(items):
    """Mark ``postgres`` every test that asks for the PostgreSQL server itself; hand out the long units first,
    two Flower units, then two other long ones, and so on: no more than :data:`FLOWER_SLOTS` Flower deployments
    run at once (:func:`pytest_runtest_protocol`), and the workers that wait for none of them have long work
    meanwhile. The many short tests fill the workers at the end."""
    for item in items:
        if {"postgres", "new_pg_database"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(_unit(item), []).append(item)
    kinds: dict[int, list[list]] = {0: [], 1: [], 2: []}
    for unit in units.values():
        kinds[min(_kind(i) for i in unit)].append(unit)
    order: list[list] = []
    flower, long = kinds[0], kinds[1]
    while flower or long:
        order += flower[:FLOWER_SLOTS] + long[:FLOWER_SLOTS]
        del flower[:FLOWER_SLOTS], long[:FLOWER_SLOTS]
    items[:] = [item for unit in [*order, *kinds[2]] for item in unit]


FLOWER_SLOTS = 2


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A Flower test runs once it holds one of :data:`FLOWER_SLOTS` slots shared by the workers (a lock file
    each), taken before its timeout starts: each deployment starts a process per node and message, and more of
    them at once on two cores only slow each other past their round timeouts."""
    if "PYTEST_XDIST_WORKER" not in os.environ or not item.get_closest_marker("flower"):
        yield
        return
    slots = item.config._tmp_path_factory.getbasetemp().parent  # the run's directory, shared by its workers
    files = [open(slots / f"flower-{i}.lock", "w") for i in range(FLOWER_SLOTS)]  # noqa: SIM115
    try:
        held = next((f for f in files if _try_lock(f)), None)
        if held is None:  # all taken: wait for this worker's own slot
            held = files[int(os.environ["PYTEST_XDIST_WORKER"][2:]) % FLOWER_SLOTS]
            fcntl.flock(held, fcntl.LOCK_EX)
        yield
    finally:
        for f in files:
            f.close()  # closing releases the lock


def _try_lock(f) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
