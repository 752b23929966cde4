"""Every Python code block of README.md and of the pages in docs/ runs
against the demo data, and the pages hang together.

The README is the tour and docs/*.md the reference, one page per topic. Each
page's blocks run in the page's order (README first, then the pages by name,
all on one copy of the demo data, so no two pages write the same folder),
each block in a fresh namespace holding ``shardkit``
(a page reads as one session after ``import shardkit``) and stand-ins
for what a reader brings (``jpeg_bytes``, ``model``, ``train_step``; a block
using ``resuming`` runs twice, without and then with the checkpoint it
saved), with the working directory a temporary folder that
holds the demo: ``data/train`` (an ImageFolder of about 60 JPEGs of different
sizes, made by ``tools/gen_images.py``) and ``shards/train`` and
``shards/val`` (``shardkit write`` of it), and ``data/videos`` (three
short videos with captions and audio, made by ``bench/harness/media.py``)
with ``shards/videos``. Remote and distributed code is
adapted by the text substitutions in :data:`SUBSTITUTIONS`, each stated with
its reason; a block still holding a remote URL or a multi-process setup after
them fails the test, naming the block, so a new block can never be
skipped silently: adapt it here. Bash blocks are not run; blocks fenced
``python ray-cluster`` need a Ray cluster and are only compiled (tests/ray/ runs
the same calls on a real one), and so are blocks fenced ``python torchrun``,
training-framework recipes that tests/read/test_frameworks.py runs on two
processes (and checks that its runs hold every line of them).

The checks beside the runs: the README stays a tour (at most
:data:`README_MAX_LINES` lines) whose "Further topics" table links every
docs page; every relative link of the README and the pages names a file that
exists, and its ``#anchor`` a heading there; and no page restates an options
class or ``shardkit write --help``: a paragraph naming more than
:data:`MAX_RESTATED` of one class's fields, or of the command's flags, is a
copy of what its docstring or ``--help`` says, and should link it instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import importlib.util
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import shardkit
from bench.harness.media import make_audio, make_video
from shardkit.cli import main as cli_main
from shardkit.write.download import DownloadOptions

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: The README and every docs page, in the order their blocks run.
PAGES: tuple[Path, ...] = (README, *sorted(DOCS.glob("*.md")))
#: The README is the tour: past this, reference has crept back in.
README_MAX_LINES = 350
#: More fields of one options class (or flags of ``shardkit write``) in one
#: paragraph than this, and the paragraph restates the docstring (``--help``).
MAX_RESTATED = 8

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
    """A page's Python code blocks, each with the line its code starts on:
    those to run, or with ``cluster`` those only compiled (fenced ``python
    ray-cluster`` or ``python torchrun``)."""
    blocks = []
    for match in re.finditer(r"^```python([^\n]*)\n(.*?)^```", text, flags=re.M | re.S):
        if bool({CLUSTER_FENCE, TORCHRUN_FENCE} & set(match.group(1).split())) == cluster:
            line = text.count("\n", 0, match.start()) + 2
            blocks.append((line, match.group(2)))
    return blocks


def adapt(code: str, line: int, page: str = "README.md") -> str:
    """``code`` with :data:`SUBSTITUTIONS` applied; fails if it still needs adapting."""
    for old, new, _ in SUBSTITUTIONS:
        code = code.replace(old, new)
    for pattern in UNADAPTED:
        found = pattern.search(code)
        if found is not None:
            pytest.fail(
                f"{page} block at line {line} still contains {found.group(0)!r} after the substitutions: "
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
    # Videos with captions, for the video examples.
    videos = root / "data" / "videos"
    videos.mkdir(parents=True)
    for i in range(3):
        (videos / f"clip{i}.mp4").write_bytes(make_video(seconds=3, width=128, height=96, gop=15, seed=i))
        (videos / f"clip{i}.txt").write_text(f"a test video, number {i}")
        (videos / f"clip{i}.flac").write_bytes(make_audio(seconds=3, rate=16000, format="FLAC"))
    assert cli_main(["write", str(videos), str(shards / "videos")]) == 0
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


def _run(code: str, where: str, namespace: dict[str, Any]) -> None:
    # The block runs as a module of its own (a script's __main__): functions it
    # defines pickle by reference, so a `map` reaches forked writer processes.
    module = types.ModuleType(namespace["__name__"])
    module.__dict__.update(namespace)
    namespace = module.__dict__
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, where, "exec"), namespace)
    finally:
        del sys.modules[module.__name__]
        dist = namespace.get("dist")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        # Stop the block's loaders (and their workers) before the next block.
        namespace.clear()
        gc.collect()


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_every_python_block_of_every_page_runs(demo, monkeypatch):
    """The README's blocks, then each docs page's, on one copy of the demo."""
    monkeypatch.chdir(demo)
    for page in PAGES:
        for line, code in python_blocks(page.read_text(encoding="utf-8")):
            code = adapt(code, line, _name(page))
            where = f"{_name(page)} block at line {line}"
            if re.search(r"\bresuming\b", code):
                # A checkpoint example: run it fresh, then resuming from what it saved.
                for resuming in (False, True):
                    _run(code, where, {**_namespace(demo), "resuming": resuming})
            else:
                _run(code, where, _namespace(demo))
            (demo / "process_group").unlink(missing_ok=True)


def test_every_cluster_block_compiles():
    for page in PAGES:
        for line, code in python_blocks(page.read_text(encoding="utf-8"), cluster=True):
            compile(code, f"{_name(page)} block at line {line}", "exec")


def test_every_substitution_still_matches_a_block():
    codes = [code for page in PAGES for _, code in python_blocks(page.read_text(encoding="utf-8"))]
    stale = [old for old, _, _ in SUBSTITUTIONS if not any(old in code for code in codes)]
    assert not stale, f"substitutions no block needs any more (drop them from tests/test_readme.py): {stale}"


def test_the_readme_is_a_tour():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: it is the tour; "
        "move reference detail to the docs/ page of its topic"
    )


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (their lines left blank, so
    line numbers stay)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)


#: A Markdown link's target: ``[text](target)``.
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """The targets of the links in ``text``'s prose (not in its code)."""
    return LINK.findall(_prose(text))


