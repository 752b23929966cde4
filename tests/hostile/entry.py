"""Child process for the hostile-data tests: run one shardkit entry point on
one dataset under a memory cap, and print what came of it as one JSON line.

Run as ``python -m tests.hostile.entry ENTRY TARGET [--on-error raise|skip]
[--mem-mb N] [--options JSON]`` (options are the dataset's keyword
arguments, plus ``fused``, see :data:`FUSED`). ENTRY is one of :data:`ENTRIES`. In the
options, ``source_options`` (a mapping) becomes a ``SourceOptions`` and
``allow_prefix`` (a list) becomes ``verify --allow-prefix`` arguments. The address
space is capped at what the interpreter holds after its imports plus
``--mem-mb``, so a read that allocates what a hostile header claims dies
here (as a ``MemoryError`` the report names), not in the test runner.

The report: ``outcome`` (``"ok"``, ``"error"``: a shardkit error, or
``"foreign"``: any other exception), ``error_type``, ``message``,
``samples`` (``[key, sorted field names, crc32 of the fields' bytes in
order]`` for every sample yielded), ``skipped`` and ``peak_rss_mb``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import sys
import zlib

ENTRIES = ("stream", "loader", "indexed", "verify", "write", "info")
#: The entries that read through torch (ShardDataset, a DataLoader, IndexedDataset).
READERS = ("stream", "loader", "indexed")


def _digest(sample: dict) -> list:
    fields = sorted(k for k in sample if not k.startswith("__"))
    crc = 0
    for name in fields:
        value = sample[name]
        crc = zlib.crc32(value if isinstance(value, bytes) else repr(value).encode(), crc)
    return [sample["__key__"], fields, crc]


def _cap_memory(extra_mb: int) -> None:
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    limit = vm * 1024 + extra_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


#: ``--options {"fused": NAME}``: read images (or media) as bytes and decode
#: them with a transform of :mod:`shardkit.transforms` on one field.
FUSED = ("random_resized_crop", "resize_center_crop", "video_clip", "audio_clip")


def _fused(options: dict) -> dict:
    name = options.pop("fused", None)
    if name is None:
        return options
    import shardkit
    from shardkit import transforms

    field, transform = {
        "random_resized_crop": ("png", lambda: transforms.DecodeRandomResizedCrop(32)),
        "resize_center_crop": ("png", lambda: transforms.DecodeResizeCenterCrop(32)),
        "video_clip": ("mp4", lambda: transforms.DecodeVideoClip(4, fps=2, size=32)),
        "audio_clip": ("flac", lambda: transforms.DecodeAudioClip(0.5)),
    }[name]
    return {**options, "decode": shardkit.Decoder(image=None), "map": transforms.MapField(field, transform())}


def run(entry: str, target: str, *, on_error: str, options: dict) -> dict:
    import shardkit
    from shardkit.cli import main as cli_main

    options = _fused(options)
    report: dict = {"samples": [], "skipped": 0}
    extra_argv = [arg for prefix in options.pop("allow_prefix", []) for arg in ("--allow-prefix", prefix)]
    if "source_options" in options:  # JSON cannot carry the dataclass: build it here
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in options["source_options"].items()}
        options["source_options"] = shardkit.SourceOptions(**fields)
    if entry in ("stream", "loader"):
        ds = shardkit.ShardDataset(target, mode="exact", shuffle=False, on_error=on_error, **options)
        if entry == "stream":
            items = iter(ds)
        else:
            from torch.utils.data import DataLoader

            items = iter(DataLoader(ds, batch_size=None, num_workers=2))
        for sample in items:
            report["samples"].append(_digest(sample))
        report["skipped"] = ds.num_skipped
    elif entry == "indexed":
        ds = shardkit.IndexedDataset(target, on_error=on_error, **options)
        for i in range(len(ds)):
            sample = ds[i]
            if sample is not None:
                sample.pop("__index__")
                report["samples"].append(_digest(sample))
        report["skipped"] = ds.num_skipped
    else:
        argv = {"verify": ["verify", target, "-q", *extra_argv], "info": ["info", target, "--shards"]}.get(entry)
        if entry == "write":
            argv = ["write", target, options.pop("dest"), "-q", "--workers", "1", "--on-error", on_error]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            report["exit_code"] = cli_main(argv)
        report["stdout"], report["stderr"] = out.getvalue(), err.getvalue()
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("entry", choices=ENTRIES)
    parser.add_argument("target")
    parser.add_argument("--on-error", default="raise", choices=("raise", "skip"))
    parser.add_argument("--mem-mb", type=int, default=1024)
    parser.add_argument("--options", default="{}")
    args = parser.parse_args(argv)
    import shardkit  # noqa: F401  (imports count in the baseline, not in the cap)

    if args.entry in READERS:  # the writer, verify and info run without torch (as users run them)
        import torch  # noqa: F401

    _cap_memory(args.mem_mb)
    try:
        report = run(args.entry, args.target, on_error=args.on_error, options=json.loads(args.options))
        report["outcome"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - the report says what it was
        from shardkit.errors import ShardkitError

        report = {"samples": [], "skipped": 0}
        report["outcome"] = "error" if isinstance(exc, ShardkitError) else "foreign"
        report["error_type"] = type(exc).__name__
        report["message"] = str(exc)
    report["peak_rss_mb"] = _peak_rss_mb()
    sys.stdout.write("\n" + json.dumps(report) + "\n")


def run_forked(argv: list[str], output: str) -> None:
    """:func:`main` on ``argv`` in a child forked from a server that has
    imported torch and shardkit already (the readers' children: starting an
    interpreter and importing torch takes seconds a case). Everything the
    child prints, at the file-descriptor level, goes to ``output``."""
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    main(argv)
    sys.stdout.flush()


def _peak_rss_mb() -> float:
    """The peak resident set of this process (VmHWM) or of any DataLoader
    worker it forked. Not ``ru_maxrss`` of this process: Linux carries the
    parent's high-water mark over fork + exec, so it would report pytest's."""
    with open("/proc/self/status") as f:
        own_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return max(own_kb, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


if __name__ == "__main__":
    main()
