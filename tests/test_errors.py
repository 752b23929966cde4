"""Every shardkit error survives a pickle round trip with its message and attributes."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys

import pytest

import shardkit.errors as errors

# One instance of every class, with every attribute it carries set.
EXAMPLES = {
    errors.ShardkitError: (("something failed",), {}),
    errors.UsageError: (("max_bytes: not a size: 'lots'",), {}),
    errors.SourceError: (("rows.jsonl: line 3 is not JSON",), {"path": "rows.jsonl", "line": 3}),
    errors.DuplicateSampleError: (("two inputs for a1.jpg",), {"first": "x/a1.jpg", "second": "y/a1.jpg"}),
    errors.MapError: (
        ("map prep:tok failed on item 13 ('a.jpg'): ValueError: empty",),
        {"path": "items#row=13", "reason": "map_error", "frames": "  File \"prep.py\", line 3, in tok\n"},
    ),
    errors.InputFileError: (("gone.jpg: cannot read input file",), {"path": "gone.jpg", "line": None}),
    errors.DestinationError: (("out: destination is not empty",), {"path": "out"}),
    errors.ManifestError: (("out/manifest.json: malformed",), {"path": "out/manifest.json"}),
    errors.CorruptShardError: (("bad header",), {"path": "s.tar", "member": "k9.jpg", "offset": 4096}),
    errors.TruncatedShardError: (("ends early",), {"path": "s.tar", "member": "k9.jpg", "offset": 512}),
    errors.MemberTooLargeError: (
        ("s.tar: member 'k1.txt.gz': decompresses to more than 10 bytes",),
        {"path": "s.tar", "member": "k1.txt.gz", "offset": None, "limit": 10, "option": "max_member_bytes",
         "amount": 11, "what": "decompresses to more than 10 bytes"},
    ),
    errors.ImageTooLargeError: (
        ("s.tar: member 'k1.png': 400 pixels",),
        {"path": "s.tar", "member": "k1.png", "offset": None, "limit": 100, "option": "max_image_pixels",
         "amount": 400, "what": "400 pixels"},
    ),
    errors.MediaTooLargeError: (
        ("s.tar: member 'k1.mp4': a clip needs more than 60 frames decoded",),
        {"path": "s.tar", "member": "k1.mp4", "offset": None, "limit": 60, "option": "max_decoded_frames",
         "amount": 61, "what": "a clip needs more than 60 frames decoded"},
    ),
    errors.MediaError: (("s.tar: member 'k1.mp4': no video stream",), {"path": "s.tar", "member": "k1.mp4", "what": "no video stream"}),
    errors.VerifyError: (("s.tar: sha256 mismatch",), {"path": "s.tar"}),
    errors.MissingShardError: (("s.tar: shard missing",), {"path": "s.tar"}),
    errors.StateError: (("state from another dataset",), {}),
    errors.WorkerStartError: (("DataLoader worker 1 (pid 4242) never started",), {}),
    errors.RemoteError: (
        ("https://h/x.tar: 503",),
        {"url": "https://h/x.tar", "offset": 10, "status": 503, "retryable": True},
    ),
}


def _all_error_classes() -> list[type]:
    return [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, errors.ShardkitError) and obj.__module__ == errors.__name__
    ]


def test_every_error_class_has_an_example():
    assert set(_all_error_classes()) == set(EXAMPLES)


@pytest.mark.parametrize("cls", sorted(EXAMPLES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_error_survives_pickle_with_message_and_attributes(cls):
    args, attributes = EXAMPLES[cls]
    error = cls(*args, **attributes)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error) == args[0]
    assert copy.args == error.args
    for name, value in attributes.items():
        assert getattr(copy, name) == value, name


def test_error_unpickles_in_another_process():
    error = errors.VerifyError("s.tar: sha256 mismatch", path="s.tar")
    code = (
        "import pickle, sys\n"
        "e = pickle.loads(sys.stdin.buffer.read())\n"
        "print(type(e).__name__, e.path, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(error), capture_output=True, check=True)
    assert out.stdout.decode().strip() == "VerifyError s.tar s.tar: sha256 mismatch"
