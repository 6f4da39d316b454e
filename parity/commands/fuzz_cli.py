"""`parity fuzz SUITE --dtype D --provider P`: a seeded fuzz campaign over a suite's cases, replay of
one case, minimisation of a failure (parity.analysis.fuzz, parity.analysis.fuzz_campaign).

    parity fuzz critical --dtype fp16 --provider ort_cpu --cases 2000 --seed 0
    parity fuzz critical --dtype fp16 --provider ort_cpu --reproduce 'matmul~s821328062' --repeat 2
    parity fuzz critical --dtype fp16 --provider ort_cpu --minimise 'matmul~s821328062' --yaml min.yaml

A case id is `<suite case>~s<seed>`; a bare seed is looked up in the campaign (--campaign DIR).
Settings default to params.yaml's `fuzz:` section; a dtype or provider not selected in params.yaml
is read from conf/dtypes/<d>.yaml, conf/providers/<p>.yaml. Exit status: 0, 1 when --reproduce
gave different bytes across runs or --minimise found no failure, 2 on a usage or suite error.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from parity.config import params as config
from parity.core import io
from parity.core.ui import at_least
from parity.analysis import fuzz, fuzz_campaign as fc
from parity.suites import spec


def _conf_option(group: str, name: str) -> dict:
    f = spec.suites_dir().parent / group / f"{name}.yaml"
    if not f.exists():
        avail = sorted(x.stem for x in f.parent.glob("*.yaml"))
        raise config.ConfigError(f"unknown {group} option '{name}' (no {f}). Available: {', '.join(avail)}")
    return (yaml.safe_load(f.read_text()) or {})[name]


def params_for(dtype: str, provider: str, path: str = config.PARAMS_FILE) -> dict:
    """params.yaml (validated) when there is one, plus conf/ entries for an unselected dtype/provider."""
    p = config.load(path) if Path(path).exists() else {"seed": 0}
    p = dict(p, dtypes=dict(p.get("dtypes") or {}), providers=dict(p.get("providers") or {}))
    if dtype not in p["dtypes"]:
        p["dtypes"][dtype] = _conf_option("dtypes", dtype)
    if provider not in p["providers"]:
        p["providers"][provider] = _conf_option("providers", provider)
    if dtype not in p["providers"][provider].get("dtypes", []):
        raise config.ConfigError(f"provider {provider} does not support dtype {dtype}: it takes "
                                 f"{', '.join(p['providers'][provider].get('dtypes', []))}")
    return p


def load_suite(name_or_file: str) -> tuple[str, dict]:
    f = Path(name_or_file)
    if f.suffix in (".yaml", ".yml") and f.exists():
        return f.stem, spec.load_section(f.stem, f.parent)[0]
    return name_or_file, spec.load_section(name_or_file)[0]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="parity fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", help="suite name (conf/suites/<name>.yaml) or a suite file")
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--provider", required=True)
    ap.add_argument("--cases", type=at_least(1), help="cases in the campaign (fuzz.cases)")
    ap.add_argument("--seed", type=at_least(0), help="campaign seed (fuzz.seed), an integer >= 0")
    ap.add_argument("--op", action="append", help="fuzz only suite cases matching this fnmatch pattern (repeatable)")
    ap.add_argument("--nonfinite", action="store_true", help="also draw NaN/Inf inputs")
    ap.add_argument("--no-empty", action="store_true", help="never draw size-0 dims")
    ap.add_argument("--max-numel", type=at_least(1), help="largest tensor a case may have (elements)")
    ap.add_argument("--workers", type=at_least(1))
    ap.add_argument("--timeout", type=float, help="per-case limit in seconds")
    ap.add_argument("--out", help="campaign directory (default parity-fuzz/<suite>-<dtype>-<provider>)")
    ap.add_argument("--list", type=at_least(0), default=20, help="failures to print (all are in failures.parquet)")
    ap.add_argument("--reproduce", metavar="ID|SEED", help="replay one case and print its mismatch")
    ap.add_argument("--repeat", type=at_least(1), default=2, help="--reproduce: runs, each in a fresh worker")
    ap.add_argument("--minimise", "--minimize", dest="minimise", metavar="ID|SEED",
                    help="shrink a failing case and write it as a suite YAML file")
    ap.add_argument("--yaml", help="--minimise: where to write the suite file (default <out>/<name>.yaml)")
    ap.add_argument("--campaign", help="campaign directory to look a bare seed up in (default --out)")
    ap.add_argument("--params", default=config.PARAMS_FILE)
    return ap


def _settings(a, p: dict) -> dict:
    f = fc.settings(p)
    for k, v in (("cases", a.cases), ("seed", a.seed), ("ops", a.op), ("max_numel", a.max_numel),
                 ("workers", a.workers), ("timeout_s", a.timeout)):
        if v is not None:
            f[k] = v
    if a.nonfinite:
        f["nonfinite"] = True
    if a.no_empty:
        f["empty"] = False
    return f


def _describe(m: dict) -> str:
    """dims, then each preset's drawn values / layout / non-finite entries."""
    dims = m["spec"].get("dims") or {}
    parts = ["dims " + (" ".join(f"{k}={v}" for k, v in dims.items()) or "-")]
    for n, p in (m["spec"].get("presets") or {}).items():
        extra = [f"{k} {v}" for k, v in p.items() if k in ("init", "layout", "nonfinite")]
        if extra:
            parts.append(f"{n}: " + ", ".join(extra).replace("'", ""))
    return "; ".join(parts)


