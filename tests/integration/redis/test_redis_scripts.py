"""Script loading, NOSCRIPT recovery, error translation and key layout of the Redis store."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

import store.keys
from agent_runner.errors import StoreError, StoreUnavailableError
from agent_runner.persistence import ConversationKey
from store.keys import RedisKeys
from store.redaction import redact_url
from store.redis_guard import RedisConversationGuard
from store.redis_lease import RedisTurnLease

pytestmark = pytest.mark.integration

LUA_DIR = Path(store.keys.__file__).with_name("lua")
SECRET = "s3cret-Pa55"


def is_cached(client: Redis[Any], name: str) -> bool:
    """Whether Redis has the script in its cache (it names scripts by the SHA1 of their source)."""
    sha = hashlib.sha1((LUA_DIR / f"{name}.lua").read_bytes()).hexdigest()
    return bool(client.script_exists(sha) == [True])  # type: ignore[no-untyped-call]


@pytest.fixture
def closed_port() -> int:
    """A local TCP port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[tuple[str, int]]:
    """A TCP server that accepts connections (in the kernel backlog) and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        host, port = server.getsockname()
        yield str(host), int(port)


def test_every_operation_still_works_after_a_script_flush(
    redis_client: Redis[Any], lease: RedisTurnLease, guard: RedisConversationGuard
) -> None:
    # Given every script has been loaded and called once
    held = lease.acquire("turn-1", "worker-a", 5_000)
    assert held is not None
    warm = lease.acquire("turn-warm", "worker-a", 5_000)
    assert warm is not None
    assert lease.renew(warm, 5_000) and lease.release(warm) and lease.holder("turn-warm") is None
    guard.claim(ConversationKey("conv-warm"), "turn-a")
    assert guard.replace(ConversationKey("conv-warm"), "turn-a", "turn-b") and guard.release(
        ConversationKey("conv-warm"), "turn-b"
    )
    assert guard.holder(ConversationKey("conv-warm")) is None
    guard.claim(ConversationKey("conv-1"), "turn-a")

    steps: list[tuple[str, Callable[[], object], object]] = [
        ("lease_acquire", lambda: (lease.acquire("turn-2", "worker-b", 5_000) or held).owner, "worker-b"),
        ("lease_holder", lambda: lease.holder("turn-1"), held),
        ("lease_renew", lambda: lease.renew(held, 5_000), True),
        ("lease_release", lambda: lease.release(held), True),
        ("guard_claim", lambda: guard.claim(ConversationKey("conv-2"), "turn-c"), "turn-c"),
        ("guard_holder", lambda: guard.holder(ConversationKey("conv-1")), "turn-a"),
        ("guard_replace", lambda: guard.replace(ConversationKey("conv-1"), "turn-a", "turn-d"), True),
        ("guard_release", lambda: guard.release(ConversationKey("conv-1"), "turn-d"), True),
    ]
    for name, step, expected in steps:
        # When Redis forgets its scripts (SCRIPT FLUSH, or a restart) right before the call
        redis_client.script_flush()
        assert not is_cached(redis_client, name)

        # Then the call still succeeds, having loaded its script again
        assert step() == expected, name
        assert is_cached(redis_client, name), name


def test_each_script_is_loaded_once_then_called_by_sha(
    redis_client: Redis[Any], keys: RedisKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a lease on a client that counts SCRIPT LOAD calls
    loaded: list[str] = []
    original_load = redis_client.script_load

    def counting_load(script: str) -> Any:
        loaded.append(script)
        return original_load(script)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(redis_client, "script_load", counting_load)
    with RedisTurnLease(client=redis_client, prefix=keys.prefix) as lease:
        # When it runs many operations
        for _ in range(10):
            held = lease.acquire("turn-1", "worker-a", 5_000)
            assert held is not None
            assert lease.renew(held, 5_000) and lease.release(held)

    # Then each of the three scripts was loaded exactly once
    assert sorted(loaded) == sorted(
        (LUA_DIR / f"{name}.lua").read_text() for name in ("lease_acquire", "lease_renew", "lease_release")
    )

    # And the client passed in is still open for its owner
    assert redis_client.ping() is True


def _acquire(url: str) -> object:
    with RedisTurnLease(url) as lease:
        return lease.acquire("turn-1", "worker-a", 1_000)


def _claim(url: str) -> object:
    with RedisConversationGuard(url) as guard:
        return guard.claim(ConversationKey("conv-1"), "turn-1")


@pytest.mark.parametrize(
    ("url_template", "operation"),
    [
        pytest.param("redis://:{secret}@127.0.0.1:{port}/0", _acquire, id="lease-password"),
        pytest.param("redis://app-user:{secret}@127.0.0.1:{port}/3", _claim, id="guard-user-and-password"),
        pytest.param("redis://127.0.0.1:{port}/0?password={secret}", _acquire, id="lease-password-in-query"),
    ],
)
def test_an_unreachable_redis_raises_store_unavailable_without_the_password(
    closed_port: int, url_template: str, operation: Callable[[str], object]
) -> None:
    # When an operation cannot connect
    with pytest.raises(StoreUnavailableError) as caught:
        operation(url_template.format(secret=SECRET, port=closed_port))

    # Then it raises a retryable store error, from the redis error, that names the server
    # but not the password
    error = caught.value
    assert error.retryable is True
    assert isinstance(error.__cause__, RedisConnectionError)
    assert f"127.0.0.1:{closed_port}" in str(error)
    assert SECRET not in str(error)
    assert SECRET not in repr(error)


def test_a_redis_that_never_answers_raises_store_unavailable(silent_server: tuple[str, int], keys: RedisKeys) -> None:
    # Given a lease on a client with a short read timeout, talking to a server that never replies
    host, port = silent_server
    client: Redis[Any] = Redis(host=host, port=port, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    try:
        with RedisTurnLease(client=client, prefix=keys.prefix) as lease:
            # When an operation waits for its reply
            with pytest.raises(StoreUnavailableError) as caught:
                lease.acquire("turn-1", "worker-a", 1_000)
    finally:
        client.close()

    # Then it times out as a retryable store error
    assert isinstance(caught.value.__cause__, RedisTimeoutError)
    assert f"{host}:{port}" in str(caught.value)


def test_wrong_credentials_raise_a_store_error_that_is_not_retryable(redis_url: str) -> None:
    # Given a URL for the test server with credentials it does not accept
    parts = urlsplit(redis_url)
    if parts.scheme not in ("redis", "rediss"):
        pytest.fail(f"this test needs a TCP Redis URL, got the scheme {parts.scheme!r}")
    host = parts.netloc.rpartition("@")[2]
    bad_url = parts._replace(netloc=f"no-such-user:{SECRET}@{host}").geturl()

    # When an operation runs
    with RedisConversationGuard(bad_url) as guard, pytest.raises(StoreError) as caught:
        guard.holder(ConversationKey("conv-1"))

    # Then the error says so without the password, and repeating it is pointless
    assert not isinstance(caught.value, StoreUnavailableError)
    assert caught.value.retryable is False
    assert isinstance(caught.value.__cause__, AuthenticationError)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/15", "redis://127.0.0.1:6379/15"),
        (f"redis://:{SECRET}@cache:6379/0", "redis://:***@cache:6379/0"),
        (f"rediss://app:{SECRET}@cache.internal:6380/2", "rediss://app:***@cache.internal:6380/2"),
        ("redis://app@cache/0", "redis://app@cache/0"),
        (f"unix:///run/redis.sock?db=1&password={SECRET}", "unix:///run/redis.sock"),
    ],
)
def test_urls_in_messages_never_show_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_lease_or_guard_needs_a_url_or_a_client() -> None:
    with pytest.raises(ValueError, match="redis_url or a client"):
        RedisTurnLease()
    with pytest.raises(ValueError, match="redis_url or a client"):
        RedisConversationGuard()


def test_every_key_lives_under_the_prefix_and_a_turns_keys_share_a_hash_tag() -> None:
    keys = RedisKeys("tenant-a")
    built = [keys.turn_lease("turn-1"), keys.turn_fence("turn-1"), keys.active_turn(ConversationKey("conv-1"))]
    assert all(key.startswith("tenant-a:") for key in built)
    assert "{turn-1}" in keys.turn_lease("turn-1")
    assert "{turn-1}" in keys.turn_fence("turn-1")
    assert RedisKeys().prefix == "agent-runner"
    with pytest.raises(ValueError, match="prefix"):
        RedisKeys("")
    with pytest.raises(ValueError, match="turn id"):
        keys.turn_lease("")


def test_the_namespace_pattern_matches_its_own_keys_only(redis_client: Redis[Any], keys: RedisKeys) -> None:
    # Given two namespaces whose prefixes differ only where the first has glob characters
    globby = RedisKeys(f"{keys.prefix}*[x]?")
    literal = RedisKeys(f"{keys.prefix}a[x]b")
    mine, theirs = globby.active_turn(ConversationKey("conv-1")), literal.active_turn(ConversationKey("conv-1"))
    redis_client.set(mine, "turn-1")
    redis_client.set(theirs, "turn-2")
    try:
        # Then scanning with the first namespace's pattern finds only its key
        found = {key.decode() for key in redis_client.scan_iter(match=globby.pattern(), count=1000)}
        assert found == {mine}
    finally:
        redis_client.delete(mine, theirs)
