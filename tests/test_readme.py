"""Every Python code block of README.md runs against the demo data.

The blocks run in README order, each in a fresh namespace holding ``shardkit``
(the README reads as one session after ``import shardkit``) and stand-ins
for what a reader brings (``jpeg_bytes``, ``model``, ``train_step``; a block
using ``resuming`` runs twice, without and then with the checkpoint it
saved), with the working directory a temporary folder that
holds the demo: ``data/train`` (an ImageFolder of about 60 JPEGs of different
sizes, made by ``tools/gen_images.py``) and ``shards/train`` and
``shards/val`` (``shardkit write`` of it). Remote and distributed code is
adapted by the text substitutions in :data:`SUBSTITUTIONS`, each stated with
its reason; a block still holding a remote URL or a multi-process setup after
them fails the test, naming the block, so a new README block can never be
skipped silently: adapt it here. Bash blocks are not run; blocks fenced
``python ray-cluster`` need a Ray cluster and are only compiled (tests/ray/ runs
the same calls on a real one), and so are blocks fenced ``python torchrun``,
training-framework recipes that tests/read/test_frameworks.py runs on two
processes (and checks that its runs hold every line of them).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import shardkit
from shardkit.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: (old, new, why): applied to every block wherever ``old`` occurs.
SUBSTITUTIONS: tuple[tuple[str, str, str], ...] = (
    ('"https://data.example.com/train/manifest.json"', '"shards/train/manifest.json"', "no network: local manifest"),
    ('"s3://bucket/train/"', '"shards/train/"', "no object store: local folder"),
    ('s3_endpoint_url="http://minio:9000"', "s3_endpoint_url=None", "the local folder needs no S3 endpoint"),
    ('"/local/ssd/shardkit-cache"', '"cache"', "a cache folder inside the test's folder"),
    (
        'dist.init_process_group("nccl")',
        'dist.init_process_group("gloo", init_method=PROCESS_GROUP_URL, rank=0, world_size=1)',
        "one process, on CPU",
    ),
    ('write_dataset("data/train", "shards/train"', 'write_dataset("data/train", "shards/written"', "shards/train exists"),
    ("ds[123_456]", "ds[len(ds) - 1]", "the demo has fewer samples"),
    ("DistributedSampler(ds)", "DistributedSampler(ds, num_replicas=1, rank=0)", "one process, no process group"),
)

#: Patterns that must not remain in a block after the substitutions: it would
#: reach the network or wait for other processes.
UNADAPTED = (
    re.compile(r"\b(?:s3|https?|gs|gcs|az|abfs)://"),
    re.compile(r"init_process_group\((?!\"gloo\", init_method=PROCESS_GROUP_URL)"),
    re.compile(r"\btorchrun\b"),
    re.compile(r"DistributedSampler\((?![^)]*num_replicas)"),
)


class _Model:
    """Stands in for the reader's model: only ``state_dict()`` is used."""

    def state_dict(self) -> dict[str, Any]:
        return {}


def _train_step(batch: Any) -> None:
    """Stands in for a training step: checks a batch arrived."""
    assert batch is not None


