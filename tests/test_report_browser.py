"""The HTML report as a person sees it: opened in headless Chromium with the network off, it loads
nothing from anywhere, and shows the cell matrix and a log-scale curve for every cell that ran; a
failing cell shows its failing layers' mismatch counts and worst elements (checked against the
Parquet files) and an element-error histogram; `parity compare A B --html` draws both commits' curves.
The screenshots in docs/ (report.png, compare.png) are written by these tests when PARITY_DOCS_SCREENSHOTS=1
(else under the test's tmp_path: `make test` leaves a clean clone clean, issue 36 item 13).
Needs Debian's chromium and chromium-driver (.ci/run installs them); skips with the reason otherwise."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from conftest import ROOT, fp16_regression, make_repo


def _shots(tmp_path):
    """Where the screenshots go: docs/ only when asked (PARITY_DOCS_SCREENSHOTS=1), so tests change no tracked file."""
    return ROOT / "docs" if os.environ.get("PARITY_DOCS_SCREENSHOTS") == "1" else tmp_path

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
    events: list[dict] = []
    end = time.monotonic() + 30
    while True:  # a failed fetch may be logged after the load event: wait until every fetch has ended
        events += [json.loads(e["message"])["message"] for e in browser.get_log("performance")]
        sent = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in events
                if e["method"] == "Network.requestWillBeSent"}
        fetched = {i: u for i, u in sent.items() if u.split(":")[0] in ("http", "https", "ws", "wss", "file")}
        ended = {e["params"]["requestId"] for e in events
                 if e["method"] in ("Network.loadingFinished", "Network.loadingFailed")}
        if set(fetched) <= ended or time.monotonic() > end:
            break
        time.sleep(0.1)
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
    assert verdicts <= {"PASS", "FAIL", "BASELINE"} and "PASS" in verdicts  # torch_cpu cells: BASELINE
    curves = browser.find_elements(By.CSS_SELECTOR, "svg.curve")
    exact = browser.find_elements(By.CSS_SELECTOR, "p.exact")
    assert len(curves) + len(exact) == 4 and len(curves) >= 2
    for svg in curves:
        assert svg.size["width"] > 300 and svg.size["height"] > 100  # laid out, not collapsed
        assert svg.find_elements(By.TAG_NAME, "polyline")
        # the pass limit is drawn and named, on the one scale of a verdict number (excess/limit = 1 in both modes)
        assert any("limit: excess/limit = 1" in t.text for t in svg.find_elements(By.TAG_NAME, "text"))
    # layer names under the x-axis, not "layer 0"
    labels = {t.get_attribute("textContent") for svg in curves for t in svg.find_elements(By.CSS_SELECTOR, "text.xl")}
    assert {"fc1", "fc2", "output"} <= labels, labels
    # every cell, passing ones too, has its per-layer table (collapsed until opened)
    details = browser.find_elements(By.CSS_SELECTOR, "section.cell details.layers")
    assert len(details) == 4
    details[0].find_element(By.TAG_NAME, "summary").click()
    assert "fc1" in details[0].find_element(By.TAG_NAME, "table").text
    env = browser.find_element(By.ID, "environment").text
    assert all(k in env for k in ("CPU", "OS", "threads", "logical CPUs", "capture.threads = 0"))
    # the op inventory of the export and its uncalled modules
    ops = browser.find_element(By.ID, "models").text
    assert "tiny_mlp" in ops and "Gemm" in ops and "none" in ops
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


@pytest.fixture(scope="module")
def two_commits(tmp_path_factory):
    """Commit 1: fp16 at a loose tolerance (passes). Commit 2: fp16 at a tolerance it cannot meet
    (atol 1e-7, rtol 1e-6: an injected failure with finite ratios), verdicts by tolerance."""
    return fp16_regression(tmp_path_factory.mktemp("report-fail") / "repo", "tol: {atol: 1.0e-7, rtol: 1.0e-6}")


def test_failing_layers_show_mismatch_counts_and_the_worst_element(two_commits, browser, tmp_path):
    from selenium.webdriver.common.by import By

    from parity.core import store

    r, cell = two_commits, "tiny_mlp-fp16-ort_cpu"
    page = r.path / "artifacts/report/report.html"
    fetched, failed = load(browser, page.as_uri())
    assert fetched == [page.as_uri()] and failed == []
    layers = json.loads((r.path / f"artifacts/diff/{cell}/layers.json").read_text())["layers"]
    failing = [d for d in layers if not d["passed"]]
    assert failing
    section = browser.find_element(By.ID, cell)
    table = section.find_element(By.CSS_SELECTOR, "table.failing")
    head = [th.text for th in table.find_elements(By.TAG_NAME, "th")]
    rows = {tr.find_elements(By.TAG_NAME, "td")[1].text: [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in table.find_elements(By.TAG_NAME, "tr")[1:]}
    assert set(rows) == {d["name"] for d in failing}
    act = store.read_dict(r.path / f"artifacts/capture/{cell}/layers.parquet")
    ref = store.read_dict(r.path / "artifacts/reference/tiny_mlp/fp32.parquet")
    for d in failing:
        row = dict(zip(head, rows[d["name"]]))
        n, total = d["n_outside"], d["numel"]
        assert row["mismatched"] == f"{n} / {total} ({100 * n / total:.3g}%)" and 0 < n <= total
        s, idx = d["worst_sample"], tuple(d["worst_index"])
        assert row["worst element"] == f"sample {s} [{', '.join(map(str, idx))}]"
        # the values shown are the captured and reference values at that element, in the Parquet files
        a = float(act[s, d["name"]].array[idx])
        b = float(ref[s, store.reference_name(d["name"])].array[idx])
        assert float(row["actual"]) == pytest.approx(a, rel=1e-6) and float(row["expected"]) == pytest.approx(b, rel=1e-6)
        assert float(row["allowed"]) == pytest.approx(1e-7 + 1e-6 * abs(b), rel=1e-3)
        assert abs(a - b) / float(row["allowed"]) == pytest.approx(d["tol_ratio"], rel=1e-2)
    # the tolerance is said once (a legend), not once per row
    assert section.text.count("atol=1e-07 rtol=1e-06 (dtypes.fp16.tol)") == 1 and "tolerance (key)" not in head
    # an element-error histogram: bins past the tolerance hold the mismatched elements
    hist = section.find_element(By.CSS_SELECTOR, "svg.hist")
    assert "outside the tolerance" in hist.text
    assert "fc1" in hist.text and hist.size["height"] > 100
    # the Markdown report has the same rows (one row builder)
    md = (r.path / "artifacts/report/report.md").read_text()
    worst = failing[0]
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {worst['order']} | {worst['name']} |"))
    assert rows[worst["name"]][3] in line and rows[worst["name"]][4] in line
    # the passing cell has its per-layer table too
    assert browser.find_element(By.ID, "tiny_mlp-fp32-ort_cpu").find_elements(By.CSS_SELECTOR, "details.layers")
    browser.execute_script("arguments[0].scrollIntoView()", section)
    png = _shots(tmp_path) / "report.png"
    assert section.screenshot(str(png)) and png.stat().st_size > 10_000


def test_compare_page_draws_both_commits_curves_per_cell(two_commits, browser, tmp_path):
    from selenium.webdriver.common.by import By

    out = tmp_path / "compare.html"
    p = two_commits.run(["parity", "compare", "HEAD~1", "HEAD", "--html", str(out)])
    assert "pass->fail REGRESSION" in p.stdout and f"wrote {out}" in p.stdout
    fetched, failed = load(browser, out.as_uri())
    assert fetched == [out.as_uri()] and failed == []
    assert "dtypes.fp16.tol.atol" in browser.find_element(By.ID, "tolerance-changes").text
    for cell in ("tiny_mlp-fp32-ort_cpu", "tiny_mlp-fp16-ort_cpu"):
        section = browser.find_element(By.ID, cell)
        svg = section.find_element(By.CSS_SELECTOR, "svg.compare")
        assert len(svg.find_elements(By.TAG_NAME, "polyline")) == 2  # one curve per commit
        legend = [t.text for t in svg.find_elements(By.CSS_SELECTOR, "text.legend")]
        assert legend == ["HEAD~1: excess/limit (tol_ratio)", "HEAD: excess/limit (tol_ratio)"]
    fp16 = browser.find_element(By.ID, "tiny_mlp-fp16-ort_cpu")
    assert "PASS" in fp16.find_element(By.TAG_NAME, "h2").text and "FAIL" in fp16.text
    assert "drift origin" in fp16.find_element(By.CSS_SELECTOR, "svg.compare").text
    png = _shots(tmp_path) / "compare.png"
    body = browser.find_element(By.TAG_NAME, "body")
    assert body.screenshot(str(png)) and png.stat().st_size > 10_000
    # against the workspace (no REV_B): its layers.json files are read from disk
    ws = tmp_path / "ws.html"
    two_commits.run(["parity", "compare", "HEAD~1", "--html", str(ws)])
    load(browser, ws.as_uri())
    svg = browser.find_element(By.ID, "tiny_mlp-fp16-ort_cpu").find_element(By.CSS_SELECTOR, "svg.compare")
    assert [t.text for t in svg.find_elements(By.CSS_SELECTOR, "text.legend")] == [
        "HEAD~1: excess/limit (tol_ratio)", "workspace: excess/limit (tol_ratio)"]
