"""Making stored and reported text safe to show: credentials masked, terminal controls escaped.

Locations (sink roots, write locations, checkpoint paths, catalog and meta-store URLs) reach people
through many doors: the UI's pages and API, ``eo-sink``'s tables, JSON and messages, exception texts
that quote a path, log lines. A password written into one of them (``s3://key:secret@bucket``,
``postgresql://user:secret@host/db``) would leak through every door at once, so each door passes
its text through ``mask_userinfo`` here, the one place that knows what userinfo looks like.

Text read back from the meta store (error messages, abort reasons, file paths) can carry terminal
escape sequences; printed raw, a crafted one retitles or clears an operator's terminal.
``escape_controls`` makes them visible instead, and ``find_control`` lets the places where such
text enters refuse it.

Neither Airflow nor anything else outside the standard library is imported: every layer uses this.
"""

from __future__ import annotations

import re

#: What replaces the secret part of userinfo.
MASK = "***"

#: Parts of a catalog or FileIO property name that mark its value as a secret (``s3.secret-access-key``,
#: ``s3.session-token``, the REST ``credential``...): masked wherever such a value could be quoted.
SECRET_PROPERTY_MARKS = ("secret", "token", "password", "credential")
#: What may not stand in a templated field at all, shown as it is once rendered: the secrets, and the
#: key ids and account keys that are half of a credential (``s3.access-key-id``, ``adls.account-key``).
CREDENTIAL_PROPERTY_MARKS = (*SECRET_PROPERTY_MARKS, "account-key", "access-key", "private-key")

#: C0 controls (incl. TAB, LF, CR, ESC, BEL), DEL, and the C1 controls (U+0080..U+009F, e.g. CSI).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

#: ``scheme://`` followed by the rest of the token (a URL ends at whitespace or a quote).
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<rest>[^\s'\"<>`]*)")
#: ``user:secret@`` with no scheme in front (``user:pw@host/db``, a URL written without ``//``).
_BARE_USERINFO = re.compile(
    r"(?<![\w.+\-/:@])(?P<user>[\w.+\-%]+):(?!/)(?P<secret>[^\s'\"<>`@/]*(?:/[^\s'\"<>`@/]*)*)@"
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


def _mask_url(match: re.Match[str]) -> str:
    scheme, rest = match.group("scheme"), match.group("rest")
    split = _split_userinfo(rest)
    if split is None:
        return match.group(0)
    userinfo, remainder = split
    return f"{scheme}{_masked_userinfo(userinfo)}@{remainder}"


def mask_userinfo(text: str) -> str:
    """``text`` with the secret of every URL's userinfo replaced by ``***``.

    ``postgresql://u:p@ss@host/db`` shows as ``postgresql://u:***@host/db``, ``s3://AKIA:ab/cd@bkt/x``
    as ``s3://AKIA:***@bkt/x``, ``https://token@host`` as ``https://***@host``, and ``u:pw@host/db``
    (no scheme) as ``u:***@host/db``. A path that merely contains an ``@`` may be masked too: showing
    less of a path is the price of never showing a secret.
    """
    if "@" not in text:
        return text
    masked = _URL.sub(_mask_url, text)
    return _BARE_USERINFO.sub(lambda m: f"{m.group('user')}:{MASK}@", masked)


def has_userinfo(location: str) -> bool:
    """Whether a location or URL carries userinfo (a user, a password, or both) that masking would hide."""
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


__all__ = ["MASK", "escape_controls", "find_control", "has_userinfo", "mask_userinfo", "safe_text"]
