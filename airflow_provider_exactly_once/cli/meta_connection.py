"""The meta-store connection as Airflow would resolve it, read without importing Airflow.

Importing any part of Airflow initialises its configuration and settings: about 1.2 s before the
first line of ``eo-sink status`` could run, most of an operator's wait. Where the answer is certain
without Airflow, it is read here the way Airflow's server processes read it (the API server, the
scheduler, ``airflow connections get``): a secrets backend first, then ``AIRFLOW_CONN_<ID>``, then
the ``connection`` table of Airflow's database, decrypted with the Fernet key. Whatever this module
does not read exactly as Airflow does (a secrets backend, ``_cmd``/``_secret`` options, a connection
given as a URI, a value with interpolation, engine arguments, an unreadable database) makes it
answer ``None``, and the caller asks Airflow itself: slower, never different.
"""

from __future__ import annotations

import configparser
import json
import logging
import os
from pathlib import Path
from typing import Any

from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.hooks.meta_store_url import airflow_home, embedded, expand, url_of_fields

#: Airflow's own default for ``[database] sql_alchemy_conn``.
_DEFAULT_AIRFLOW_DB = "sqlite:///{home}/airflow.db"
#: Options that change how Airflow connects to its database or where its tables are: not read here.
_ENGINE_OPTIONS = ("sql_alchemy_schema", "sql_alchemy_connect_args", "sql_alchemy_engine_args")
_ROW = "SELECT host, password, extra, is_encrypted, is_extra_encrypted{team} FROM connection WHERE conn_id = :conn_id"


log = logging.getLogger(__name__)


class _AskAirflow(Exception):
    """This module cannot be sure of Airflow's answer; the reason is for the debug log."""


def resolve(meta_conn_id: str | None) -> tuple[str, str, dict[str, float]] | None:
    """``(connection id, store URL, store options)`` as Airflow would resolve them, or ``None`` when
    only Airflow can say. Errors in the connection's own fields are raised as the hook raises them."""
    try:
        config = _Config.read()
        if config.get("secrets", "backend"):
            raise _AskAirflow("a secrets backend is configured")
        conn_id = meta_conn_id or config.get("exactly_once", "meta_conn_id") or DEFAULT_META_CONN_ID
        fields = _from_environment(conn_id)
        if fields is None:
            fields = _from_airflow_db(config, conn_id)
    except _AskAirflow as reason:
        log.debug("asking Airflow for the meta-store connection: %s", reason)
        return None
    if fields is None:
        url, options = embedded(conn_id)
    else:
        url, options = url_of_fields(conn_id, fields.get("host"), fields.get("password"), fields.get("extra"))
    return conn_id, url, options


def airflow_option(section: str, key: str) -> str | None:
    """An option of Airflow's configuration as Airflow reads it (its variable, then its file; ``""``
    when unset), without importing Airflow; ``None`` when only Airflow can say (a command, a secret,
    an interpolation, a file not read here)."""
    try:
        return _Config.read().get(section, key)
    except _AskAirflow as reason:
        log.debug("asking Airflow for [%s] %s: %s", section, key, reason)
        return None


class _Config:
    """The few options read here, with Airflow's precedence: ``AIRFLOW__SECTION__KEY``, then the
    configuration file; any ``_cmd``/``_secret`` form of one of them is left to Airflow."""

    def __init__(self, parser: configparser.RawConfigParser) -> None:
        self._parser = parser

    @classmethod
    def read(cls) -> _Config:
        path = Path(expand(os.environ.get("AIRFLOW_CONFIG", str(airflow_home() / "airflow.cfg"))))
        parser = configparser.RawConfigParser(strict=False)
        try:
            parser.read(path, encoding="utf-8")
        except configparser.Error as exc:
            raise _AskAirflow(f"{path} is not read here ({type(exc).__name__})") from None
        return cls(parser)

    def get(self, section: str, key: str) -> str:
        env = f"AIRFLOW__{section.upper()}__{key.upper()}"
        if any(f"{env}{suffix}" in os.environ for suffix in ("_CMD", "_SECRET")) or any(
            self._parser.has_option(section, f"{key}{suffix}") for suffix in ("_cmd", "_secret")
        ):
            raise _AskAirflow(f"[{section}] {key} is given by a command or a secret")
        if env in os.environ:
            value = os.environ[env]
        elif self._parser.has_option(section, key):
            value = self._parser.get(section, key)
        else:
            return ""
        if "%" in value or "{" in value:
            raise _AskAirflow(f"[{section}] {key} holds an interpolation")
        return expand(value).strip()


def _from_environment(conn_id: str) -> dict[str, Any] | None:
    """``AIRFLOW_CONN_<ID>`` in Airflow's JSON form; its URI form is left to Airflow's parser."""
    raw = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if raw is None:
        return None
    if not raw.lstrip().startswith("{"):
        raise _AskAirflow(f"AIRFLOW_CONN_{conn_id.upper()} is a URI")
    try:
        fields = json.loads(raw)
    except ValueError:
        raise _AskAirflow(f"AIRFLOW_CONN_{conn_id.upper()} is not JSON") from None
    if not isinstance(fields, dict):
        raise _AskAirflow(f"AIRFLOW_CONN_{conn_id.upper()} is not a JSON object")
    return {"host": fields.get("host"), "password": fields.get("password"), "extra": _extra(fields.get("extra"))}


def _from_airflow_db(config: _Config, conn_id: str) -> dict[str, Any] | None:
    """The connection's row in Airflow's own database; ``None`` where there is none (no database
    yet, no ``connection`` table, no row), as Airflow's metastore backend finds nothing there."""
    if any(config.get("database", option) for option in _ENGINE_OPTIONS) or config.get("core", "sql_alchemy_conn"):
        raise _AskAirflow("Airflow's database is configured beyond its URL")
    url = config.get("database", "sql_alchemy_conn") or _DEFAULT_AIRFLOW_DB.format(home=airflow_home())
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not (parsed.database and Path(parsed.database).is_file()):
        return None  # Airflow was never migrated here: its metastore backend has no connection
    engine = create_engine(parsed, poolclass=NullPool)
    try:
        if parsed.get_backend_name() == "sqlite":
            with engine.connect() as connection:
                listed = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'connection'"
                if not connection.execute(text(listed)).first():
                    return None
        row = None
        # A connection of a team is not the CLI's (Airflow asks for team None); older Airflows have no teams.
        for team in (", team_name", ""):
            try:
                with engine.connect() as connection:
                    row = connection.execute(text(_ROW.format(team=team)), {"conn_id": conn_id}).first()
                break
            except Exception:
                if not team:
                    raise
    except Exception as exc:  # any failure of this read: Airflow's own backend says what it says
        raise _AskAirflow(f"Airflow's database was not read ({type(exc).__name__})") from None
    finally:
        engine.dispose()
    if row is None or (len(row) > 5 and row[5] is not None):
        return None
    host, password, extra, is_encrypted, is_extra_encrypted = row[:5]
    if is_encrypted and password:
        password = _decrypt(config, password)
    if is_extra_encrypted and extra:
        extra = _decrypt(config, extra)
    return {"host": host, "password": password, "extra": _extra(extra)}


def _decrypt(config: _Config, value: str) -> str:
    key = config.get("core", "fernet_key")
    if not key:
        raise _AskAirflow("an encrypted field and no Fernet key")
    from cryptography.fernet import Fernet, InvalidToken, MultiFernet

    try:
        return MultiFernet([Fernet(part.encode("utf-8")) for part in key.split(",")]).decrypt(value.encode()).decode()
    except (InvalidToken, ValueError):
        raise _AskAirflow("the Fernet key does not decrypt the connection") from None


def _extra(extra: Any) -> dict[str, Any]:
    if isinstance(extra, dict):
        return extra
    if not extra:
        return {}
    try:
        parsed = json.loads(extra)
    except ValueError:
        raise _AskAirflow("the connection's extra is not JSON") from None
    if not isinstance(parsed, dict):
        raise _AskAirflow("the connection's extra is not a JSON object")
    return parsed
