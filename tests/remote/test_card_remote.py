"""The dataset card on an object store (moto's S3): written beside the
manifest, and a README.md already there is kept."""

from __future__ import annotations

from shardkit.cli import main
from shardkit.write.publish import CARD_MARKER, CARD_NAME


def test_s3_write_publishes_a_card_and_keeps_a_readme_already_there(make_shards, s3_bucket, capsys):
    client, bucket = s3_bucket
    local = make_shards((3, 4), name="src")
    assert main(["write", local.location, f"s3://{bucket}/ds", "--max-samples", "4"]) == 0, capsys.readouterr().err
    card = client.get_object(Bucket=bucket, Key=f"ds/{CARD_NAME}")["Body"].read().decode()
    assert CARD_MARKER in card and '- "shard-*.tar"' in card

    client.put_object(Bucket=bucket, Key=f"mine/{CARD_NAME}", Body=b"my own card")
    assert main(["write", local.location, f"s3://{bucket}/mine"]) == 0, capsys.readouterr().err
    assert client.get_object(Bucket=bucket, Key=f"mine/{CARD_NAME}")["Body"].read() == b"my own card"
