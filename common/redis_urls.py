"""Redis URLs and their passwords: shown masked, given to a process through a file rather than its
command line (where `ps` shows them), and put back together in memory where a client connects."""

from __future__ import annotations

import urllib.parse
from pathlib import Path


def with_password(url: str, password_file: str) -> str:
    """`url` with the password in `password_file` (a Redis that requires one, given to a process
    without putting it on its command line); `url` itself when there is no file to read."""
    if not password_file:
        return url
    password = Path(password_file).read_text().strip()
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(
        parts._replace(netloc=f"{parts.username or ''}:{urllib.parse.quote(password, safe='')}@{host}")
    )


def without_password(url: str) -> tuple[str, str]:
    """(`url` without its password, the password; "" if it has none)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url, ""
    host = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}@" if parts.username else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}{host}")), urllib.parse.unquote(parts.password)


def shown_url(url: str) -> str:
    """`url` with its password masked, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
