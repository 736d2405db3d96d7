"""The dashboard of ``sluice serve`` in a real browser (Playwright driving Debian's chromium, headless).

A real service on a loopback port with two consumers' tokens: a request created through the ProvMnS API
appears in the page, its curve gains points while it trains, the page's Suspend, Resume and Cancel (which
send the consumer's ProvMnS PATCH) stop, restart and end it, a finished process shows its cause, the other
consumer's page does not show it, and the page reconnects by itself after the service restarted.
Screenshots of a running and a finished process are written to ``docs/img/`` when
``SLUICE_DASHBOARD_SHOTS=1``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from sluice.service.auth import add_token
from test_service_support import TF, checked, request_body, running_server, start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 120_000  # a loaded machine: training steps and page updates get generous room
HFL = {"engine": "hfl", "seed": 0, "data": {"num_clients": 5},
       "train": {"participation": 1.0, "local_epochs": 1, "batch_size": 16}, "model": {"hidden": [16]}}
expect.set_options(timeout=WAIT_MS)
SHOTS = Path(__file__).resolve().parents[1] / "docs" / "img"

needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists() and not shutil.which("chromium"),
                                    reason="needs Debian's chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser() -> Any:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("dash")
    tokens = tmp / "tokens.toml"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    cfg = tmp / "service.toml"
    cfg.write_text(f'[auth]\ntokens_file = "{tokens}"\n', encoding="utf-8")
    srv = start_server(tmp, extra=(str(cfg),), token=alice)
    box = {"srv": srv, "tmp": tmp, "cfg": cfg, "alice": alice, "bob": bob}
    try:
        yield box
    finally:
        stop_server(box["srv"])


PAGE_ERRORS: list[str] = []


@pytest.fixture(autouse=True)
def _no_script_errors() -> Any:
    PAGE_ERRORS.clear()
    yield
    assert not PAGE_ERRORS, PAGE_ERRORS


def signed_in(browser: Any, root: str, token: str) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.on("pageerror", lambda e: PAGE_ERRORS.append(str(e)))
    page.set_default_timeout(WAIT_MS)
    page.goto(root + "/")
    page.fill("#token", token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    return page


def row(page: Page, pid: str) -> Any:
    return page.locator(f'#procs tbody tr[data-id="{pid}"]')


def points(page: Page) -> int:
    return int(page.locator("#c-metrics").get_attribute("data-points") or 0)


def iterations(page: Page, pid: str) -> int:
    return int(row(page, pid).get_attribute("data-iterations") or 0)


def wait_value(page: Page, js: str, arg: Any) -> None:
    page.wait_for_function(js, arg=arg, timeout=WAIT_MS)


def shot(page: Page, name: str) -> None:
    if os.environ.get("SLUICE_DASHBOARD_SHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / name), full_page=True)


@needs_chromium
def test_a_request_is_followed_and_controlled_from_the_page(browser: Any, svc: Any) -> None:
    srv = svc["srv"]
    page = signed_in(browser, srv.root, svc["alice"])
    checked(srv.http.put(srv.req("LIVE"), json=request_body("LIVE", HFL, termination={"iterations": 5000})), 201)
    pid = srv.process_of("LIVE")["id"]
    expect(row(page, pid)).to_be_visible()
    expect(row(page, pid).locator("td").nth(2)).to_have_text("LIVE")
    row(page, pid).get_by_role("button", name=pid).click()
    expect(page.locator("#detail")).to_have_attribute("data-id", pid)
    # the curve gains points while it trains, without the page asking
    wait_value(page, "() => +document.querySelector('#c-metrics').dataset.points >= 3", None)
    first = points(page)
    wait_value(page, "n => +document.querySelector('#c-metrics').dataset.points > n", first)
    wait_value(page, "() => +document.querySelector('#c-metrics').dataset.points >= 25", None)
    expect(page.locator("#d-facts [data-fact=engine] dd")).to_have_text("hfl")
    shot(page, "dashboard-running.png")
    # suspend: the request is SUSPENDED and its iterations stop growing
    page.get_by_role("button", name="Suspend").click()
    expect(row(page, pid)).to_have_attribute("data-status", "SUSPENDED")
    held = srv.get(srv.req("LIVE"))["attributes"]["requestStatus"]
    assert held == "SUSPENDED"
    n_suspended = iterations(page, pid)
    page.wait_for_timeout(1500)  # the window in which a suspended process must do nothing
    assert iterations(page, pid) == n_suspended
    # resume: it trains again
    page.get_by_role("button", name="Resume").click()
    expect(row(page, pid)).to_have_attribute("data-status", "IN_PROGRESS")
    wait_value(page, f"n => +document.querySelector('#procs tr[data-id=\"{pid}\"]').dataset.iterations > n",
               n_suspended)
    # cancel: CANCELLED, shown with its cause
    page.get_by_role("button", name="Cancel").click()
    expect(row(page, pid)).to_have_attribute("data-status", "CANCELLED")
    expect(page.locator("#d-end")).to_contain_text("CANCELLED")
    assert srv.get(srv.req("LIVE"))["attributes"]["requestStatus"] == "CANCELLED"
    page.close()


@needs_chromium
def test_new_termination_parameters_end_it_with_their_cause(browser: Any, svc: Any) -> None:
    srv = svc["srv"]
    page = signed_in(browser, srv.root, svc["alice"])
    dropping = {**HFL, "train": {**HFL["train"], "dropout": 0.3}}  # some clients drop out of some rounds
    checked(srv.http.put(srv.req("DONE"), json=request_body("DONE", dropping, termination={"iterations": 5000})), 201)
    pid = srv.process_of("DONE")["id"]
    row(page, pid).get_by_role("button", name=pid).click()
    expect(row(page, pid)).to_have_attribute("data-status", "IN_PROGRESS")
    page.get_by_label("iterations", exact=True).fill("12")
    page.get_by_role("button", name="Send").click()
    expect(row(page, pid)).to_have_attribute("data-status", "FINISHED")
    expect(page.locator("#d-end")).to_contain_text("CRITERION_MET")
    expect(page.locator("#d-end")).to_contain_text("iterations")
    report = srv.get(srv.dn(srv.get(srv.proc_uri(pid))["attributes"]["trainingReportRef"]))
    iters = next(c for c in report["VsDataContainer"] if c["id"] == "sluice-report")["attributes"]["vsData"]
    assert iters["iterations"] < 5000
    expect(page.locator("#criteria tbody tr").first).to_contain_text("100 %")
    expect(page.locator("#clients tbody tr[data-client]")).to_have_count(5)
    dropped = [c for c in iters["clients"] if c["dropped"]]
    assert dropped, "dropout 0.3 dropped no client"
    expect(page.locator("#clients tbody tr.dropped")).to_have_count(len(dropped))
    page.get_by_role("button", name="Show the report").click()
    expect(page.locator("#report")).to_contain_text("fLReportPerClient")
    with page.expect_download() as dl:
        page.get_by_role("button", name="Download the model").click()
    assert Path(dl.value.path()).stat().st_size > 0
    shot(page, "dashboard-finished.png")
    page.close()


@needs_chromium
def test_a_producers_proposal_is_answered_from_the_page(browser: Any, svc: Any) -> None:
    srv = svc["srv"]
    page = signed_in(browser, srv.root, svc["alice"])
    checked(srv.http.put(srv.req("NEG"), json=request_body("NEG", HFL, decided_by="negotiated")), 201)
    pid = srv.process_of("NEG")["id"]
    row(page, pid).get_by_role("button", name=pid).click()
    expect(page.get_by_role("button", name="Accept the proposal")).to_be_visible()
    page.get_by_label("iterations", exact=True).fill("3")  # modify the proposal: the process's PATCH
    page.get_by_role("button", name="Send").click()
    expect(row(page, pid)).to_have_attribute("data-status", "FINISHED")
    neg = next(c for c in srv.get(srv.proc_uri(pid))["VsDataContainer"] if c["id"] == "sluice-negotiation")
    assert neg["attributes"]["vsData"]["state"] == "AGREED" and neg["attributes"]["vsData"]["modified"] is True
    checked(srv.http.put(srv.req("NEG2"), json=request_body("NEG2", HFL, decided_by="negotiated")), 201)
    pid = srv.process_of("NEG2")["id"]
    row(page, pid).get_by_role("button", name=pid).click()
    page.get_by_role("button", name="Accept the proposal").click()
    expect(page.get_by_role("button", name="Accept the proposal")).to_be_hidden()
    neg = next(c for c in srv.get(srv.proc_uri(pid))["VsDataContainer"] if c["id"] == "sluice-negotiation")
    assert neg["attributes"]["vsData"]["state"] == "AGREED" and neg["attributes"]["vsData"]["modified"] is False
    srv.patch(srv.proc_uri(pid), {"attributes": {"cancelProcess": True}}, (200, 409))  # 409: it ended already
    page.close()


@needs_chromium
def test_another_consumer_does_not_see_the_request(browser: Any, svc: Any) -> None:
    srv = svc["srv"]
    checked(srv.http.put(srv.req("MINE"), json=request_body("MINE", HFL, termination={"iterations": 3},
                                                             attributes={"suspendRequest": True})), 201)
    pid = srv.process_of("MINE")["id"]
    alice = signed_in(browser, srv.root, svc["alice"])
    expect(row(alice, pid)).to_be_visible()
    bob = signed_in(browser, srv.root, svc["bob"])
    expect(bob.locator("#count")).to_have_text("(0)")
    assert row(bob, pid).count() == 0
    bad = browser.new_page()
    bad.goto(srv.root + "/")
    expect(bad.locator("#login")).to_be_visible()
    for p in (alice, bob, bad):
        p.close()


@needs_chromium
def test_the_page_reconnects_after_a_service_restart(browser: Any, svc: Any) -> None:
    srv = svc["srv"]
    checked(srv.http.put(srv.req("BACK"), json=request_body("BACK", HFL, termination={"iterations": 3},
                                                             attributes={"suspendRequest": True})), 201)
    pid = srv.process_of("BACK")["id"]
    page = signed_in(browser, srv.root, svc["alice"])
    expect(row(page, pid)).to_be_visible()
    stop_server(srv)
    expect(page.locator("#conn")).to_have_attribute("data-state", "reconnecting")
    svc["srv"] = srv = start_server(svc["tmp"], port=srv.port, db=srv.db, extra=(str(svc["cfg"]),),
                                    token=svc["alice"])
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    expect(row(page, pid)).to_be_visible()
    checked(srv.http.put(srv.req("AFTER"), json=request_body("AFTER", HFL, termination={"iterations": 3},
                                                              attributes={"suspendRequest": True})), 201)
    expect(row(page, srv.process_of("AFTER")["id"])).to_be_visible()
    page.close()


def test_the_page_and_its_files_need_no_token_but_the_feed_does(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    carol = add_token(tokens, "carol")
    cfg = tmp_path / "service.toml"
    cfg.write_text(f'[auth]\ntokens_file = "{tokens}"\n', encoding="utf-8")
    with running_server(tmp_path, extra=(str(cfg),), token=carol) as srv, \
            httpx.Client(base_url=srv.root, timeout=30, trust_env=False) as anonymous:
        assert anonymous.get("/").status_code == 200
        assert "text/html" in anonymous.get("/").headers["content-type"]
        assert anonymous.get("/dashboard/static/vendor/uPlot.iife.min.js").status_code == 200
        assert anonymous.get("/dashboard/api/events").status_code == 401
        assert anonymous.get("/dashboard/api/processes/x").status_code == 401
        assert anonymous.get(srv.uri(TF)).status_code == 401
        assert srv.http.get(srv.root + "/dashboard/api/processes/x").status_code == 404
