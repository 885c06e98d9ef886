"""Making stored and reported text safe to show: secrets masked, terminal controls escaped.

Locations (sink roots, write locations, checkpoint paths, catalog and meta-store URLs) reach people
through many doors: the UI's pages and API, ``eo-sink``'s tables, JSON and messages, exception texts
that quote a path, log lines. A secret written into one of them (``s3://key:secret@bucket``,
``postgresql://user:secret@host/db``, a REST catalog's ``?token=...``, a pre-signed URL's
``X-Amz-Signature``, libpq's ``password=...``) would leak through every door at once, so each door
passes its text through ``mask_userinfo`` here, the one place that knows what a secret looks like.

Text read back from the meta store (error messages, abort reasons, file paths) can carry terminal
escape sequences; printed raw, a crafted one retitles or clears an operator's terminal.
``escape_controls`` makes them visible instead, and ``find_control`` lets the places where such
text enters refuse it.

Neither Airflow nor anything else outside the standard library is imported: every layer uses this.
"""

from __future__ import annotations

import re

#: What replaces a secret.
MASK = "***"

#: Parts of a catalog or FileIO property name that mark its value as a secret (``s3.secret-access-key``,
#: ``s3.session-token``, the REST ``credential``...): masked wherever such a value could be quoted.
SECRET_PROPERTY_MARKS = ("secret", "token", "password", "credential")
#: What may not stand in a templated field at all, shown as it is once rendered: the secrets, and the
#: key ids and account keys that are half of a credential (``s3.access-key-id``, ``adls.account-key``).
CREDENTIAL_PROPERTY_MARKS = (*SECRET_PROPERTY_MARKS, "account-key", "access-key", "private-key")
#: Parts of the name of a ``name=value`` pair, anywhere in a text, that mark its value as a secret:
#: libpq's ``password=`` and ``sslpassword=``, ODBC's ``PWD=``, ``client_secret=``, ``access_token=``.
#: Names are compared in lower case with ``_`` and ``.`` read as ``-``. ``key`` alone is not one here:
#: free text says ``key=id`` of an upsert sink's key.
SECRET_NAME_MARKS = (*CREDENTIAL_PROPERTY_MARKS, "passwd", "pwd")
#: The same for a URL's query parameters (after ``?``, ``&`` or ``;``), where more names are secrets:
#: the signatures and credentials of pre-signed URLs (Azure SAS ``sig``, ``X-Amz-Signature``,
#: ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``X-Goog-Signature``), every ``...key...``
#: (``api_key``, ``apikey``, ``key``) and ``auth``. Masking a harmless parameter of a similar name
#: costs a value nobody needed; missing a secret one cannot be undone.
SECRET_PARAMETER_MARKS = (*SECRET_NAME_MARKS, "sig", "key", "auth")

#: C0 controls (incl. TAB, LF, CR, ESC, BEL), DEL, and the C1 controls (U+0080..U+009F, e.g. CSI).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

#: ``scheme://`` followed by the rest of the token (a URL ends at whitespace or a quote).
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<rest>[^\s'\"<>`]*)")
#: ``user:secret@`` with no scheme in front (``user:pw@host/db``, a URL written without ``//``).
_BARE_USERINFO = re.compile(r"(?<![\w.+\-/:@])(?P<user>[\w.+\-%]+):(?!/)(?P<secret>[^\s@/]*(?:/[^\s@/]*)*)@")
#: ``name=value``: a query parameter (after ``?``, ``&``, ``;``) or a keyword of a connection string
#: (libpq's ``password='it''s'``, quoted with ``'`` and ``\\``-escapes, or ``"``); not a path segment.
_ASSIGNMENT = re.compile(
    r"(?<![\w.\-/])(?P<name>[A-Za-z][\w.\-]*)(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*(?:'|$)|\"(?:[^\"\\]|\\.)*(?:\"|$)|[^\s'\"&;#<>`]*)"
)


def _masked_userinfo(userinfo: str) -> str:
    """``user:secret`` becomes ``user:***``; a lone user (often a token) becomes ``***``."""
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}" if colon and user else MASK


def _split_userinfo(rest: str) -> tuple[str, str] | None:
    """``(userinfo, remainder)`` of what follows ``scheme://``, or ``None`` when it has none.

    The authority ends at the first ``/``, ``?`` or ``#``, and its userinfo at its *last* ``@`` (a
    password may hold an unencoded ``@``). A secret that holds an unencoded ``/`` (S3 secret keys
    do) cuts that authority short, so when the text before the first ``/`` looks like
    ``user:secret`` rather than ``host:port``, the userinfo runs to the next ``@``.
    """
    if not rest or rest[0] in "/?#":
        return None
    end = len(rest)
    for stop in "/?#":
        found = rest.find(stop)
        if found != -1:
            end = min(end, found)
    authority = rest[:end]
    at = authority.rfind("@")
    if at != -1:
        return authority[:at], rest[at + 1 :]
    _, colon, secret = authority.partition(":")
    if colon and not secret.isdigit():
        at = rest.find("@", end)
        if at != -1:
            return rest[:at], rest[at + 1 :]
    return None


