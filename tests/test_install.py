"""A writer-only install: `pip install shardkit` without the torch extra.

A fresh virtual environment gets the package from a copy of this checkout
(no extras), then its `shardkit` command packs the demo images
(tools/gen_images.py), verifies the shards and reads the manifest, all
without torch being importable there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUM_CLASSES = 4
PER_CLASS = 10


def _run(argv: list[str | Path], *, cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_NO_INPUT"] = "1"
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def _check(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"{' '.join(result.args)} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result


def _copy_sources(dest: Path) -> Path:
    """The files a build needs, copied so that building leaves the checkout untouched."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "shardkit", dest / "shardkit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _install_without_torch(tmp_path: Path) -> Path:
    """A new venv holding shardkit's core install; returns its bin/ folder."""
    venv = tmp_path / "venv"
    _check(_run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path))
    python = venv / "bin" / "python"
    # This interpreter's pip installs into the new venv (pip's --python), which
    # saves bootstrapping a pip there; pip's usual cache keeps the core wheels.
    source = _copy_sources(tmp_path / "src")
    _check(_run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", source], cwd=tmp_path, timeout_s=300))
    return venv / "bin"


def test_writer_installs_and_runs_without_torch(tmp_path: Path) -> None:
    bin_dir = _install_without_torch(tmp_path)
    python = bin_dir / "python"

    # The install is the core one: no torch, and shardkit comes from the venv.
    probe = _run([python, "-c", "import torch"], cwd=tmp_path)
    assert probe.returncode != 0
    assert "No module named 'torch'" in probe.stderr
    where = _check(_run([python, "-c", "import shardkit; print(shardkit.__file__)"], cwd=tmp_path))
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv")

    images = tmp_path / "images"
    _check(_run(
        [sys.executable, ROOT / "tools" / "gen_images.py", images,
         "--classes", NUM_CLASSES, "--per-class", PER_CLASS, "--target-kb", "4"],
        cwd=tmp_path,
    ))
    shards = tmp_path / "shards"
    shardkit = bin_dir / "shardkit"
    _check(_run([shardkit, "write", images, shards, "--max-samples", "16", "--workers", "2", "--quiet"], cwd=tmp_path))

    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["num_samples"] == NUM_CLASSES * PER_CLASS
    assert manifest["num_shards"] == 3  # 40 samples, at most 16 per shard

    verified = _check(_run([shardkit, "verify", shards], cwd=tmp_path))
    assert verified.stdout.startswith(f"OK: 3 shards, {NUM_CLASSES * PER_CLASS} samples")
    _check(_run([shardkit, "info", shards], cwd=tmp_path))

    # The reader is the part that needs the extra, and it says so by name.
    reader = _run([python, "-c", "import shardkit; shardkit.ShardDataset"], cwd=tmp_path)
    assert reader.returncode != 0
    assert "ImportError: shardkit's reader needs torch: pip install 'shardkit[torch]'" in reader.stderr
