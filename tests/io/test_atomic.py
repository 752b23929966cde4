"""Crash-safe local files: whole or nothing, and no temporary left on failure."""

from __future__ import annotations

import os

import pytest

from shardkit.io.atomic import atomic_copy_file, atomic_write_bytes


def test_atomic_write_and_copy_leave_only_the_final_file(tmp_path):
    target = tmp_path / "manifest.json"
    atomic_write_bytes(str(target), b"{}")
    copy = tmp_path / "copy.json"
    atomic_copy_file(str(target), str(copy))
    assert copy.read_bytes() == b"{}" and sorted(os.listdir(tmp_path)) == ["copy.json", "manifest.json"]


def test_failed_copy_removes_its_temporary(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_copy_file(str(tmp_path / "missing"), str(tmp_path / "out.tar"))
    assert os.listdir(tmp_path) == []


def test_failed_write_removes_its_temporary(tmp_path):
    with pytest.raises(TypeError):
        atomic_write_bytes(str(tmp_path / "out.json"), "text, not bytes")  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []
