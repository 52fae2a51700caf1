"""Access logs without credentials: the `access_token` query parameter is written as `***`.

A browser's `EventSource` cannot send headers, so a page passes its short-lived token in
the URL (`?access_token=`); and a client may send a tenant key there by mistake (refused
with 401, but the URL is logged all the same). Uvicorn's access log writes each request's
path with its query, so without this filter those credentials would land in log files and
log pipelines in clear.
"""

from __future__ import annotations

import logging
import re
from typing import Final

ACCESS_LOGGER: Final = "uvicorn.access"
"""The logger uvicorn writes one line per request to."""

SECRET_PARAMETERS: Final = ("access_token",)
"""Query parameters that carry credentials."""

_SECRET_VALUE = re.compile(r"(?P<name>(?:^|[?&;])(?:" + "|".join(SECRET_PARAMETERS) + r")=)[^&;#\s]*", re.IGNORECASE)


def redact_query(target: str) -> str:
    """`target` (a path with its query, or any text holding one) with each credential's value replaced by `***`."""
    if "=" not in target:
        return target
    return _SECRET_VALUE.sub(r"\g<name>***", target)


class RedactCredentials(logging.Filter):
    """Replaces credentials in the arguments and message of the records it sees (it never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact the record in place; always keep it."""
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query(arg) if isinstance(arg, str) else arg for arg in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        return True


_FILTER: Final = RedactCredentials()


def redact_access_log(logger: logging.Logger | None = None) -> None:
    """Install the filter on uvicorn's access logger (or `logger`); installing it twice adds it once.

    A filter of the logger itself, not of its handlers, so that it holds whatever handlers
    uvicorn's log configuration (or the host application's) puts there later.
    """
    (logger or logging.getLogger(ACCESS_LOGGER)).addFilter(_FILTER)