def _cut_userinfo(text: str, match: re.Match[str]) -> int | None:
    """Where the userinfo of a URL cut short by a quote, a space, a backtick or ``<`` ends (its ``@``).

    A URL ends at such a character, but an unencoded password may hold one (``eo:ab'S@db``): when
    the URL's authority so far reads ``user:secret`` without an ``@``, the userinfo runs to the next
    ``@`` on the line. A ``host:port`` (all digits) followed by a later sentence is left alone unless
    nothing but non-blank characters stand between it and the ``@``.
    """
    rest = match.group("rest")
    user, colon, secret = re.split(r"[/?#]", rest, maxsplit=1)[0].partition(":")
    if not colon or not user or user.startswith("[") or "@" in rest or match.end() >= len(text):
        return None
    line_end = text.find("\n", match.end())
    at = text.find("@", match.end(), len(text) if line_end == -1 else line_end)
    if at == -1 or (secret.isdigit() and any(c.isspace() for c in text[match.end() : at])):
        return None
    return at


def _mask_urls(text: str) -> str:
    shown: list[str] = []
    done = 0
    for match in _URL.finditer(text):
        if match.start() < done:  # inside the userinfo of a URL already masked
            continue
        scheme, rest = match.group("scheme"), match.group("rest")
        shown.append(text[done : match.start()])
        split = _split_userinfo(rest)
        if split is not None:
            userinfo, remainder = split
            shown.append(f"{scheme}{_masked_userinfo(userinfo)}@{remainder}")
            done = match.end()
        elif (at := _cut_userinfo(text, match)) is not None:
            shown.append(f"{scheme}{_masked_userinfo(text[match.start('rest') : at])}@")
            done = at + 1
        else:
            shown.append(match.group(0))
            done = match.end()
    return "".join(shown) + text[done:]


def _is_secret_name(name: str, marks: tuple[str, ...]) -> bool:
    name = name.lower().replace("_", "-").replace(".", "-")
    return any(mark in name for mark in marks)


def _mask_assignment(match: re.Match[str]) -> str:
    start = match.start()
    parameter = start > 0 and match.string[start - 1] in "?&;"
    marks = SECRET_PARAMETER_MARKS if parameter else SECRET_NAME_MARKS
    if not match.group("value") or not _is_secret_name(match.group("name"), marks):
        return match.group(0)
    return f"{match.group('name')}{match.group('eq')}{MASK}"


def mask_userinfo(text: str) -> str:
    """``text`` with every secret a location, URL or connection string can carry replaced by ``***``.

    - userinfo: ``postgresql://u:p@ss@host/db`` shows as ``postgresql://u:***@host/db``,
      ``s3://AKIA:ab/cd@bkt/x`` as ``s3://AKIA:***@bkt/x``, ``https://token@host`` as
      ``https://***@host``, ``u:pw@host/db`` (no scheme) as ``u:***@host/db``, and a password holding
      a quote, a space, a backtick or ``<`` (``postgresql://eo:ab'S@db/x``) as ``postgresql://eo:***@db/x``;
    - query parameters named by ``SECRET_PARAMETER_MARKS``: ``https://cat/v1?token=S&warehouse=w``
      shows as ``https://cat/v1?token=***&warehouse=w``, and so do ``sig=``, ``X-Amz-Signature=``,
      ``X-Amz-Credential=``, ``X-Amz-Security-Token=``, ``password=``;
    - ``name=value`` pairs named by ``SECRET_NAME_MARKS`` (libpq's ``host=db password='se cret'``
      shows as ``host=db password=***``).

    A path that merely contains an ``@``, or a parameter whose name only resembles a secret's, may be
    masked too: showing less is the price of never showing a secret.
    """
    if "@" in text:
        text = _BARE_USERINFO.sub(lambda m: f"{m.group('user')}:{MASK}@", _mask_urls(text))
    if "=" in text:
        text = _ASSIGNMENT.sub(_mask_assignment, text)
    return text


def has_userinfo(location: str) -> bool:
    """Whether a location or URL carries a secret that masking would hide (userinfo, a secret parameter)."""
    return mask_userinfo(location) != location


def find_control(text: str) -> str | None:
    """The first control character in ``text`` as ``U+001B``, or ``None`` when it has none."""
    found = _CONTROL.search(text)
    return None if found is None else f"U+{ord(found.group(0)):04X}"


def escape_controls(text: str) -> str:
    """``text`` with every control character shown as ``\\x1b``-style escapes: safe on a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


def safe_text(text: str) -> str:
    """What a terminal or a log line may show of stored or reported text: masked, then escaped."""
    return escape_controls(mask_userinfo(text))


__all__ = [
    "MASK",
    "SECRET_NAME_MARKS",
    "SECRET_PARAMETER_MARKS",
    "escape_controls",
    "find_control",
    "has_userinfo",
    "mask_userinfo",
    "safe_text",
]
