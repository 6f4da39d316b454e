"""Realistic, deterministic inputs for the real-model set (numpy only): text-like images for OCR, a
photo-like image for the detector, the head and tail bytes of real text files for the file-type
classifier, harmonic tones for the pitch trackers, a syllable-like voiced signal for voice activity.
`write(model, folder)` saves `<folder>/<model>_<input>.npy` ([samples, *shape] arrays) for the conf
snippets beside this file (`init: file, path: data/inputs/real/<model>_<input>.npy`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SAMPLES = 2


def _strokes(rng, h: int, w: int, lines: int) -> np.ndarray:
    """A white page [h, w] in [0, 1] with `lines` rows of dark glyph-like strokes."""
    img = np.full((h, w), 0.96) + rng.normal(0, 0.01, (h, w))
    for li in range(lines):
        y0 = int((li + 0.5) * h / lines - h / lines / 4)
        lh = max(4, int(h / lines / 2))
        x = int(rng.integers(2, 8))
        while x < w - 6:
            gw = int(rng.integers(3, 7))
            for _ in range(int(rng.integers(1, 4))):  # a glyph: a few bars
                if rng.random() < 0.5:
                    xx = x + int(rng.integers(0, gw))
                    img[y0:y0 + lh, xx:xx + 1 + int(rng.integers(0, 2))] = 0.1
                else:
                    yy = y0 + int(rng.integers(0, lh))
                    img[yy:yy + 1 + int(rng.integers(0, 2)), x:x + gw] = 0.1
            x += gw + int(rng.integers(1, 4)) + (6 if rng.random() < 0.15 else 0)
    return np.clip(img, 0, 1)


def ocr_image(rng, h: int, w: int, lines: int, mean, std) -> np.ndarray:
    """[1, 3, h, w] float32, normalised as PP-OCR does ((x - mean) / std per channel)."""
    g = _strokes(rng, h, w, lines)
    rgb = np.stack([g, g * 0.98, g * 0.97])
    return ((rgb - np.asarray(mean)[:, None, None]) / np.asarray(std)[:, None, None])[None].astype(np.float32)


def photo(rng, h: int, w: int) -> np.ndarray:
    """[1, 3, h, w] float32 in [0, 1]: smooth gradients, a few soft blobs, sensor noise."""
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    chans = []
    for c in range(3):
        base = 0.3 + 0.4 * (np.sin(3 * xx + c) * np.cos(2 * yy - c) + 1) / 2
        for _ in range(4):
            cy, cx, r = rng.random(), rng.random(), 0.05 + 0.15 * rng.random()
            base += 0.3 * rng.random() * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / r ** 2)
        chans.append(base + rng.normal(0, 0.02, (h, w)))
    return np.clip(np.stack(chans), 0, 1)[None].astype(np.float32)


TEXTS = [
    b'{\n  "name": "parity",\n  "version": "0.1.0",\n  "dependencies": {"numpy": "2.1", "onnx": "1.17"},\n'
    b'  "scripts": {"test": "pytest -q", "run": "dvc repro"}\n}\n',
    b'"""A module."""\n\nimport os\nimport sys\n\n\ndef main(argv=None):\n    """Print the arguments."""\n'
    b'    for a in argv or sys.argv[1:]:\n        print(os.path.basename(a))\n    return 0\n\n\n'
    b'if __name__ == "__main__":\n    sys.exit(main())\n',
]


def file_bytes(text: bytes, n: int = 1024, pad: int = 256) -> np.ndarray:
    """magika v3's input: the first n and last n bytes of a file (stripped), padded with 256."""
    body = (text * (4 * n // len(text) + 1))[: 3 * n].strip()
    beg = np.full(n, pad, np.int32)
    end = np.full(n, pad, np.int32)
    b = np.frombuffer(body[:n], np.uint8)
    e = np.frombuffer(body[-n:], np.uint8)
    beg[: len(b)] = b
    end[n - len(e):] = e
    return np.concatenate([beg, end])[None]


def tone(rng, n: int, sr: int, f0: float, harmonics: int = 5, noise: float = 0.01) -> np.ndarray:
    """A harmonic tone with vibrato and a soft envelope, amplitude ~0.5."""
    t = np.arange(n) / sr
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.01 * np.sin(2 * np.pi * 5 * t))) / sr
    x = sum(np.sin(k * phase) / k for k in range(1, harmonics + 1))
    env = np.minimum(1, np.minimum(t, t[-1] - t) * 20 + 0.05)
    return 0.5 * x / np.abs(x).max() * env + noise * rng.standard_normal(n)


