"""Comparing storage locations written in different spellings.

Writers, catalogs and users spell the same local directory as ``/x``, ``file:/x`` or ``file:///x``;
an abort deletes everything below a write location, so "is this inside the table, and not the table's
own data or metadata root?" must be answered on normalised locations, never on raw string prefixes.
"""

from __future__ import annotations

import posixpath
from typing import NamedTuple
from urllib.parse import urlparse

_LOCAL_SCHEMES = {"", "file"}


class Location(NamedTuple):
    scheme: str
    netloc: str
    path: str

    def is_inside(self, root: Location) -> bool:
        """Strictly below ``root`` (the same location does not count)."""
        if (self.scheme, self.netloc) != (root.scheme, root.netloc):
            return False
        prefix = root.path.rstrip("/") + "/"
        return self.path.startswith(prefix) and len(self.path) > len(prefix)

    def is_at_or_above(self, other: Location) -> bool:
        return self == other or other.is_inside(self)


def parse_location(location: str) -> Location:
    parsed = urlparse(location)
    scheme = parsed.scheme.lower()
    if scheme in _LOCAL_SCHEMES:
        return Location("file", "", posixpath.normpath(parsed.path if scheme else location))
    path = posixpath.normpath(parsed.path or "/")
    return Location(scheme, parsed.netloc, path)


def is_inside(child: str, root: str) -> bool:
    return parse_location(child).is_inside(parse_location(root))
