"""The public surface: one sorted __all__, and a torch-free writer import."""

from __future__ import annotations

import subprocess
import sys

import shardkit


def test_all_is_sorted_and_every_name_resolves():
    assert list(shardkit.__all__) == sorted(shardkit.__all__)
    for name in shardkit.__all__:
        assert getattr(shardkit, name) is not None, name


def test_errors_also_inherit_builtins():
    assert issubclass(shardkit.UsageError, ValueError)
    assert issubclass(shardkit.InputFileError, OSError)
    assert issubclass(shardkit.DestinationError, FileExistsError)
    assert issubclass(shardkit.CorruptShardError, shardkit.ShardkitError)


def test_writer_path_does_not_import_torch(tmp_path):
    code = (
        "import sys, shardkit, shardkit.cli\n"
        "from shardkit.write.parallel import write_dataset\n"
        "from shardkit.verify import verify_dataset\n"
        "assert 'torch' not in sys.modules, 'writer imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
