"""Runs the Lua scripts in `store/lua/` on Redis: loaded once, called by SHA, reloaded on NOSCRIPT."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from agent_runner.errors import StoreError, StoreUnavailableError
from store.redaction import check_password_encoding, redact_url, url_secrets

_LUA_DIR = Path(__file__).with_name("lua")

_SOCKET_TIMEOUT_S = 5.0
# A lease operation sits on the worker's hot path and must finish well inside the lease
# TTL, so a dead server is reported within about a second rather than after redis-py's
# long default retry schedule. The caller sees a retryable StoreUnavailableError.
_RETRY = Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=3)

# Failures after which the same call may succeed: the server is down, slow, loading its
# data, or a replica during a failover. Credential errors derive from ConnectionError in
# redis-py but are checked first, since repeating them cannot help.
_UNAVAILABLE: tuple[type[RedisError], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
)
_REFUSED: tuple[type[RedisError], ...] = (AuthenticationError, NoPermissionError)


_INCLUDE = re.compile(r"^-- include: (_\w+)$", re.MULTILINE)


def script_source(name: str) -> str:
    """The text of the script `name` as sent to Redis.

    Its file, with each line `-- include: _<part>` replaced by `store/lua/_<part>.lua`:
    Redis scripts cannot load one another, so a part several scripts use is written once.
    """
    text = (_LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda found: (_LUA_DIR / f"{found[1]}.lua").read_text(encoding="utf-8").rstrip("\n"), text)


def _decode(reply: Any) -> Any:
    # Clients built here return bytes; a client passed in may decode responses itself.
    if isinstance(reply, bytes):
        return reply.decode("utf-8")
    if isinstance(reply, list):
        return [_decode(item) for item in reply]
    return reply


class RedisScripts:
    """The Lua scripts of one Redis client: their sources and SHAs, and the calls to run them.

    Each script is sent with `SCRIPT LOAD` on its first use and then called with `EVALSHA`.
    Redis forgets its script cache on a restart, a failover to a replica that never saw the
    script, or `SCRIPT FLUSH`; the resulting NOSCRIPT error is answered by loading the
    script again and repeating the call once, so callers never see it.

    Args:
        redis_url: URL of the server; also names it (password masked) in error messages.
        client: A client to use instead of one built from `redis_url`; it stays open on
            `close()`, since its owner may share it.
        names: Script file names in `store/lua/`, without `.lua`.

    Raises:
        ValueError: Neither `redis_url` nor `client` was given.
    """

    def __init__(self, redis_url: str | None, client: Redis[Any] | None, names: Iterable[str]) -> None:
        self._sources = {name: script_source(name) for name in names}
        self._shas: dict[str, str] = {}
        if client is not None:
            self._client = client
            self._owns_client = False
        elif redis_url is not None:
            check_password_encoding(redis_url)
            self._client = Redis.from_url(
                redis_url, socket_timeout=_SOCKET_TIMEOUT_S, socket_connect_timeout=_SOCKET_TIMEOUT_S, retry=_RETRY
            )
            self._owns_client = True
        else:
            raise ValueError("a Redis lease or guard needs a redis_url or a client, got neither")
        kwargs = self._client.connection_pool.connection_kwargs
        self._secrets = url_secrets(redis_url or "") | ({str(kwargs["password"])} if kwargs.get("password") else set())
        if redis_url is not None:
            self._server = redact_url(redis_url)
        elif "path" in kwargs:
            self._server = f"unix://{kwargs['path']}"
        else:
            self._server = f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"

    def run(self, name: str, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """Run the script `name` and return its reply, with strings decoded.

        Raises:
            StoreUnavailableError: Redis could not be reached, timed out or cannot write now.
            StoreError: Redis refused the credentials or failed the script.
        """
        try:
            try:
                reply = self._evalsha(self._shas.get(name) or self._load(name), keys, args)
            except NoScriptError:
                # Two concurrent reloads are harmless: both store the same SHA. A second
                # NOSCRIPT right after the reload (another flush in between) is left to the
                # caller as a retryable error rather than looped on here.
                reply = self._evalsha(self._load(name), keys, args)
        except RedisError as exc:
            raise self._translate(name, exc) from exc
        return _decode(reply)

    def close(self) -> None:
        """Close the client and its connection pool if they were built here."""
        if self._owns_client:
            self._client.close()

    # types-redis leaves the scripting commands unannotated.
    def _evalsha(self, sha: str, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        return self._client.evalsha(sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]

    def _load(self, name: str) -> str:
        sha = str(_decode(self._client.script_load(self._sources[name])))  # type: ignore[no-untyped-call]
        self._shas[name] = sha
        return sha

    def _translate(self, name: str, exc: RedisError) -> StoreError:
        detail = f"{type(exc).__name__}: {exc}"
        for secret in self._secrets:
            detail = detail.replace(secret, "***")
        if isinstance(exc, NoScriptError):
            return StoreUnavailableError(
                f"Redis at {self._server} lost the script {name!r} again right after reloading it: {detail}"
            )
        if isinstance(exc, _REFUSED):
            return StoreError(f"Redis at {self._server} refused to run the script {name!r}: {detail}")
        if isinstance(exc, _UNAVAILABLE):
            return StoreUnavailableError(
                f"Redis at {self._server} was unavailable to run the script {name!r}: {detail}"
            )
        return StoreError(f"Redis at {self._server} failed the script {name!r}: {detail}")
