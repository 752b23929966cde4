"""Small source datasets on disk for writer tests."""

from __future__ import annotations

import os
import tempfile

import pytest


def make_imagefolder(root, *, classes=("cat", "dog", "eel"), per_class=8, size=3000) -> dict:
    """Write CLASS/img_N.jpg files of distinct bytes; returns {relpath: (bytes, label)}."""
    out = {}
    for label, name in enumerate(sorted(classes)):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            data = os.urandom(size + 37 * i)
            rel = f"{name}/img_{i:03d}.jpg"
            with open(os.path.join(root, rel), "wb") as f:
                f.write(data)
            out[rel] = (data, label)
    return out


@pytest.fixture
def imagefolder(tmp_path):
    root = tmp_path / "images"
    files = make_imagefolder(str(root))
    return str(root), files


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """A temporary folder of the test's own as ``TMPDIR``: a write puts nothing there."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder
