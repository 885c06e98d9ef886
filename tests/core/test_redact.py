"""The one masking helper: every door that shows a location or URL passes its text through it."""

from __future__ import annotations

import pytest

from airflow_provider_exactly_once.core.redact import (
    escape_controls,
    find_control,
    has_userinfo,
    mask_userinfo,
    safe_text,
)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://u:pw@host/db", "postgresql://u:***@host/db"),
        # An unencoded '@' in the password: the userinfo runs to the authority's last '@'.
        ("postgresql://u:p@ss@host:5432/db", "postgresql://u:***@host:5432/db"),
        ("postgresql+psycopg2://u:p%40ss@host/db", "postgresql+psycopg2://u:***@host/db"),
        # A secret with an unencoded '/' (S3 secret keys have them) cuts the authority short.
        ("s3://AKIA:ab/cd+ef@bucket/x", "s3://AKIA:***@bucket/x"),
        ("https://ghp_token@github.com/o/r", "https://***@github.com/o/r"),
        # No '://': a URL written as user:password@host.
        ("u:pw@host/db", "u:***@host/db"),
        ("meta store 'u:pw@host/db' is not a URL", "meta store 'u:***@host/db' is not a URL"),
        ("cannot read 's3://k:pw@b/p' and 'gs://k2:pw2@b2/p'", "cannot read 's3://k:***@b/p' and 'gs://k2:***@b2/p'"),
    ],
)
def test_userinfo_is_masked_wherever_it_stands(text: str, shown: str) -> None:
    assert mask_userinfo(text) == shown
    assert has_userinfo(text)


@pytest.mark.parametrize(
    "text",
    [
        "s3://bucket/team@example.com/out",
        "file:///data/a@b/c",
        "/data/a@b/c",
        "http://host:8080/path@x",
        "aborted by alice@example.com at 10:30",
        "sink 'orders' epoch 5: checkpoint PENDING",
    ],
)
def test_locations_without_userinfo_are_left_alone(text: str) -> None:
    assert mask_userinfo(text) == text
    assert not has_userinfo(text)


def test_control_characters_are_found_and_escaped() -> None:
    crafted = "part-\x1b]0;owned\x07-\x9b2J\r\n.parquet"
    assert find_control(crafted) == "U+001B"
    assert find_control("plain ü 日付") is None
    shown = escape_controls(crafted)
    assert shown == "part-\\x1b]0;owned\\x07-\\x9b2J\\x0d\\x0a.parquet"
    assert find_control(shown) is None
    assert safe_text("s3://k:pw@b/\x1b[2J") == "s3://k:***@b/\\x1b[2J"
