"""The `with` block of the store's backends: leaving it closes the backend."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, Self


class _Closable(Protocol):
    def close(self) -> None: ...


class ClosesOnExit:
    """Makes a backend with a `close()` method a context manager that calls it on exit."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self: _Closable,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
