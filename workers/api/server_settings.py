"""Settings of the HTTP server, read from the environment like the workers' (`workers.settings`).

| variable | default | meaning |
|---|---|---|
| `AGENT_RUNNER_API_KEYS` | none (one tenant, no auth, loopback only) | `tenant:key,tenant:key`: the keys clients send as `Authorization: Bearer <key>` |
| `AGENT_RUNNER_API_WORKER` | `embedded` on SQLite, else `celery` | who steps turns: `embedded` (threads in the server), `celery`, or `none` |
| `AGENT_RUNNER_API_WORKER_CONCURRENCY` | `2` | stepping threads of the embedded worker |
| `AGENT_RUNNER_API_INTERRUPT_WAIT_S` | `5` | how long `if_busy=interrupt` waits for a turn that is mid-step to stop |
| `AGENT_RUNNER_API_IDEMPOTENCY_TTL_S` | `86400` | how long idempotency keys and their answers are kept |
| `AGENT_RUNNER_CORS_ORIGINS` | none | comma-separated origins whose pages may call the API from a browser (`*`: any, refused with keys) |
| `AGENT_RUNNER_TOKEN_SECRET` | none (no tokens) | at least 32 characters, the same on every server process: signs the short-lived tokens of `POST /v1/tokens` |
| `AGENT_RUNNER_METRICS_TOKEN` | none | the bearer token `GET /metrics` requires; with API keys set and no token, `/metrics` answers 403 |

Everything else (database, Redis, broker, agents, retry policy) comes from
`workers.settings.WorkerSettings`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from sqlalchemy.engine import make_url

from agent_runner.limits import TENANT_PATTERN
from workers.api.cors import CORS_VARIABLE, check_origins, parse_origins
from workers.api.tokens import TOKEN_SECRET_VARIABLE, parse_secret
from workers.settings import SettingsError, WorkerSettings, _number, _raw

KEYS_VARIABLE = "AGENT_RUNNER_API_KEYS"
METRICS_TOKEN_VARIABLE = "AGENT_RUNNER_METRICS_TOKEN"
WORKER_VARIABLE = "AGENT_RUNNER_API_WORKER"


class WorkerMode(StrEnum):
    """Who steps the turns the server starts and resumes."""

    EMBEDDED = "embedded"
    """An `AgentWorker` inside the server process, on the SQL store and SQL leases."""
    CELERY = "celery"
    """Celery workers; the server enqueues through the Celery wiring (Redis guard, broker)."""
    NONE = "none"
    """Nobody here: the server only saves turns and decisions (workers run elsewhere)."""


def default_worker_mode(database_url: str) -> WorkerMode:
    """`embedded` for a SQLite database, `celery` for anything else."""
    return WorkerMode.EMBEDDED if make_url(database_url).get_backend_name() == "sqlite" else WorkerMode.CELERY


@dataclass(frozen=True)
class ApiKeys:
    """The API keys of the tenants; empty means one tenant without authentication.

    Keys are compared by their SHA-256 digests with `hmac.compare_digest`, against every
    configured key, so neither the time taken nor an early exit tells anything about them.
    """

    _digests: tuple[tuple[bytes, str], ...] = field(default=(), repr=False)

    @classmethod
    def parse(cls, value: str | None) -> ApiKeys:
        """Parse `tenant-a:key1,tenant-b:key2` (whitespace around entries is ignored).

        Raises:
            SettingsError: An entry is not `tenant:key`, a tenant name is not
                `[A-Za-z0-9_-]{1,64}`, or a key appears twice.
        """
        if value is None or not value.strip():
            return cls()
        digests: list[tuple[bytes, str]] = []
        seen: set[bytes] = set()
        for entry in value.split(","):
            entry = entry.strip()
            if not entry:
                continue
            tenant, separator, key = entry.partition(":")
            tenant, key = tenant.strip(), key.strip()
            if not separator or not key:
                raise SettingsError(KEYS_VARIABLE, "***", "expected tenant:key entries separated by commas")
            if not TENANT_PATTERN.match(tenant):
                raise SettingsError(KEYS_VARIABLE, "***", f"tenant name {tenant!r} must match {TENANT_PATTERN.pattern}")
            digest = hashlib.sha256(key.encode()).digest()
            if digest in seen:
                raise SettingsError(KEYS_VARIABLE, "***", f"a key of tenant {tenant!r} is given twice")
            seen.add(digest)
            digests.append((digest, tenant))
        return cls(tuple(digests))

    @property
    def enabled(self) -> bool:
        """Whether any key is configured (then every `/v1` request needs one)."""
        return bool(self._digests)

    @property
    def tenants(self) -> frozenset[str]:
        """The configured tenant names."""
        return frozenset(tenant for _, tenant in self._digests)

    def tenant_of(self, key: str) -> str | None:
        """The tenant whose key `key` is, or None."""
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        found: str | None = None
        for candidate, tenant in self._digests:
            if hmac.compare_digest(candidate, digest):
                found = tenant
        return found


@dataclass(frozen=True)
class ApiSettings:
    """Configuration of the HTTP server.

    Build it with `ApiSettings.from_env()`; `workers` holds the settings shared with the
    Celery workers (database, Redis, broker, agents, retry policy).
    """

    workers: WorkerSettings = field(default_factory=WorkerSettings)
    keys: ApiKeys = field(default_factory=ApiKeys)
    worker_mode: WorkerMode = WorkerMode.EMBEDDED
    worker_concurrency: int = 2
    interrupt_wait_s: float = 5.0
    idempotency_ttl_s: float = 86_400.0
    cors_origins: tuple[str, ...] = ()
    """Origins whose pages may call the API from a browser (see `workers.api.cors`)."""
    token_secret: bytes | None = field(default=None, repr=False)
    """The key that signs and checks tokens (None: `POST /v1/tokens` is refused); see `workers.api.tokens`."""

    def __post_init__(self) -> None:
        check_origins(self.cors_origins, keys_enabled=self.keys.enabled)

    metrics_token: str | None = field(default=None, repr=False)
    """The bearer token of `GET /metrics`. The metrics count the turns of every tenant, so no
    tenant's key opens them: with API keys set and no token, `/metrics` is closed."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiSettings:
        """Read the settings from `environ` (default: `os.environ`).

        Raises:
            SettingsError: A variable holds a value that cannot be used; the error names it.
        """
        env = os.environ if environ is None else environ
        workers = WorkerSettings.from_env(env)
        mode_value = _raw(env, WORKER_VARIABLE)
        if mode_value is None:
            mode = default_worker_mode(workers.database_url)
        else:
            try:
                mode = WorkerMode(mode_value.lower())
            except ValueError:
                choices = ", ".join(m.value for m in WorkerMode)
                raise SettingsError(WORKER_VARIABLE, mode_value, f"expected one of {choices}") from None
        return cls(
            workers=workers,
            keys=ApiKeys.parse(env.get(KEYS_VARIABLE)),
            worker_mode=mode,
            worker_concurrency=_number(env, "AGENT_RUNNER_API_WORKER_CONCURRENCY", 2, int, minimum=1),
            interrupt_wait_s=_number(env, "AGENT_RUNNER_API_INTERRUPT_WAIT_S", 5.0, float, minimum=0.0),
            idempotency_ttl_s=_number(env, "AGENT_RUNNER_API_IDEMPOTENCY_TTL_S", 86_400.0, float, minimum=60.0),
            cors_origins=parse_origins(env.get(CORS_VARIABLE)),
            token_secret=parse_secret(env.get(TOKEN_SECRET_VARIABLE)),
            metrics_token=_raw(env, METRICS_TOKEN_VARIABLE),
        )

    def metrics_access(self, bearer: str | None) -> MetricsAccess:
        """Whether a request with this bearer token (None: none sent) may read `/metrics`."""
        if self.metrics_token is None:
            return MetricsAccess.CLOSED if self.keys.enabled else MetricsAccess.ALLOWED
        if bearer is not None and hmac.compare_digest(bearer.encode(), self.metrics_token.encode()):
            return MetricsAccess.ALLOWED
        return MetricsAccess.UNAUTHORIZED


class MetricsAccess(StrEnum):
    """The answer to a request for `/metrics`."""

    ALLOWED = "allowed"
    UNAUTHORIZED = "unauthorized"
    """The token is required, and the request did not send it."""
    CLOSED = "closed"
    """API keys are set and no metrics token is: the numbers span tenants, so nobody may read them."""
