#!/usr/bin/env python3
"""Make docs/show.png again: the README's screenshot of a `shardkit show` page.

Writes a small demo dataset (synthetic images from tools/gen_images.py,
captions, labels with class names, JSON, an array), writes its page with
`shardkit show`, and takes a screenshot of the page's top with headless
Chromium (tools/install_chromium.sh installs it), reduced to a palette PNG
so that it stays small.

    python tools/screenshot_show.py [--out docs/show.png]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_images import jpeg_bytes, make_image  # noqa: E402

import shardkit  # noqa: E402

CLASSES = ["meadow", "coast", "forest", "desert"]
CAPTIONS = [
    "a field of grass under a pale sky",
    "waves on a rocky shore at dusk",
    "tall pines after the rain",
    "dunes in the afternoon light",
]
WINDOW = (1280, 1500)
TIMEOUT_S = 120


def demo_dataset(dest: str, num_samples: int = 48) -> None:
    rng = np.random.default_rng(3)
    with shardkit.ShardWriter(dest, max_samples=12, class_names=CLASSES) as writer:
        for i in range(num_samples):
            label = int(rng.integers(len(CLASSES)))
            side = int(rng.integers(160, 320))
            out = io.BytesIO()
            np.save(out, rng.normal(size=(16,)).astype(np.float32))
            writer.write({
                "__key__": f"photo{i:05d}",
                "jpg": jpeg_bytes(make_image(rng, label * 2 + 1, side, noise=25.0)),
                "cls": label,
                "txt": f"{CAPTIONS[label]} (no. {i})",
                "json": json.dumps({"width": side, "height": side, "source": "synthetic", "tags": [CLASSES[label]]}),
                "npy": out.getvalue(),
            })  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "show.png"))
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("screenshot_show.py: Chromium is needed (tools/install_chromium.sh installs it)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as work:
        dest = os.path.join(work, "shards")
        demo_dataset(dest)
        page = os.path.join(work, "page.html")
        html = shardkit.show(dest, samples=4, seed=1).replace(work + "/", "")  # the title names the demo folder only
        with open(page, "w", encoding="utf-8") as f:
            f.write(html)
        shot = os.path.join(work, "shot.png")
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             f"--user-data-dir={os.path.join(work, 'profile')}", "--host-resolver-rules=MAP * ~NOTFOUND",
             f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", f"file://{page}"],
            check=True, capture_output=True, timeout=TIMEOUT_S,
        )  # fmt: skip
        image = Image.open(shot).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        image.save(args.out, format="PNG", optimize=True)
    print(f"wrote {args.out} ({os.path.getsize(args.out) // 1000} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