def _load_tool(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"_readme_{name}", ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The fence of a block that needs a Ray cluster (```python ray-cluster): it is
#: compiled, so its syntax is checked, but not run; the Ray tests (tests/ray/)
#: run the same calls on a real cluster.
CLUSTER_FENCE = "ray-cluster"
#: The fence of a block that needs several processes under torchrun: compiled
#: here, run by tests/read/test_frameworks.py.
TORCHRUN_FENCE = "torchrun"


def python_blocks(text: str, *, cluster: bool = False) -> list[tuple[int, str]]:
    """The README's Python code blocks, each with the line its code starts on:
    those to run, or with ``cluster`` those only compiled (fenced ``python
    ray-cluster`` or ``python torchrun``)."""
    blocks = []
    for match in re.finditer(r"^```python([^\n]*)\n(.*?)^```", text, flags=re.M | re.S):
        if bool({CLUSTER_FENCE, TORCHRUN_FENCE} & set(match.group(1).split())) == cluster:
            line = text.count("\n", 0, match.start()) + 2
            blocks.append((line, match.group(2)))
    return blocks


def adapt(code: str, line: int) -> str:
    """``code`` with :data:`SUBSTITUTIONS` applied; fails if it still needs adapting."""
    for old, new, _ in SUBSTITUTIONS:
        code = code.replace(old, new)
    for pattern in UNADAPTED:
        found = pattern.search(code)
        if found is not None:
            pytest.fail(
                f"README.md block at line {line} still contains {found.group(0)!r} after the substitutions: "
                "add a substitution for it to SUBSTITUTIONS in tests/test_readme.py"
            )
    return code


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The demo data (see the module docstring), built once."""
    root = tmp_path_factory.mktemp("readme")
    gen = _load_tool("gen_images")
    gen.generate(str(root / "data" / "train"), classes=6, per_class=10, target_kb=8)
    shards = root / "shards"
    assert cli_main(["write", str(root / "data" / "train"), str(shards / "train"), "--max-samples", "16"]) == 0
    # Another dataset of the same images (another shuffle): the mixing example needs two.
    assert cli_main(["write", str(root / "data" / "train"), str(shards / "val"), "--max-samples", "16", "--seed", "1"]) == 0
    return root


def _namespace(root: Path) -> dict[str, Any]:
    sample = next((root / "data" / "train").rglob("*.jpg"))
    return {
        "__name__": "__readme__",
        "shardkit": shardkit,
        "PROCESS_GROUP_URL": f"file://{root / 'process_group'}",
        "jpeg_bytes": sample.read_bytes(),
        "model": _Model(),
        "train_step": _train_step,
    }


def _run(code: str, line: int, namespace: dict[str, Any]) -> None:
    # The block runs as a module of its own (a script's __main__): functions it
    # defines pickle by reference, so a `map` reaches forked writer processes.
    module = types.ModuleType(namespace["__name__"])
    module.__dict__.update(namespace)
    namespace = module.__dict__
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, f"README.md block at line {line}", "exec"), namespace)
    finally:
        del sys.modules[module.__name__]
        dist = namespace.get("dist")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        # Stop the block's loaders (and their workers) before the next block.
        namespace.clear()
        gc.collect()


def test_every_python_block_of_the_readme_runs(demo, monkeypatch):
    monkeypatch.chdir(demo)
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no Python blocks"
    for line, code in blocks:
        code = adapt(code, line)
        if re.search(r"\bresuming\b", code):
            # A checkpoint example: run it fresh, then resuming from what it saved.
            for resuming in (False, True):
                _run(code, line, {**_namespace(demo), "resuming": resuming})
        else:
            _run(code, line, _namespace(demo))
        (demo / "process_group").unlink(missing_ok=True)


def test_every_cluster_block_of_the_readme_compiles():
    for line, code in python_blocks(README.read_text(encoding="utf-8"), cluster=True):
        compile(code, f"README.md block at line {line}", "exec")


def test_every_substitution_still_matches_a_readme_block():
    text = README.read_text(encoding="utf-8")
    codes = [code for _, code in python_blocks(text)]
    stale = [old for old, _, _ in SUBSTITUTIONS if not any(old in code for code in codes)]
    assert not stale, f"substitutions no README block needs any more (drop them from tests/test_readme.py): {stale}"


def test_blocks_are_found_with_their_lines():
    text = "intro\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (9, "y = 2\n")]
    fenced = "```python ray-cluster\nimport ray\n```\n```python\nz = 3\n```\n"
    assert python_blocks(fenced) == [(5, "z = 3\n")]
    assert python_blocks(fenced, cluster=True) == [(2, "import ray\n")]
    with pytest.raises(pytest.fail.Exception, match="line 7 still contains 's3://'"):
        adapt('shardkit.ShardDataset("s3://other/")', 7)
    assert os.path.basename(str(README)) == "README.md"