def _campaign(a, p, suite, section, f, out: Path) -> int:
    rows, failures, stats = fc.campaign(p, suite, section, a.dtype, a.provider, f)
    s = fc.write_campaign(out, suite, a.dtype, a.provider, f, rows, failures)
    io.write_json(out / "timing.json", stats)
    print(f"fuzz {suite} {a.dtype} {a.provider}: {s['cases']} cases in {stats['wall_s']:.1f} s "
          f"({stats['cases_per_s']:.1f} cases/s), {s['failures']} failures; "
          + ", ".join(f"{k}={v}" for k, v in s["counts"].items()))
    for r in failures[:a.list]:
        print(f"  {r['id']:<32} seed {r['seed']:<10} {r['status']:<12} {r['values']}/{r['layout']} "
              f"{' '.join(f'{k}={v}' for k, v in r['dims'].items())}  {r['reason'][:110]}")
    if len(failures) > a.list:
        print(f"  ... {len(failures) - a.list} more in {out / 'failures.parquet'}")
    print(f"wrote {out}/campaign.json, failures.parquet; replay one: parity fuzz {a.suite} --dtype {a.dtype} "
          f"--provider {a.provider} --reproduce ID")
    return 0


def _reproduce(a, p, suite, section, f, m) -> int:
    print(f"{m['case']['id']} on {a.provider} {a.dtype}: {_describe(m)}")
    runs = fc.reproduce(p, suite, section, a.dtype, a.provider, m, a.repeat, float(f["timeout_s"]))
    for i, (status, reason, dig, d) in enumerate(runs, 1):
        extra = f" max_abs {d['max_abs']:.6g} tol_ratio {d['tol_ratio']:.6g}" if d.get("max_abs") is not None else ""
        print(f"run {i}: {status:<12} digest {dig}{extra}  {reason}")
    same = len({r[2] for r in runs}) == 1
    print(f"bit-identical: {'yes' if same else 'NO'} ({len(runs)} runs, a fresh worker each)")
    return 0 if same else 1


def _minimise(a, p, suite, section, f, m, out: Path) -> int:
    print(f"minimising {m['case']['id']} on {a.provider} {a.dtype}: {_describe(m)}", file=sys.stderr)
    try:
        small, status, runs = fc.minimise_case(p, suite, section, a.dtype, a.provider, m, float(f["timeout_s"]),
                                               log=lambda s: print("  " + s, file=sys.stderr))
    except ValueError as e:
        print(f"parity fuzz: {e}", file=sys.stderr)
        return 1
    name = "fuzz_" + re.sub(r"\W", "_", m["case"]["id"].replace("~", "_"))
    path = Path(a.yaml) if a.yaml else out / f"{name}.yaml"
    if a.yaml:
        name = path.stem
    note = (f"minimised by `parity fuzz {a.suite} --dtype {a.dtype} --provider {a.provider} --minimise "
            f"{m['case']['id']}`\nstatus {status} ({runs} candidates run); {_describe(small)}\n"
            f"the case id seeds its values: keep it to replay the failure")
    io.write_text(path, fuzz.to_suite_yaml(small, name, section.get("tolerances") or [], note))
    print(f"{small['case']['id']}: still {status} at {_describe(small)} ({runs} candidates run)")
    print(f"wrote {path} (check: parity suite validate {path})")
    return 0


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        p = params_for(a.dtype, a.provider, a.params)
        suite, section = load_suite(a.suite)
        f = _settings(a, p)
        out = Path(a.out or f"parity-fuzz/{suite}-{a.dtype}-{a.provider}")
        ident = a.reproduce or a.minimise
        if ident is None:
            return _campaign(a, p, suite, section, f, out)
        m = fc.find_case(ident, suite, section, Path(a.campaign) if a.campaign else out,
                         p["dtypes"][a.dtype]["torch"], f)
    except (config.ConfigError, spec.SuiteError, KeyError, ValueError) as e:
        print(f"parity fuzz: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    if a.reproduce:
        return _reproduce(a, p, suite, section, f, m)
    return _minimise(a, p, suite, section, f, m, out)


if __name__ == "__main__":
    raise SystemExit(main())
