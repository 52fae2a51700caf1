"""Passwords out of URLs before they reach a message or a log line, whether the URL parses or not.

A password may hold `@`, `?`, `#` or `/` unencoded. URL parsers then disagree about where
it ends (`urlsplit` stops the host at `?`, SQLAlchemy stops the password at the first `@`)
and a mask built on a parse shows the rest of the password as a host, a path or a query.
The masks here never parse: everything between `user:` and the *last* `@` of a run of
non-blank characters counts as the password. Masking too much is preferred to showing a
secret. Such URLs are also refused where a connection is made from them
(`check_password_encoding`), because the parsers would connect to a wrong host.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote

_USERINFO_SECRET = re.compile(r"(?P<user>[^\s:/@?#]*):(?!//)(?P<secret>\S*)@")
"""`user:secret@`, the secret running to the last `@` before a blank (it may hold `@ ? # /` itself)."""

_QUERY_SECRET = re.compile(
    r"(?P<key>[?&;](?:password|passwd|pwd|pass|sslpassword|secret|token|access_token|api_key|apikey)=)[^&;#\s]*",
    re.IGNORECASE,
)

_AMBIGUOUS = frozenset("@?#/")


def mask_url_secrets(text: str) -> str:
    """Return `text` with every password in a URL-shaped part replaced by `***`, whether the URL parses or not.

    Masked: the password of `user:password@` wherever it appears (also after a broken
    scheme separator, as in `postgres:/user:secret@host`, and up to the last `@` when the
    password holds an unescaped `@`, `?`, `#` or `/`), and query parameters such as `password=`.
    """
    masked = _USERINFO_SECRET.sub(lambda m: f"{m.group('user')}:***@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m.group('key')}***", masked)


def redact_url(url: str) -> str:
    """Return one URL fit for a message: the password masked, the query string and fragment (which may hold one) dropped."""
    masked = mask_url_secrets(url.strip())
    scheme, separator, rest = masked.partition("://")
    if not separator:
        return re.split(r"[?#]", masked, maxsplit=1)[0]
    return f"{scheme}://{re.split(r'[?#]', rest, maxsplit=1)[0]}"


def url_secrets(url: str) -> set[str]:
    """The passwords `url` holds (also percent-decoded), to blank out of a driver's error text."""
    found: set[str] = set()
    for match in _USERINFO_SECRET.finditer(url):
        secret = match.group("secret")
        if secret:
            found.update({secret, unquote(secret)})
    query = url.partition("?")[2]
    for value in parse_qs(query).get("password", []):
        found.update({value, unquote(value)})
    return {secret for secret in found if secret}


def check_password_encoding(url: str) -> None:
    """Refuse a URL whose password holds `@`, `?`, `#` or `/` unencoded, without showing it.

    Raises:
        ValueError: The password must be percent-encoded first; the message says how.
    """
    scheme, separator, rest = url.strip().partition("://")
    if not separator or rest.startswith("/"):
        return  # no host part (a SQLite file), so no password
    authority = rest.rpartition("@")[0]
    user, colon, password = authority.partition(":")
    if colon and _AMBIGUOUS.intersection(password):
        raise ValueError(
            f"the password in {redact_url(url)!r} holds '@', '?', '#' or '/' unencoded; percent-encode them "
            "(%40, %3F, %23, %2F), or parsers read part of it as the host, path or query"
        )