def voiced(rng, n: int, sr: int) -> np.ndarray:
    """A syllable-like signal: a 140 Hz glottal tone, formant-ish harmonic weights, a 4 Hz envelope."""
    t = np.arange(n) / sr
    ph = 2 * np.pi * 140 * t
    x = sum(w * np.sin(k * ph) for k, w in zip(range(1, 20), [1, .8, .9, .3, .6, .2, .4, .1] + [.05] * 11))
    return (0.3 * x / np.abs(x).max() * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t + rng.random())) +
            0.005 * rng.standard_normal(n))


def crepe_frames(rng, frames: int, f0: float) -> np.ndarray:
    """[frames, 1024] at 16 kHz, hop 160, each frame normalised to mean 0 and std 1 (as torchcrepe does)."""
    x = tone(rng, 160 * frames + 1024, 16000, f0)
    fr = np.stack([x[i * 160: i * 160 + 1024] for i in range(frames)])
    return (fr - fr.mean(1, keepdims=True)) / fr.std(1, keepdims=True)


def _normalised(fr: np.ndarray) -> np.ndarray:
    return (fr - fr.mean(1, keepdims=True)) / fr.std(1, keepdims=True)


def arrays(model: str, seed: int = 0, warm=None) -> dict[str, np.ndarray]:
    """{input name: [SAMPLES, *shape] array} for a model of the set. `warm(chunks, sr)` -> state runs a
    recurrent model over a stream's earlier chunks (silero: the state after 0.5 s of the same voice;
    without it the state is zeros, a stream's first chunk)."""
    rng = np.random.default_rng(seed)
    det = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    rec = ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    make = {
        "ocr_det": lambda: {"x": [ocr_image(rng, 160, 160, 5, *det) for _ in range(SAMPLES)]},
        "ocr_rec": lambda: {"x": [ocr_image(rng, 48, 160, 1, *rec) for _ in range(SAMPLES)]},
        "ocr_cls": lambda: {"x": [ocr_image(rng, 48, 192, 1, *rec) for _ in range(SAMPLES)]},
        "nudenet": lambda: {"images": [photo(rng, 320, 320) for _ in range(SAMPLES)]},
        "magika": lambda: {"bytes": [file_bytes(t) for t in TEXTS[:SAMPLES]]},
        "basic_pitch": lambda: {"serving_default_input_2:0": [
            tone(rng, 43844, 22050, f)[None, :, None] for f in (220.0, 329.6)]},
        "silero_vad": lambda: _vad(rng, warm),
        "silero_vad_op15": lambda: _vad(rng, warm),
        "crepe_tiny": lambda: {"frames": [crepe_frames(rng, 8, f) for f in (220.0, 440.0)]},
        "crepe_unvoiced": lambda: {"frames": [_normalised(rng.standard_normal((8, 1024))), crepe_frames(rng, 8, 20.0)]},
    }
    if model not in make:
        return {}
    out = {k: np.stack(v) for k, v in make[model]().items()}
    return {k: a.astype(np.float32) if a.dtype.kind == "f" else a for k, a in out.items()}


def _vad(rng, warm=None, chunks: int = 16) -> dict:
    """Per sample: chunk `chunks` of a voiced stream as silero v5+ takes it (576 samples: the previous
    chunk's last 64, then 512 new ones), and the state after the chunks before it."""
    out = {"input": [], "state": [], "sr": []}
    for _ in range(SAMPLES):
        x = voiced(rng, 512 * (chunks + 1), 16000).astype(np.float32).reshape(chunks + 1, 512)
        ctx = np.concatenate([np.zeros((1, 64), np.float32), x[:-1, -64:]])
        framed = np.concatenate([ctx, x], axis=1)[:, None]  # [chunks + 1, 1, 576]
        state = warm(framed[:-1], 16000) if warm else np.zeros((2, 1, 128), np.float32)
        out["input"].append(framed[-1])
        out["state"].append(np.asarray(state, np.float32))
        out["sr"].append(np.array(16000, np.int64))
    return out


def write(model: str, folder: Path, seed: int = 0, warm=None) -> list[Path]:
    """Save the model's input arrays as <folder>/<model>_<input>.npy (input names sanitised)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, a in arrays(model, seed, warm).items():
        p = folder / f"{model}_{safe(name)}.npy"
        np.save(p, a)
        out.append(p)
    return out


def safe(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
