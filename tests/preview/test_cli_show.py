"""`shardkit show`: the page file, its exit codes and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardkit.cli import main
from tests.preview.datasets import image_dataset
from tests.preview.pages import assert_self_contained


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_writes_one_self_contained_page(tmp_path, capsys):
    dest = image_dataset(str(tmp_path / "ds"), num_samples=4)
    out = tmp_path / "page.html"
    code, printed, err = run(capsys, "show", dest, "--out", str(out), "--samples", "3", "--seed", "7")
    assert code == 0, err
    assert printed.startswith(f"wrote {out} (") and printed.rstrip().endswith("open it in a browser")
    page = out.read_text(encoding="utf-8")
    assert len(assert_self_contained(page).all("article", "card")) == 3
    assert "3 random samples shown (seed 7)" in page
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("page")] == ["page.html"]  # no temporary left


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--samples", "-1"], "--samples must be a whole number of at least 0, not '-1'"),
        (["--samples", "many"], "--samples must be a whole number of at least 0, not 'many'"),
        (["--samples", "5000"], "samples must be a whole number from 0 to 1000, not 5000"),
        (["--seed", "x"], "--seed must be a whole number of at least 0, not 'x'"),
        (["--max-image-pixels", "0"], "--max-image-pixels must be a whole number of at least 1, not '0'"),
    ],
)
def test_bad_values_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, flags, message):
    dest = image_dataset(str(tmp_path / "ds"), num_samples=2)
    out = tmp_path / "page.html"
    code, _, err = run(capsys, "show", dest, "--out", str(out), *flags)
    assert code == 2
    assert err == f"shardkit: error: {message}\n"
    assert not out.exists()


def test_out_must_name_an_html_file(tmp_path, capsys):
    dest = image_dataset(str(tmp_path / "ds"), num_samples=2)
    code, _, err = run(capsys, "show", dest, "--out", str(tmp_path / "page.png"))
    assert code == 2 and err == f"shardkit: error: --out {tmp_path / 'page.png'}: name the page FILE.html\n"


def test_a_missing_dataset_fails_and_leaves_an_earlier_page_as_it_was(tmp_path, capsys):
    out = tmp_path / "page.html"
    out.write_text("the earlier page")
    code, _, err = run(capsys, "show", str(tmp_path / "nothing"), "--out", str(out))
    assert code == 2
    assert err.startswith("shardkit: error: ") and str(tmp_path / "nothing") in err and len(err.splitlines()) == 1
    assert out.read_text() == "the earlier page"


def test_show_runs_as_a_module(tmp_path):
    dest = image_dataset(str(tmp_path / "ds"), num_samples=2)
    out = tmp_path / "page.html"
    proc = subprocess.run(
        [sys.executable, "-m", "shardkit", "show", dest, "--out", str(out), "--samples", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().count('<article class="card"') == 2


def test_serve_answers_on_loopback_with_a_link_to_the_next_samples(tmp_path):
    import re
    import urllib.error
    import urllib.request

    dest = image_dataset(str(tmp_path / "ds"), num_samples=8)
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardkit", "show", dest, "--serve", "--samples", "2", "--seed", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        found = re.fullmatch(r"serving .* at (http://127\.0\.0\.1:\d+/) \(Ctrl-C stops\)\n", line)
        assert found, line + proc.stderr.read() if proc.poll() is not None else line
        base = found.group(1)
        with urllib.request.urlopen(base, timeout=60) as answer:
            page = answer.read().decode()
            assert "default-src 'none'" in answer.headers["Content-Security-Policy"]
        assert page.count('<article class="card"') == 2 and "(seed 4)" in page
        assert '<a href="?seed=5">next samples (seed 5)</a>' in page
        with urllib.request.urlopen(base + "?seed=5", timeout=60) as answer:
            following = answer.read().decode()
        assert "(seed 5)" in following and '<a href="?seed=6">' in following
        for bad in ("other", "?seed=x", "?seed=1&seed=2", "?file=/etc/passwd"):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(base + bad, timeout=60)
            assert info.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_or_out_one_of_them(tmp_path, capsys):
    dest = image_dataset(str(tmp_path / "ds"), num_samples=2)
    code, _, err = run(capsys, "show", dest)
    assert code == 2 and err == "shardkit: error: give --out FILE.html to write the page, or --serve to serve it (one of them)\n"