def anchors(text: str) -> set[str]:
    """The ``#anchor`` of each heading of ``text``, as GitHub makes it."""
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", _prose(text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        found.add(slug)
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file, or heading, is missing."""
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https://, mailto: ...: not checked offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no file {_shown(file)})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            broken.append(f"{target} (no heading #{anchor} in {_shown(file)})")
    return broken


def test_every_relative_link_resolves():
    broken = {_name(page): broken_links(page) for page in PAGES}
    broken = {name: targets for name, targets in broken.items() if targets}
    assert not broken, f"links to missing files or headings: {broken}"


def topics_table(text: str) -> list[str]:
    """The link targets of the table under the README's "Further topics"."""
    section = re.search(r"^## Further topics\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert section is not None, 'README.md has no "## Further topics" section'
    rows = [line for line in section.group(1).splitlines() if line.startswith("|")]
    return [target for row in rows for target in LINK.findall(row.split("|")[1])]


def test_the_readme_topics_table_links_every_docs_page():
    listed = {target for target in topics_table(README.read_text(encoding="utf-8")) if target.startswith("docs/")}
    pages = {_name(page) for page in PAGES if page != README}
    assert pages, "docs/ has no pages"
    assert not pages - listed, f"docs pages the README's Further topics table does not link: {sorted(pages - listed)}"
    assert not listed - pages, f"the Further topics table links pages that do not exist: {sorted(listed - pages)}"


def write_help() -> str:
    """What ``shardkit write --help`` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli_main(["write", "--help"])
    return out.getvalue()


def _options_classes() -> dict[str, set[str]]:
    """Each options class's field names, and ``shardkit write``'s flags."""
    classes = (
        shardkit.WriteOptions,
        shardkit.SourceOptions,
        shardkit.ReaderOptions,
        shardkit.OutputOptions,
        shardkit.IndexOptions,
        DownloadOptions,
    )
    names = {cls.__name__: {field.name for field in dataclasses.fields(cls) if field.init} for cls in classes}
    names["shardkit write --help"] = set(re.findall(r"--[a-z][\w-]*", write_help())) - {"--help"}
    return names


def restatements(text: str, names: dict[str, set[str]]) -> list[str]:
    """Paragraphs of ``text`` that name more than :data:`MAX_RESTATED` of one
    options class's fields (as code: `` `part_bytes` ``, `` `part_bytes=...` ``)
    or of ``shardkit write``'s flags; each item of a list counts as a paragraph."""
    found = []
    for paragraph in re.split(r"\n\s*\n|\n(?=- )", _prose(text)):  # a list item is a paragraph
        spans = re.findall(r"`([^`]+)`", paragraph)
        words = {m for span in spans for m in re.findall(r"--?[\w-]+|\b\w+(?==)|^\w+$", span.strip())}
        for owner, fields in names.items():
            named = words & fields
            if len(named) > MAX_RESTATED:
                found.append(f"{owner}: {sorted(named)} in {paragraph.strip()[:60]!r}...")
    return found


def test_no_page_restates_an_options_docstring_or_the_help():
    """Options are documented once, in their dataclass's docstring and in
    ``--help``; a page says what they add up to and links them."""
    names = _options_classes()
    found = {_name(page): restatements(page.read_text(encoding="utf-8"), names) for page in PAGES}
    found = {name: paragraphs for name, paragraphs in found.items() if paragraphs}
    assert not found, f"paragraphs restating an options docstring or --help (link it instead): {found}"


def test_blocks_are_found_with_their_lines():
    text = "intro\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (9, "y = 2\n")]
    fenced = "```python ray-cluster\nimport ray\n```\n```python\nz = 3\n```\n"
    assert python_blocks(fenced) == [(5, "z = 3\n")]
    assert python_blocks(fenced, cluster=True) == [(2, "import ray\n")]
    with pytest.raises(pytest.fail.Exception, match="line 7 still contains 's3://'"):
        adapt('shardkit.ShardDataset("s3://other/")', 7)
    assert os.path.basename(str(README)) == "README.md"


def test_the_page_checks_find_what_they_look_for(tmp_path):
    text = "# Top\n## Hugging Face `datasets` and the Hub\n## torchdata's `StatefulDataLoader`\n```python\n## not a heading\n```\n"
    assert anchors(text) == {"top", "hugging-face-datasets-and-the-hub", "torchdatas-statefuldataloader"}
    page = tmp_path / "page.md"
    page.write_text(
        text + "[ok](#top) [ok](page.md#torchdatas-statefuldataloader) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [no heading](#not-here)\n```\n[in code](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        f"missing.md (no file {tmp_path / 'missing.md'})",
        f"#not-here (no heading #not-here in {page})",
    ]
    names = {"SourceOptions": {f"f{i}" for i in range(20)}}
    listed = ", ".join(f"`f{i}`" for i in range(MAX_RESTATED + 1))
    assert restatements(f"The knobs: {listed}.\n", names)
    assert not restatements(f"The knobs: {listed.rsplit(', ', 1)[0]}.\n", names)
    assert not restatements(f"- {listed.rsplit(', ', 1)[0]}\n- `f19`\n", names)  # list items count apart
    assert topics_table("## Further topics\n\n| Page | What |\n|---|---|\n| [A](docs/a.md) | b [c](x.md) |\n") == ["docs/a.md"]
