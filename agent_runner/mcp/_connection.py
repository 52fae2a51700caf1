"""One connection to an MCP server per call or listing, and the sorting of what can go wrong on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ssl
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.extension import ClientExtension
from mcp.client.streamable_http import streamable_http_client
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, REQUEST_TIMEOUT, DiscoverResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from agent_runner.errors import AgentRunnerError, RecoverableError, ToolError
from agent_runner.policy import parse_retry_after

T = TypeVar("T")

ServerAddress = str | StdioServerParameters
"""A streamable HTTP URL, or the command of a local server spoken to over stdio."""


class MCPProtocolError(AgentRunnerError):
    """An MCP server answered something the protocol does not allow (a malformed result, endless rounds)."""


class MCPServerError(AgentRunnerError):
    """An MCP server failed while a call that may act twice was in flight: whether it acted is unknown."""


@dataclass
class _HttpRefusal:
    """The last HTTP error status of a connection: the SDK reports it as a bare JSON-RPC error."""

    status: int | None = None
    retry_after: float | None = None


@asynccontextmanager
async def connected(
    address: ServerAddress, headers: Mapping[str, str], timeout: float, extensions: Sequence[ClientExtension] = ()
) -> AsyncIterator[Client]:
    """A client session with the server for the block; errors come out sorted (see `_sorted`)."""
    refusal = _HttpRefusal()

    async def note(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            refusal.status = response.status_code
            refusal.retry_after = parse_retry_after(response.headers)

    try:
        if isinstance(address, StdioServerParameters):
            async with Client(address, read_timeout_seconds=timeout, cache=None, extensions=extensions) as client:
                yield client
            return
        http = httpx2.AsyncClient(
            headers=dict(headers),
            timeout=httpx2.Timeout(timeout),
            event_hooks={"response": [note]},
            verify=_tls_context(),
        )
        transport = streamable_http_client(address, http_client=http)
        known = _discovered.get(address)
        # A server seen before is not probed again: its protocol version is pinned from the first answer.
        mode: Any = known[0] if known is not None else "auto"
        prior = known[1] if known is not None else None
        client = Client(
            transport, read_timeout_seconds=timeout, cache=None, extensions=extensions, mode=mode, prior_discover=prior
        )
        try:
            async with http, client:
                found = client.session.discover_result
                if known is None and found is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    _discovered[address] = (client.protocol_version, found)
                yield client
        except BaseException:
            _discovered.pop(address, None)  # the server may have changed: probe it next time
            raise
    except BaseException as exc:
        raise _sorted(exc, refusal) from exc


_discovered: dict[str, tuple[str, DiscoverResult]] = {}
"""What each streamable HTTP server said of itself when first probed, by URL (per process)."""


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Loading the certificate store takes ~90 ms: once per process, not once per call.
    return ssl.create_default_context()


def run_sync(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to completion from a plain thread, or from a thread whose event loop is busy running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    # The caller's loop is blocked in this synchronous call: the connection gets a loop of its own.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, work).result()


class MCPUnreachableError(RecoverableError):
    """The server could not be reached: nothing was sent, so trying again later is safe."""


class _TransientError(RecoverableError):
    """The server timed out or failed (5xx) or refused for a rate limit (429)."""


def _sorted(exc: BaseException, refusal: _HttpRefusal) -> BaseException:
    leaf = _leaf(exc)
    if isinstance(leaf, AgentRunnerError | asyncio.CancelledError | KeyboardInterrupt | SystemExit):
        return leaf
    if isinstance(leaf, httpx2.ConnectError | ConnectionError | FileNotFoundError):
        return MCPUnreachableError(f"the MCP server could not be reached: {leaf}")
    if isinstance(leaf, httpx2.TimeoutException) or (isinstance(leaf, MCPError) and leaf.code == REQUEST_TIMEOUT):
        return _TransientError(f"the MCP server did not answer in time: {leaf}")
    if isinstance(leaf, MCPError) and leaf.code == INTERNAL_ERROR and refusal.status is not None:
        status = refusal.status
        if status == 429:
            return _TransientError(
                "the MCP server refused the call for a rate limit (HTTP 429)", refusal.retry_after, rate_limited=True
            )
        if status >= 500 or status == 408:
            return _TransientError(f"the MCP server failed (HTTP {status})", refusal.retry_after)
        return ToolError(f"the MCP server refused the call (HTTP {status})")
    if isinstance(leaf, httpx2.HTTPError):
        return _TransientError(f"the connection to the MCP server failed: {leaf}")
    if isinstance(leaf, ValidationError):
        return MCPProtocolError(f"the MCP server sent a result the protocol does not allow: {leaf}")
    return leaf


def _leaf(exc: BaseException) -> BaseException:
    # The SDK runs its transport in task groups: the error of interest is the one inside.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        return next((_leaf(e) for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)), exc)
    return exc


def is_rejected_state(exc: BaseException) -> bool:
    """Whether the server refused the request state of an earlier round (it restarted with a new key, it expired)."""
    leaf = _leaf(exc)
    if not isinstance(leaf, MCPError) or leaf.code != INVALID_PARAMS:
        return False
    data = leaf.data
    return isinstance(data, dict) and data.get("reason") == "invalid_request_state"
