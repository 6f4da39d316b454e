"""`dvc exp show` readable (issue 14, item 2): the one DVC metric is the report's compact summary.json
(no key collisions across cells), `parity exp` shows only what differs between experiments in at most
40 columns, and `dvc plots show` with the set-up's template draws offline (Vega inlined, no CDN).

One repo: the tiny model's default run (fp32, fp16) as an experiment, then `-S 'dtypes=[fp32,bf16]'`
as a second one, as a person compares two precision choices."""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest

from conftest import BIN, make_repo

CELLS = [f"tiny_mlp-{d}-{p}" for d in ("fp32", "fp16", "bf16") for p in ("torch_cpu", "ort_cpu")]


@pytest.fixture(scope="module")
def exps(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("expshow") / "repo")
    r.run(["dvc", "exp", "run", "-n", "fp16"])
    r.run(["dvc", "exp", "run", "-n", "bf16", "-S", "dtypes=[fp32,bf16]"])
    return r


def md_header(text: str) -> list[str]:
    return [c.strip() for c in text.splitlines()[0].strip().strip("|").split("|")]


def test_dvc_exp_show_has_one_compact_metric_without_collisions(exps):
    shown = json.loads(exps.run(["dvc", "exp", "show", "--json"]).stdout)
    rows = [shown[0]] + [e for b in shown[1:] for rng in b.get("experiments") or [] for e in rng["revs"]]
    assert len(rows) == 3  # the workspace and the two experiments (the baseline commit never ran)
    for row in rows:
        metrics = row["data"]["metrics"]
        assert list(metrics) == ["artifacts/report/summary.json"], list(metrics)
        s = metrics["artifacts/report/summary.json"]["data"]
        cells = [k for k in s if "-" in k]
        assert list(s)[:4] == ["cells", "passed", "failed", "not_run"] and len(cells) == s["cells"] == 4
        for c in cells:
            assert set(s[c]) <= {"verdict", "worst", "origin"}, s[c]
    head = md_header(exps.run(["dvc", "exp", "show", "--md", "--no-pager"]).stdout)
    assert not [h for h in head if ".json:" in h]  # no column needed its file's path to be told apart
    metric_cols = [h for h in head if h in ("cells", "passed", "failed", "not_run") or h.split(".")[0] in CELLS]
    assert len(metric_cols) <= 4 + 3 * len(CELLS), metric_cols  # was ~40 per cell


def test_parity_exp_shows_only_what_differs_in_few_columns(exps):
    head = md_header(out := exps.run(["parity", "exp", "--md"]).stdout)
    assert len(head) <= 40, head
    assert head[:2] == ["Experiment", "Created"]
    assert "dtypes" in head and "passed" in head and "failed" in head
    assert set(CELLS) <= set(head)
    # params equal in every row (the model's arch, seed, providers) are not shown; a dtype's leaves
    # are not shown either: both experiments select fp32 with the same settings
    assert not [h for h in head if h.startswith(("models", "seed", "providers", "dtypes."))], head
    rows = {r["Experiment"]: r for r in json.loads(exps.run(["parity", "exp", "--json"]).stdout)}
    assert rows["bf16"]["dtypes"] == "fp32,bf16" and rows["fp16"]["dtypes"] == "fp32,fp16"
    assert rows["fp16"]["tiny_mlp-bf16-ort_cpu"] == "-" and rows["bf16"]["tiny_mlp-fp16-ort_cpu"] == "-"
    assert rows["fp16"]["tiny_mlp-fp32-ort_cpu"].split()[0] in ("PASS", "FAIL")
    assert "| fp32,bf16 |" in out
    # transposed: one column per row of the table above, however many cells there are
    tr = exps.run(["parity", "exp", "-T", "--md"]).stdout
    assert md_header(tr)[0] == "Experiment" and set(md_header(tr)[-2:]) == {"fp16", "bf16"}
    assert [ln.split("|")[1].strip() for ln in tr.splitlines()[2:]][-6:] == [
        c for c in head if c in CELLS]
    # everything on request: every param (groups still one column each)
    every = md_header(exps.run(["parity", "exp", "--md", "--all-params"]).stdout)
    assert "seed" in every and "models" in every and "capture_providers" not in every


def test_a_changed_leaf_inside_a_selected_option_is_shown(exps):
    exps.run(["dvc", "exp", "run", "-n", "looser", "-S", "dtypes=[fp32,bf16]", "-S", "dtypes.bf16.tol.atol=2e-5"])
    rows = json.loads(exps.run(["parity", "exp", "--json"]).stdout)
    by = {r["Experiment"]: r for r in rows}
    assert by["looser"]["dtypes.bf16.tol.atol"] == "2e-05" and by["bf16"]["dtypes.bf16.tol.atol"] == "1e-05"
    assert by["fp16"]["dtypes.bf16.tol.atol"] == "-"  # fp16's run has no bf16


CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def test_dvc_plots_show_with_the_set_up_template_loads_nothing_from_the_network(exps, tmp_path):
    exps.run([f"{BIN}/python", "-m", "parity.commands.plots", "--out", ".dvc/parity-plots.html"])
    exps.run(["dvc", "config", "--local", "plots.html_template", "parity-plots.html"])  # as make setup does
    exps.run(["dvc", "plots", "show", "-o", str(tmp_path / "plots")])
    page = tmp_path / "plots" / "index.html"
    html = page.read_text()
    assert html.count("vegaEmbed(") >= 4  # one chart per cell of the workspace run
    # no script, stylesheet or image from anywhere: every src/href is local or an in-page anchor
    refs = re.findall(r"""\b(?:src|href)\s*=\s*["']([^"']*)["']""", html)
    assert not [u for u in refs if re.match(r"(https?:)?//", u)], refs
    assert "cdn.jsdelivr.net" not in html and "<script src" not in html
    if not (CHROMIUM and DRIVER):
        pytest.skip("needs Debian's chromium + chromium-driver to draw the page")
    drawn = draw_offline(page, tmp_path / "chromium")
    assert drawn["fetched"] == [page.as_uri()], drawn  # the page itself, nothing else
    assert drawn["charts"] >= 4 and drawn["charts"] == drawn["embeds"], drawn


def draw_offline(page, profile) -> dict:
    """Open `page` in headless Chromium with the network off; what it fetched and how many charts
    vega-embed drew (a canvas or svg inside each chart's div)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
              "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    d = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        d.get(page.as_uri())
        count = "return document.querySelectorAll('.vega-embed canvas, .vega-embed svg.marks').length"
        WebDriverWait(d, 60).until(lambda drv: drv.execute_script(count) >= 4)
        events = [json.loads(e["message"])["message"] for e in d.get_log("performance")]
        urls = {e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"}
        return {"fetched": sorted(u for u in urls if u.split(":")[0] in ("http", "https", "ws", "wss", "file")),
                "charts": d.execute_script(count),
                "embeds": d.execute_script("return document.querySelectorAll('.vega-embed').length")}
    finally:
        d.quit()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
