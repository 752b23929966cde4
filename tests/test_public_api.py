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


def test_reader_without_torch_names_the_extra():
    # As on a writer-only install: torch cannot be imported at all.
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import shardkit\n"
        "assert shardkit.write_dataset and shardkit.World\n"
        "for name in ('ShardDataset', 'make_loader'):\n"
        "    try:\n"
        "        getattr(shardkit, name)\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    lines = out.splitlines()
    assert len(lines) == 2
    for name, line in zip(("ShardDataset", "make_loader"), lines, strict=True):
        assert line.startswith("shardkit's reader needs torch: pip install 'shardkit[torch]'"), line
        assert f"shardkit.{name} could not import 'torch" in line
