"""The status page (`GET /`) and the invocation pages as people see them: loaded in
headless Chromium (Debian's `chromium`, driven by Playwright) from a running
`toolexec up`; screenshots are kept under test-artifacts/."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from tests.cli_process import REPO
from tests.integration.gateway_support import (
    RunningGateway,
    refused_api_tool,
    running_gateway,
    wait_until,
)

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = REPO / "test-artifacts"

if CHROMIUM is None:
    pytest.skip("no chromium on PATH (Debian package `chromium`; .ci/run installs it)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningGateway, str]]:
    """A running gateway with one completed invocation and one open circuit breaker."""
    with running_gateway(tmp_path_factory.mktemp("status-page")) as gateway:
        done = gateway.invoke("py_echo", {"text": "seen in a browser"})
        assert done.status_code == 200, done.text
        assert gateway.register(refused_api_tool("page_refused", "page-service")).is_success
        assert gateway.invoke("page_refused").status_code == 503
        wait_until(lambda: any(c["service_id"] == "page-service" and c["state"] == "open"
                               for c in gateway.http.get("/v1/circuits").json()["circuits"]))
        yield gateway, done.json()["invocation_id"]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as playwright:
        # --no-sandbox: Chromium's own sandbox needs user namespaces it lacks as root.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--no-sandbox"])
        yield launched
        launched.close()


def test_status_page_shows_invocations_breakers_registry_and_searches_the_audit(
        observed, browser, capsys: pytest.CaptureFixture[str]) -> None:
    gateway, invocation_id = observed
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{gateway.url}/")

    assert page.title() == "toolexec status"
    row = page.locator(f'#invocations tr[data-invocation="{invocation_id}"]')
    assert "completed" in row.inner_text() and "py_echo" in row.inner_text()
    headers = page.locator("#invocations thead th").all_inner_texts()
    assert " ms" in row.locator("td").nth(headers.index("latency")).inner_text()
    breaker = page.locator('#circuits tr[data-service="page-service"]')
    assert "open" in breaker.inner_text()
    assert page.locator('#registry tr[data-tool="py_echo"]').count() == 1
    assert page.locator('#registry tr[data-tool="page_refused"]').count() == 1

    page.fill('#audit-search input[name="audit_invocation"]', invocation_id)
    page.click('#audit-search button[type="submit"]')
    page.wait_for_selector('table[data-section="audit"]')
    types = page.locator('table[data-section="audit"] tbody tr td:nth-child(2)').all_inner_texts()
    assert types[0] == "tool.invoke.requested" and types[-1] == "tool.invoke.completed"
    assert page.input_value('#audit-search input[name="audit_invocation"]') == invocation_id

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "status_page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    with capsys.disabled():
        print(f"\nstatus page screenshot: {shot}")

    page.click("#audit a[href^='/v1/audit']")
    records = json.loads(page.locator("body").inner_text())["records"]
    assert [r["type"] for r in records] == types
    page.close()


def _own_scripts_only(page, gateway: RunningGateway) -> None:
    sources = page.eval_on_selector_all("script", "nodes => nodes.map(n => n.src)")
    assert sources == [f"{gateway.url}/static/status.js"]


def test_status_page_escapes_what_it_shows(observed, browser) -> None:
    gateway, _ = observed
    page = browser.new_page()
    page.goto(f"{gateway.url}/?audit_tool=%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert page.input_value('#audit-search input[name="audit_tool"]') == "<script>alert(1)</script>"
    _own_scripts_only(page, gateway)
    assert "No matching audit record." in page.locator("#audit").inner_text()
    page.close()


def _screenshot(page, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / name
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    with capsys.disabled():
        print(f"\nscreenshot: {shot}")


def test_the_page_shows_a_new_invocation_and_its_charts_without_reload(
        observed, browser, capsys: pytest.CaptureFixture[str]) -> None:
    gateway, _ = observed
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{gateway.url}/")
    page.evaluate("window.loadedOnce = 'yes'")  # gone if the page reloads
    page.wait_for_selector('#legend [data-tool="py_echo"]')

    done = gateway.invoke("py_echo", {"text": "arrived after loading"})
    assert done.status_code == 200, done.text
    new_id = done.json()["invocation_id"]
    row = page.wait_for_selector(f'#invocations tr[data-invocation="{new_id}"]',
                                 timeout=30_000)
    assert "completed" in row.inner_text()
    assert page.evaluate("window.loadedOnce") == "yes"
    assert page.locator("#live").inner_text().startswith("live, as of")
    assert page.locator("#chart-rate circle").count() >= 1
    assert page.locator("#chart-latency path[stroke-dasharray]").count() >= 1  # p95
    assert "ended in the last hour" in page.locator("#traffic-note").inner_text()
    assert page.locator("#pending-count").inner_text().isdigit()
    _screenshot(page, "status_page_live.png", capsys)

    page.click(f'#invocations tr[data-invocation="{new_id}"] a')
    page.wait_for_selector('table[data-section="timeline"]')
    assert page.locator("#invocation-id").inner_text() == new_id
    types = page.locator('table[data-section="timeline"] tbody tr td:nth-child(3)'
                         ).all_inner_texts()
    assert types[0] == "tool.invoke.requested" and types[-1] == "tool.invoke.completed"
    assert "arrived after loading" in page.locator("#timeline").inner_text()
    _screenshot(page, "invocation_page.png", capsys)
    page.close()


def test_the_audit_search_results_link_to_the_invocation_page(observed, browser) -> None:
    gateway, invocation_id = observed
    page = browser.new_page()
    page.goto(f"{gateway.url}/?audit_invocation={invocation_id}")
    page.click('table[data-section="audit"] tbody tr:first-child a')
    page.wait_for_selector("#invocation-id")
    assert page.url.endswith(f"/invocations/{invocation_id}")
    assert "seen in a browser" in page.locator("#timeline").inner_text()
    page.close()


HOSTILE = "<img src=x onerror=window.pwned=1>"


def test_hostile_tool_ids_and_outputs_are_shown_as_text(observed, browser) -> None:
    gateway, _ = observed
    page = browser.new_page()
    page.goto(f"{gateway.url}/")
    unknown = gateway.invoke(HOSTILE)
    assert unknown.status_code >= 400, unknown.text
    echoed = gateway.invoke("py_echo", {"text": HOSTILE})
    assert echoed.status_code == 200, echoed.text
    echo_id = echoed.json()["invocation_id"]

    # Drawn by the script from /status.json: the tool id lands as text, in a cell and
    # in the charts' legend.
    page.wait_for_selector(f'#invocations tr[data-invocation="{echo_id}"]', timeout=30_000)
    page.wait_for_function("id => [...document.querySelectorAll('#invocations td')]"
                           ".some(td => td.textContent === id)", arg=HOSTILE, timeout=30_000)
    page.wait_for_function("id => [...document.querySelectorAll('#legend [data-tool]')]"
                           ".some(s => s.textContent === id)", arg=HOSTILE, timeout=30_000)
    assert page.locator("#invocations img, #legend img").count() == 0
    page.reload()  # and as served by the gateway
    assert HOSTILE in page.locator("#invocations").inner_text()
    assert page.locator("img").count() == 0

    page.goto(f"{gateway.url}/invocations/{echo_id}")
    assert HOSTILE in page.locator("#timeline").inner_text()
    assert HOSTILE in page.locator("#summary").inner_text()  # the result
    assert page.locator("img").count() == 0
    assert page.locator("script").count() == 0
    assert page.evaluate("window.pwned") is None
    page.close()
