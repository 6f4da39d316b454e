"""Offline `dvc plots show` / `dvc plots diff`: an HTML page template for DVC (`--html-template`, or
the `plots.html_template` config that `make setup` sets in .dvc/config.local) with Vega, Vega-Lite
and vega-embed inlined, so the page draws its charts with no network.

DVC's own page loads the three libraries from a CDN (dvc_render.vega.VegaRenderer.SCRIPTS) and shows
nothing offline. DVC fills a template's `{plot_divs}` with the charts (each calls `vegaEmbed`) and its
`{scripts}` with those CDN tags: this template has no `{scripts}`, so none are added.

Where the libraries come from: the vl-convert-python wheel (PyPI, a pinned dependency), whose
`javascript_bundle()` returns Vega, Vega-Lite and vega-embed as one self-contained script, built
into the wheel. It needs neither node/npm nor the network at set-up time, only PyPI, like the rest
of the set-up. Vega-Lite 5 because DVC's plot templates are Vega-Lite v5 specs.

    python -m parity.commands.plots [--out .dvc/parity-plots.html]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import vl_convert

from parity.core.io import write_text

DEFAULT_OUT = ".dvc/parity-plots.html"
VEGA_LITE = "5.20"  # the newest 5.x vl-convert bundles; DVC's templates are v5 specs
# what DVC substitutes in a template (dvc_render.html.HTML): a bundle containing any would be mangled
PLACEHOLDERS = ("{plot_divs}", "{scripts}", "{refresh_tag}")

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{refresh_tag}
<title>DVC plots (parity, offline)</title>
<!-- Vega, Vega-Lite and vega-embed inlined from vl-convert-python (parity.commands.plots): no network -->
<script type="text/javascript">
@BUNDLE@
</script>
<style>table { border-spacing: 15px; } body { font-family: sans-serif; }</style>
</head>
<body>
{plot_divs}
</body>
</html>
"""


def bundle() -> str:
    js = vl_convert.javascript_bundle(vl_version=VEGA_LITE)
    bad = [p for p in PLACEHOLDERS if p in js] + (["</script"] if "</script" in js.lower() else [])
    if bad:
        raise RuntimeError(f"vl-convert's bundle contains {bad}: it cannot be inlined into a DVC template")
    return js


def template() -> str:
    return PAGE.replace("@BUNDLE@", bundle())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parity.commands.plots", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"template to write (default {DEFAULT_OUT})")
    a = ap.parse_args(argv)
    try:
        text = template()
    except ImportError:
        print("parity.commands.plots: vl-convert-python is not installed (pip install -e .; make setup does it)",
              file=sys.stderr)
        return 2

    write_text(Path(a.out), text)
    print(f"parity.commands.plots: offline DVC plot template ({len(text) // 1024} KiB) -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
