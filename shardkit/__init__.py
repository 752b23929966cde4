"""shardkit: tar-shard (WebDataset-format) training data.

``import shardkit`` is cheap: the writer side never imports torch. The
reader (:class:`ShardDataset` and its loader helper) is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardkit.errors import (
    CorruptShardError,
    DestinationError,
    DuplicateSampleError,
    ImageTooLargeError,
    InputFileError,
    ManifestError,
    MapError,
    MediaError,
    MediaTooLargeError,
    MemberTooLargeError,
    RemoteError,
    ShardkitError,
    SourceError,
    StateError,
    TruncatedShardError,
    UsageError,
    VerifyError,
    WorkerStartError,
)
from shardkit.format.manifest import Manifest, ShardEntry, SkippedInput, load_manifest
from shardkit.io.base import SourceOptions
from shardkit.write.writer import ShardWriter

__version__ = "0.1.0"

# Reader names, imported on first access so that `import shardkit` (and every
# writer process) does not pay for importing torch.
_LAZY = {
    "AppendReport": "shardkit.revise.append",
    "Decoder": "shardkit.read.decode",
    "IndexOptions": "shardkit.index.indexer",
    "IndexedDataset": "shardkit.read.indexed",
    "OutputOptions": "shardkit.read.options",
    "ReaderOptions": "shardkit.read.options",
    "ShardDataset": "shardkit.read.dataset",
    "ShardWindowSampler": "shardkit.read.sampler",
    "ShowOptions": "shardkit.preview.build",
    "Stream": "shardkit.read.schedule",
    "TokenBlocks": "shardkit.read.blocks",
    "TokenBudget": "shardkit.read.budget",
    "PackedSamples": "shardkit.read.packed",
    "World": "shardkit.world",
    "WriteOptions": "shardkit.write.options",
    "append": "shardkit.revise.append",
    "extend": "shardkit.revise.extend",
    "gather_states": "shardkit.read.resume.state",
    "token_counts": "shardkit.read.lengths",
    "ExtendReport": "shardkit.revise.extend",
    "view": "shardkit.revise.view",
    "ViewReport": "shardkit.revise.view",
    "index_dataset": "shardkit.index.indexer",
    "make_loader": "shardkit.read.loader",
    "watch": "shardkit.read.watch",
    "remove_samples": "shardkit.revise.remove",
    "show": "shardkit.preview.api",
    "shuffle_quality": "shardkit.read.shuffle",
    "write_dataset": "shardkit.write.parallel",
}

# Modules only the `torch` extra installs; a lazy name that misses one asks for it.
_READER_NEEDS = frozenset({"torch", "torchvision", "PIL"})

if TYPE_CHECKING:
    from shardkit.read.blocks import TokenBlocks
    from shardkit.read.budget import TokenBudget
    from shardkit.read.packed import PackedSamples
    from shardkit.read.dataset import ShardDataset
    from shardkit.read.decode import Decoder
    from shardkit.read.indexed import IndexedDataset
    from shardkit.read.loader import make_loader
    from shardkit.read.watch import watch
    from shardkit.read.options import OutputOptions, ReaderOptions
    from shardkit.read.sampler import ShardWindowSampler
    from shardkit.read.schedule import Stream
    from shardkit.preview.api import show
    from shardkit.preview.build import ShowOptions
    from shardkit.read.shuffle import shuffle_quality
    from shardkit.world import World
    from shardkit.index.indexer import IndexOptions, index_dataset
    from shardkit.write.options import WriteOptions
    from shardkit.write.parallel import write_dataset
    from shardkit.revise.append import AppendReport, append
    from shardkit.read.lengths import token_counts
    from shardkit.read.resume.state import gather_states
    from shardkit.revise.extend import ExtendReport, extend
    from shardkit.revise.remove import remove_samples
    from shardkit.revise.view import ViewReport, view


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardkit' has no attribute {name!r}")
    import importlib

    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in _READER_NEEDS:
            raise
        raise ImportError(
            f"shardkit's reader needs torch: pip install 'shardkit[torch]' "
            f"(shardkit.{name} could not import {exc.name!r})",
            name=exc.name,
        ) from exc
    if module.startswith("shardkit.read."):
        importlib.import_module("shardkit.preview.api")  # registers the reader's notebook views
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

__all__ = [
    "AppendReport",
    "CorruptShardError",
    "Decoder",
    "DestinationError",
    "DuplicateSampleError",
    "ExtendReport",
    "ImageTooLargeError",
    "IndexOptions",
    "IndexedDataset",
    "InputFileError",
    "Manifest",
    "ManifestError",
    "MapError",
    "MediaError",
    "MediaTooLargeError",
    "MemberTooLargeError",
    "OutputOptions",
    "PackedSamples",
    "ReaderOptions",
    "RemoteError",
    "ShardDataset",
    "ShardEntry",
    "ShardWindowSampler",
    "ShardWriter",
    "ShardkitError",
    "ShowOptions",
    "SkippedInput",
    "SourceError",
    "SourceOptions",
    "StateError",
    "Stream",
    "TokenBlocks",
    "TokenBudget",
    "TruncatedShardError",
    "UsageError",
    "VerifyError",
    "ViewReport",
    "WorkerStartError",
    "World",
    "WriteOptions",
    "__version__",
    "append",
    "extend",
    "gather_states",
    "index_dataset",
    "load_manifest",
    "make_loader",
    "remove_samples",
    "show",
    "shuffle_quality",
    "token_counts",
    "view",
    "watch",
    "write_dataset",
]
