"""The one config loader: YAML and mappings into frozen options dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shardkit.config import load_options, parse_size
from shardkit.errors import UsageError
from shardkit.io.base import SourceOptions
from shardkit.write.parallel import WriteOptions


@dataclass(frozen=True)
class _Knobs:
    cache_max_bytes: int | None = None
    timeout_s: float = 1.0
    name: str = "x"
    enabled: bool = True


def test_yaml_section_loads_into_write_options_with_sizes(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("write:\n  max_bytes: 1MiB\n  max_samples: 7\n  shuffle: false\n")
    options = load_options(WriteOptions, config, section="write")
    assert options == WriteOptions(max_bytes=1 << 20, max_samples=7, shuffle=False)


def test_unknown_key_is_refused_by_name_with_the_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("max_sample: 3\n")
    with pytest.raises(UsageError, match="max_sample") as info:
        load_options(WriteOptions, config, section="write")
    assert str(config) in str(info.value)


def test_a_key_spelled_as_its_flag_is_refused_naming_the_option_it_stands_for(tmp_path, capsys):
    from shardkit.cli import main

    config = tmp_path / "c.yaml"
    config.write_text("field: [jpg=url]\nkey: url\nconnect-timeout: 3\nmax_sample: 3\n")
    assert main(["write", str(tmp_path / "rows.csv"), str(tmp_path / "out"), "--config", str(config), "-q"]) == 2
    err = capsys.readouterr().err
    for key, option in [("field", "fields"), ("key", "key_column"), ("connect-timeout", "connect_timeout_s"),
                        ("max_sample", "max_samples")]:
        assert f"{key} (did you mean {option}?)" in err
    assert not (tmp_path / "out").exists()


def test_bad_value_names_file_and_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("cache_max_bytes: lots\n")
    with pytest.raises(UsageError) as info:
        load_options(_Knobs, config)
    assert f"{config}: cache_max_bytes" in str(info.value) and "lots" in str(info.value)


def test_overrides_win_and_none_means_not_given():
    options = load_options(
        _Knobs, {"timeout_s": 2, "name": "a"}, overrides={"timeout_s": "3.5", "name": None, "enabled": "false"}
    )
    assert options == _Knobs(timeout_s=3.5, name="a", enabled=False)


def test_override_errors_use_the_flag_name():
    with pytest.raises(UsageError, match="--max-samples.*1.5"):
        load_options(WriteOptions, None, overrides={"max_samples": "1.5"}, override_names={"max_samples": "--max-samples"})


def test_class_validation_errors_name_the_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("write:\n  on_error: ignore\n")
    with pytest.raises(UsageError, match=f"{config}: on_error.*ignore"):
        load_options(WriteOptions, config, section="write")


@pytest.mark.parametrize(("text", "expected"), [("4096", 4096), ("512MB", 512 * 10**6), ("1GiB", 1 << 30), ("1.5 kb", 1500)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["0", "-5MB", "lots", "3 parsecs"])
def test_parse_size_refuses_nonsense(text):
    with pytest.raises(UsageError, match="size"):
        parse_size(text)


@dataclass(frozen=True)
class _Reader:
    read_ahead_bytes: int = 1
    source: SourceOptions = SourceOptions()


def test_nested_options_and_literals_load_from_one_mapping():
    options = load_options(_Reader, {"read_ahead_bytes": "1KiB", "source": {"device_lock": "auto", "cache_max_bytes": "2MB"}})
    assert options == _Reader(read_ahead_bytes=1024, source=SourceOptions(device_lock="auto", cache_max_bytes=2_000_000))
    assert load_options(SourceOptions, {"device_lock": False}).device_lock is False
    with pytest.raises(UsageError, match=r"source: unknown option\(s\) cache_size"):
        load_options(_Reader, {"source": {"cache_size": 3}})
