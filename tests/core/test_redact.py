"""The one masking helper: every door that shows a location or URL passes its text through it."""

from __future__ import annotations

import pytest

from airflow_provider_exactly_once.core.errors import (
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


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # A password holding a quote, a space, a backtick or '<' cuts the URL token short.
        ("postgresql://eo:ab'S@db/x", "postgresql://eo:***@db/x"),
        ('postgresql://eo:ab"S@db/x', "postgresql://eo:***@db/x"),
        ("postgresql://eo:a b@db/x", "postgresql://eo:***@db/x"),
        ("postgresql://eo:a`b@db/x", "postgresql://eo:***@db/x"),
        ("postgresql://eo:a<b>@db/x", "postgresql://eo:***@db/x"),
        ('--url "postgresql://eo:ab\'S@db/x" is wrong', '--url "postgresql://eo:***@db/x" is wrong'),
        ("eo:ab'S@db/x", "eo:***@db/x"),
        # Secrets in query strings: a REST catalog's token, Azure SAS, pre-signed S3 URLs, libpq URLs.
        (
            "catalog 'https://cat.example/v1?token=S&warehouse=wh'",
            "catalog 'https://cat.example/v1?token=***&warehouse=wh'",
        ),
        (
            "https://acct.blob.core.windows.net/c/f?sv=2024&se=2026&sig=S%2Bx",
            "https://acct.blob.core.windows.net/c/f?sv=2024&se=2026&sig=***",
        ),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F1&X-Amz-Security-Token=T&X-Amz-Signature=S",
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=***&X-Amz-Security-Token=***&X-Amz-Signature=***",
        ),
        ("postgresql://eo@db/x?sslmode=require&password=S", "postgresql://***@db/x?sslmode=require&password=***"),
        ("https://api.example/v1?access_token=S#top", "https://api.example/v1?access_token=***#top"),
        ("https://api.example/v1?api_key=S", "https://api.example/v1?api_key=***"),
        # libpq conninfo: keyword = value, quoted with ' and \-escapes where the value has a space.
        ("host=db password=S user=eo", "host=db password=*** user=eo"),
        ("host=db password = 'se cr\\'et' user=eo", "host=db password = *** user=eo"),
        ("dbname=x sslpassword=S", "dbname=x sslpassword=***"),
        ('client_secret="S p" scope=all', "client_secret=*** scope=all"),
    ],
)
def test_secrets_in_quoted_passwords_query_strings_and_conninfo_are_masked(text: str, shown: str) -> None:
    assert mask_userinfo(text) == shown
    assert has_userinfo(text)


@pytest.mark.parametrize(
    "text",
    [
        "https://cat.example/v1/config?warehouse=wh&prefix=p",
        "s3://bucket/exports/region=eu/token=abc/part-0.parquet",  # Hive-style partitions are paths
        "sink 'orders': mode='upsert' key=id order_by=ts",
        "http://localhost:8181' is down; ask alice@example.com",
        "epoch 5: expected write_id=abc, found write_id=def",
    ],
)
def test_parameters_and_pairs_that_are_no_secrets_are_left_alone(text: str) -> None:
    assert mask_userinfo(text) == text
