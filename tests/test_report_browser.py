"""The HTML report as a person sees it: opened in headless Chromium with the network off, it loads
nothing from anywhere, and shows the cell matrix and a log-scale curve for every cell that ran.
Needs Debian's chromium and chromium-driver (.ci/run installs them); skips with the reason otherwise."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import make_repo

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="needs Debian's chromium + chromium-driver (apt-get install chromium chromium-driver)")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("report") / "repo")
    r.repro()
    return r.path / "artifacts/report/report.html"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--window-size=1280,2000", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
              # network off: every non-file request goes to a closed loopback port and fails
              "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    d = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield d
    d.quit()


def load(browser, uri) -> tuple[list[str], list[str]]:
    """Open `uri`; return (every URL fetched, the ones that failed). chrome:// internals are not fetches."""
    browser.get_log("performance"), browser.get_log("browser")  # drop earlier events
    browser.get(uri)
    events = [json.loads(e["message"])["message"] for e in browser.get_log("performance")]
    sent = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in events
            if e["method"] == "Network.requestWillBeSent"}
    fetched = {i: u for i, u in sent.items() if u.split(":")[0] in ("http", "https", "ws", "wss", "file")}
    failed = [fetched[e["params"]["requestId"]] for e in events
              if e["method"] == "Network.loadingFailed" and e["params"]["requestId"] in fetched]
    return sorted(set(fetched.values())), failed


def test_the_offline_check_catches_a_page_that_needs_the_network(browser, tmp_path):
    page = tmp_path / "cdn.html"
    page.write_text("<html><body><script src='https://cdn.jsdelivr.net/npm/vega@5'></script></body></html>")
    fetched, failed = load(browser, page.as_uri())
    assert "https://cdn.jsdelivr.net/npm/vega@5" in fetched and failed


def test_report_renders_offline_with_matrix_and_curves(report, browser, tmp_path):
    from selenium.webdriver.common.by import By

    fetched, failed = load(browser, report.as_uri())
    assert fetched == [report.as_uri()]  # the page itself, nothing else
    assert failed == []
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

    cells = browser.find_elements(By.CSS_SELECTOR, "#matrix td.m")
    assert len(cells) == 4
    verdicts = {c.get_attribute("data-verdict") for c in cells}
    assert verdicts <= {"PASS", "FAIL"} and "PASS" in verdicts
    curves = browser.find_elements(By.CSS_SELECTOR, "svg.curve")
    exact = browser.find_elements(By.CSS_SELECTOR, "p.exact")
    assert len(curves) + len(exact) == 4 and len(curves) >= 2
    for svg in curves:
        assert svg.size["width"] > 300 and svg.size["height"] > 100  # laid out, not collapsed
        assert svg.find_elements(By.TAG_NAME, "polyline")
        # the pass limit is drawn and named: k for the oracle verdict (default), tol_ratio = 1 for tolerance
        assert any("limit k =" in t.text or "tolerance" in t.text for t in svg.find_elements(By.TAG_NAME, "text"))
    assert "Environment" in browser.find_element(By.TAG_NAME, "body").text
    png = tmp_path / "report.png"
    assert browser.save_screenshot(str(png)) and png.stat().st_size > 10_000


@pytest.fixture(scope="module")
def suite_report(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("suite-report") / "repo", dtypes=("fp16",),
                  providers=("torch_cpu", "ort_cpu"))
    ran = r.exp_run("suites=[critical]")
    return r, ran


def test_report_shows_the_op_coverage_matrix_when_suites_ran(suite_report, browser):
    from selenium.webdriver.common.by import By

    r, ran = suite_report
    # the report depends on the suites' coverage (report.coverage_dep), so it runs after it
    assert ran.index("suite_coverage@critical") < ran.index("report")
    params = r.path / "params.yaml"
    assert "coverage_dep: artifacts/suites/coverage" in params.read_text()
    page = r.path / "artifacts/report/report.html"
    fetched, failed = load(browser, page.as_uri())
    assert fetched == [page.as_uri()] and failed == []
    section = browser.find_element(By.ID, "coverage-critical")
    text = section.text
    assert "aten::matmul" in text and "ort_cpu/fp16" in text
    md = (r.path / "artifacts/report/report.md").read_text()
    assert "## Op coverage: suite `critical`" in md and "| supported |" in md
    grads = next(ln for ln in md.splitlines() if ln.startswith("| gradient checks"))
    assert "25/25" in grads  # torch_cpu fp16 backward vs the fp32 reference, every differentiable case
    assert "gradient checks" in section.text
