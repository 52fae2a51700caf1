"""Settings of the Celery workers, read from the environment.

Every value has a default that works on a laptop with nothing running but Redis (and
SQLite as the store). The `celery -A workers.app` entry point reads them at import,
`workers.build_runner()` at call time. A value that cannot be used raises `SettingsError`, which names the variable, so a
misconfigured deployment fails at start-up rather than on the first turn.

| variable | default | meaning |
|---|---|---|
| `AGENT_RUNNER_DATABASE_URL` | `sqlite:///./agent_runner.db` | the SQL store (turns, chat memory, inbox) |
| `AGENT_RUNNER_REDIS_URL` | `redis://127.0.0.1:6379/0` | leases and the conversation guard |
| `AGENT_RUNNER_REDIS_PREFIX` | `agent-runner` | namespace of the Redis keys |
| `CELERY_BROKER_URL` | the Redis URL | the Celery broker (Redis or RabbitMQ) |
| `AGENT_RUNNER_BROKER_KEY_PREFIX` | none | Redis broker only: prefix of every broker key, to share a database |
| `AGENT_RUNNER_QUEUE` | `agent-runner` | the queue every task of this app uses |
| `AGENT_RUNNER_LEASE_TTL_S` | `30` | seconds a turn lease lasts without renewal |
| `AGENT_RUNNER_SWEEP_INTERVAL_S` | `10` | seconds between beat sweeps |
| `AGENT_RUNNER_MAX_ETA_S` | `300` | longest retry wait sent to the broker as an ETA |
| `AGENT_RUNNER_VISIBILITY_TIMEOUT_S` | `3600` | Redis broker: seconds before an unacknowledged message is redelivered |
| `AGENT_RUNNER_STEPS_PER_TASK` | `16` | steps one task may run under one lease before it re-enqueues |
| `AGENT_RUNNER_TASK_SOFT_TIME_LIMIT_S` | `600` | Celery soft time limit of a task |
| `AGENT_RUNNER_TASK_TIME_LIMIT_S` | `720` | Celery hard time limit of a task |
| `AGENT_RUNNER_AGENT_LOADER` | none | `module:attribute`: an `AgentLoader`, a list of `Agent`s, or a function returning one |
| `AGENT_RUNNER_INBOX_AGENT` | none | agent id that answers queued inbox messages |
| `AGENT_RUNNER_SETUP` | none | `module:function` called with every runner this project builds (workers, web app, CLI): add event listeners and middleware there |
| `AGENT_RUNNER_MAX_STEPS` | `200` | steps a turn may take (MAX_STEPS_REACHED beyond) |
| `AGENT_RUNNER_RETRY_MAX_ATTEMPTS` | `3` | attempts of a recoverable model or tool call |
| `AGENT_RUNNER_RETRY_INITIAL_BACKOFF_S` | `1` | first retry delay |
| `AGENT_RUNNER_RETRY_MULTIPLIER` | `2` | growth of the delay per attempt |
| `AGENT_RUNNER_RETRY_MAX_BACKOFF_S` | `60` | longest retry delay |
| `AGENT_RUNNER_MODEL_LIMITS` | none | JSON `{"<limit key>": {"rpm": n, "tpm": n, "concurrency": n}}`: provider limits shared by every process (see `agent_runner.model_limits`) |
| `AGENT_RUNNER_MODEL_TENANT_WEIGHTS` | none | JSON `{"<tenant>": weight}`: the shares of tenants whose calls wait for the same model limit (a tenant not named weighs 1) |
| `AGENT_RUNNER_ADMISSION_WINDOW` | none (admission off) | admitted new turns not yet started that may sit in the broker at once, all tenants together; set, new turns wait their tenant's fair turn (docs/limits.md, "Fair admission of new turns") |
| `AGENT_RUNNER_TENANT_MAX_IN_FLIGHT` | none | with admission: most turns of one tenant admitted or running and not ended or waiting for a person |
| `AGENT_RUNNER_ADMISSION_TENANT_WEIGHTS` | `AGENT_RUNNER_MODEL_TENANT_WEIGHTS` | JSON `{"<tenant>": weight}`: the shares of tenants whose new turns wait for admission |
| `AGENT_RUNNER_ADMISSION_SLOT_LEASE_S` | `300` | seconds an admitted turn holds its slot unless a worker starts it |
| `AGENT_RUNNER_RETRY_JITTER` | `0.1` | random fraction added to or removed from a delay |
| `AGENT_RUNNER_RETRY_POLICIES` | none | JSON: per agent id, `RetryPolicy` fields overriding the agent's own (`retry_on` as `module:Class` names) |
| `AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S` | the sweep interval | seconds between deadline sweeps (reminders and timeouts of approvals and forms) |
| `AGENT_RUNNER_DEADLINE_REMINDER` | `0.8` | fraction of the way to a deadline at which DEADLINE_APPROACHING is emitted; `0` for none |
| `AGENT_RUNNER_SCHEDULES` | none | scheduled turns: a `.yaml`, `.yml` or `.json` file, or `module:attribute` of a list of `Schedule`s |
| `AGENT_RUNNER_METRICS_PORT` | none | a worker serves Prometheus `/metrics` on this port (main process, prefork-safe) |
| `AGENT_RUNNER_METRICS_ADDR` | `0.0.0.0` | address the worker's metrics port binds to |
| `AGENT_RUNNER_LOG_FORMAT` | `text` | `json`: one JSON object per log line, with the turn of the step being run |
| `AGENT_RUNNER_WEBHOOKS` | none | webhook URLs per kind, with `AGENT_RUNNER_WEBHOOK_*` (see `workers.webhook_deliverer`) |
| `AGENT_RUNNER_DB_POOL_SIZE` | from the worker's concurrency (15 in the HTTP server) | database connections a process keeps open (see `workers.capacity`) |
| `AGENT_RUNNER_DB_MAX_OVERFLOW` | `10` | database connections a process opens on demand beyond those |
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import ValidationError

from agent_runner import AgentExecutionPolicy, AgentRunnerError, DefinitionError, ModelLimit, RetryPolicy
from agent_runner.model_limits import check_weights, parse_model_limits
from store.redaction import check_password_encoding, mask_url_secrets
from workers.defaults import DEFAULT_DATABASE_URL

T = TypeVar("T", int, float)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_QUEUE = "agent-runner"
DEFAULT_STEPS_PER_TASK = 16
"""Steps a `step_turn` task runs under one lease; each task also costs a broker hop, a lease and a load
(docs/workers.md, "Steps per task": on the shipped threads pool, CPU per step is what bounds
the turns a worker holds, and 16 spends a quarter less of it than 4)."""

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class SettingsError(AgentRunnerError):
    """An environment variable of the workers holds a value that cannot be used.

    The message never shows a password: URL-shaped parts of the value and the reason are
    masked with `mask_url_secrets`.

    Attributes:
        variable: The name of the environment variable.
        value: The value found, passwords masked (None when it was missing).
    """

    def __init__(self, variable: str, value: str | None, reason: str) -> None:
        self.variable = variable
        self.value = None if value is None else mask_url_secrets(value)
        shown = f"{variable} is not set" if self.value is None else f"{variable}={self.value!r} is invalid"
        super().__init__(f"{shown}: {mask_url_secrets(reason)}")


KINDS = ("waiting", "ended", "failed")
"""The webhook kinds, as written in `AGENT_RUNNER_WEBHOOKS` (`store.webhooks.WebhookKind` values)."""


@dataclass(frozen=True)
class WebhookSettings:
    """Where each kind of webhook goes, how it is signed and how hard delivery tries."""

    urls: Mapping[str, str]
    """URL per kind (`waiting`, `ended`, `failed`); a kind without a URL is not sent."""
    secret: str = field(repr=False)
    max_attempts: int = 8
    backoff_s: float = 2.0
    max_backoff_s: float = 600.0
    timeout_s: float = 5.0
    interval_s: float = 1.0
    lookback_s: float = 3600.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WebhookSettings | None:
        """Read the settings from `environ` (default: `os.environ`); None when no webhook is configured.

        Raises:
            SettingsError: A value cannot be used (it names the variable).
        """
        env = os.environ if environ is None else environ
        spec = env.get("AGENT_RUNNER_WEBHOOKS", "").strip()
        if not spec:
            return None
        secret = env.get("AGENT_RUNNER_WEBHOOK_SECRET", "")
        if not secret:
            raise SettingsError(
                "AGENT_RUNNER_WEBHOOK_SECRET", None, "webhooks are signed: set a secret shared with the receiver"
            )
        return cls(
            urls=parse_webhook_urls(spec),
            secret=secret,
            max_attempts=int(_positive(env, "AGENT_RUNNER_WEBHOOK_MAX_ATTEMPTS", 8, whole=True)),
            backoff_s=_positive(env, "AGENT_RUNNER_WEBHOOK_BACKOFF_S", 2.0),
            max_backoff_s=_positive(env, "AGENT_RUNNER_WEBHOOK_MAX_BACKOFF_S", 600.0),
            timeout_s=_positive(env, "AGENT_RUNNER_WEBHOOK_TIMEOUT_S", 5.0),
            interval_s=_positive(env, "AGENT_RUNNER_WEBHOOK_INTERVAL_S", 1.0),
            lookback_s=_positive(env, "AGENT_RUNNER_WEBHOOK_LOOKBACK_S", 3600.0),
        )

    def backoff(self, attempts: int) -> timedelta:
        """The wait after the `attempts`-th failed attempt: the retry schedule's backoff, doubling, without jitter."""
        schedule = RetryPolicy(
            initial_backoff=self.backoff_s, multiplier=2.0, max_backoff=self.max_backoff_s, jitter=0.0
        )
        return timedelta(seconds=schedule.backoff(attempts))


def parse_webhook_urls(spec: str) -> dict[str, str]:
    """Parse `AGENT_RUNNER_WEBHOOKS` (`waiting=https://...,ended=https://...`) into a URL per kind.

    Raises:
        SettingsError: An entry is not `kind=url`, names an unknown or repeated kind, or its URL
            is not http(s) with a host.
    """
    urls: dict[str, str] = {}
    for entry in spec.split(","):
        kind, sep, url = (part.strip() for part in entry.partition("="))
        if not sep or kind not in KINDS:
            raise SettingsError("AGENT_RUNNER_WEBHOOKS", spec, f"each entry is kind=url with a kind of {KINDS}")
        if kind in urls:
            raise SettingsError("AGENT_RUNNER_WEBHOOKS", spec, f"kind {kind!r} is given twice")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError("AGENT_RUNNER_WEBHOOKS", spec, f"the {kind} URL {url!r} is not an http(s) URL")
        urls[kind] = url
    return urls


def _positive(env: Mapping[str, str], name: str, default: float, *, whole: bool = False) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise SettingsError(name, raw, "expected a whole number" if whole else "expected a number") from None
    if value <= 0:
        raise SettingsError(name, raw, "must be greater than zero")
    return value


@dataclass(frozen=True)
class WorkerSettings:
    """Configuration of the Celery app, the worker processes and `workers.build_runner()`.

    Build it with `WorkerSettings.from_env()`; the attributes mirror the environment
    variables listed in this module's docstring.
    """

    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str = DEFAULT_REDIS_URL
    redis_prefix: str = "agent-runner"
    broker_url: str = DEFAULT_REDIS_URL
    broker_key_prefix: str | None = None
    queue: str = DEFAULT_QUEUE
    lease_ttl_s: float = 30.0
    sweep_interval_s: float = 10.0
    max_eta_s: float = 300.0
    visibility_timeout_s: float = 3600.0
    steps_per_task: int = DEFAULT_STEPS_PER_TASK
    soft_time_limit_s: float = 600.0
    time_limit_s: float = 720.0
    agent_loader: str | None = None
    inbox_agent: str | None = None
    inbox_coalesce: bool = False
    """Whether a turn started from queued messages takes all of its conversation's waiting ones (`AGENT_RUNNER_INBOX_COALESCE`)."""
    runner_setup: str | None = None
    max_steps: int = 200
    retry_max_attempts: int = 3
    retry_initial_backoff_s: float = 1.0
    retry_multiplier: float = 2.0
    retry_max_backoff_s: float = 60.0
    retry_jitter: float = 0.1
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    log_format: str = "text"
    retry_overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    deadline_sweep_interval_s: float = 10.0
    deadline_reminder: float | None = 0.8
    schedules: str | None = None
    webhooks: WebhookSettings | None = None
    db_pool_size: int | None = None
    """None: sized from the tasks a process runs at once (`workers.capacity.database_pool`)."""
    db_max_overflow: int | None = None
    model_limits: Mapping[str, ModelLimit] = field(default_factory=dict)
    """Shared provider limits by limit key (`AGENT_RUNNER_MODEL_LIMITS`)."""
    model_tenant_weights: Mapping[str, int] = field(default_factory=dict)
    """Tenant shares of the model limits (`AGENT_RUNNER_MODEL_TENANT_WEIGHTS`)."""
    admission_window: int | None = None
    """Admitted new turns not yet started, all tenants together (`AGENT_RUNNER_ADMISSION_WINDOW`); None: admission is off."""
    tenant_max_in_flight: int | None = None
    """Most active turns of one tenant under admission (`AGENT_RUNNER_TENANT_MAX_IN_FLIGHT`); None: no cap."""
    admission_tenant_weights: Mapping[str, int] = field(default_factory=dict)
    """Tenant shares of the admission of new turns (`AGENT_RUNNER_ADMISSION_TENANT_WEIGHTS`)."""
    admission_slot_lease_s: float = 300.0
    """Seconds an admitted turn holds its slot unless a worker starts it (`AGENT_RUNNER_ADMISSION_SLOT_LEASE_S`)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        """Read the settings from `environ` (default: `os.environ`).

        Raises:
            SettingsError: A variable holds a value that cannot be used; the error names it.
        """
        env = os.environ if environ is None else environ
        redis_url = _url(env, "AGENT_RUNNER_REDIS_URL", DEFAULT_REDIS_URL)
        settings = cls(
            database_url=_url(env, "AGENT_RUNNER_DATABASE_URL", DEFAULT_DATABASE_URL),
            redis_url=redis_url,
            redis_prefix=_text(env, "AGENT_RUNNER_REDIS_PREFIX", "agent-runner"),
            broker_url=_url(env, "CELERY_BROKER_URL", redis_url),
            broker_key_prefix=_optional_text(env, "AGENT_RUNNER_BROKER_KEY_PREFIX"),
            queue=_queue(env),
            lease_ttl_s=_number(env, "AGENT_RUNNER_LEASE_TTL_S", 30.0, float, minimum=0.1),
            sweep_interval_s=_number(env, "AGENT_RUNNER_SWEEP_INTERVAL_S", 10.0, float, minimum=0.1),
            max_eta_s=_number(env, "AGENT_RUNNER_MAX_ETA_S", 300.0, float, minimum=0.0),
            visibility_timeout_s=_number(env, "AGENT_RUNNER_VISIBILITY_TIMEOUT_S", 3600.0, float, minimum=1.0),
            steps_per_task=_number(env, "AGENT_RUNNER_STEPS_PER_TASK", DEFAULT_STEPS_PER_TASK, int, minimum=1),
            soft_time_limit_s=_number(env, "AGENT_RUNNER_TASK_SOFT_TIME_LIMIT_S", 600.0, float, minimum=1.0),
            time_limit_s=_number(env, "AGENT_RUNNER_TASK_TIME_LIMIT_S", 720.0, float, minimum=1.0),
            agent_loader=_import_path(env, "AGENT_RUNNER_AGENT_LOADER"),
            inbox_agent=_optional_text(env, "AGENT_RUNNER_INBOX_AGENT"),
            inbox_coalesce=_choice(env, "AGENT_RUNNER_INBOX_COALESCE", ("off", "on")) == "on",
            runner_setup=_import_path(env, "AGENT_RUNNER_SETUP"),
            max_steps=_number(env, "AGENT_RUNNER_MAX_STEPS", 200, int, minimum=1),
            retry_max_attempts=_number(env, "AGENT_RUNNER_RETRY_MAX_ATTEMPTS", 3, int, minimum=1),
            retry_initial_backoff_s=_number(env, "AGENT_RUNNER_RETRY_INITIAL_BACKOFF_S", 1.0, float, minimum=0.0),
            retry_multiplier=_number(env, "AGENT_RUNNER_RETRY_MULTIPLIER", 2.0, float, minimum=1.0),
            retry_max_backoff_s=_number(env, "AGENT_RUNNER_RETRY_MAX_BACKOFF_S", 60.0, float, minimum=0.0),
            retry_jitter=_number(env, "AGENT_RUNNER_RETRY_JITTER", 0.1, float, minimum=0.0, maximum=1.0),
            metrics_port=_optional_port(env, "AGENT_RUNNER_METRICS_PORT"),
            metrics_addr=_text(env, "AGENT_RUNNER_METRICS_ADDR", "0.0.0.0"),
            log_format=_choice(env, "AGENT_RUNNER_LOG_FORMAT", ("text", "json")),
            retry_overrides=_retry_overrides(env),
            deadline_sweep_interval_s=_number(
                env,
                "AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S",
                _number(env, "AGENT_RUNNER_SWEEP_INTERVAL_S", 10.0, float, minimum=0.1),
                float,
                minimum=0.1,
            ),
            deadline_reminder=_reminder(env),
            schedules=_schedules_spec(env),
            webhooks=_webhooks(env),
            db_pool_size=_optional_number(env, "AGENT_RUNNER_DB_POOL_SIZE", minimum=1),
            db_max_overflow=_optional_number(env, "AGENT_RUNNER_DB_MAX_OVERFLOW", minimum=0),
            model_limits=_model_limits(env),
            model_tenant_weights=_tenant_weights(env, "AGENT_RUNNER_MODEL_TENANT_WEIGHTS"),
            admission_window=_optional_number(env, "AGENT_RUNNER_ADMISSION_WINDOW", minimum=1),
            tenant_max_in_flight=_optional_number(env, "AGENT_RUNNER_TENANT_MAX_IN_FLIGHT", minimum=1),
            admission_tenant_weights=(
                _tenant_weights(env, "AGENT_RUNNER_ADMISSION_TENANT_WEIGHTS")
                if _raw(env, "AGENT_RUNNER_ADMISSION_TENANT_WEIGHTS") is not None
                else _tenant_weights(env, "AGENT_RUNNER_MODEL_TENANT_WEIGHTS")
            ),
            admission_slot_lease_s=_number(env, "AGENT_RUNNER_ADMISSION_SLOT_LEASE_S", 300.0, float, minimum=1.0),
        )
        settings._check_consistency(env)
        return settings

    def _check_consistency(self, env: Mapping[str, str]) -> None:
        # With the Redis broker a message not acknowledged within the visibility timeout is
        # delivered again. ETA messages are held unacknowledged until they are due, and
        # task_acks_late keeps a running task's message unacknowledged until it returns, so
        # both must stay well inside the timeout or every such message is repeated.
        if self.max_eta_s * 2 > self.visibility_timeout_s:
            raise SettingsError(
                "AGENT_RUNNER_MAX_ETA_S",
                env.get("AGENT_RUNNER_MAX_ETA_S"),
                f"must be at most half of AGENT_RUNNER_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s:g} s)",
            )
        if self.time_limit_s >= self.visibility_timeout_s:
            raise SettingsError(
                "AGENT_RUNNER_TASK_TIME_LIMIT_S",
                env.get("AGENT_RUNNER_TASK_TIME_LIMIT_S"),
                f"must be below AGENT_RUNNER_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s:g} s)",
            )
        if self.tenant_max_in_flight is not None and self.admission_window is None:
            # The cap is enforced by the admission of new turns; without it nothing would count.
            raise SettingsError(
                "AGENT_RUNNER_TENANT_MAX_IN_FLIGHT",
                env.get("AGENT_RUNNER_TENANT_MAX_IN_FLIGHT"),
                "needs AGENT_RUNNER_ADMISSION_WINDOW (the admission of new turns) to be set",
            )
        if self.soft_time_limit_s >= self.time_limit_s:
            raise SettingsError(
                "AGENT_RUNNER_TASK_SOFT_TIME_LIMIT_S",
                env.get("AGENT_RUNNER_TASK_SOFT_TIME_LIMIT_S"),
                f"must be below AGENT_RUNNER_TASK_TIME_LIMIT_S ({self.time_limit_s:g} s)",
            )

    @property
    def lease_ttl_ms(self) -> int:
        """The lease TTL in milliseconds, as the lease API takes it."""
        return max(1, int(self.lease_ttl_s * 1000))

    @property
    def step_time_budget_s(self) -> float:
        """Seconds after which a task stops taking new steps and re-enqueues the turn.

        Half the soft time limit, so the step in flight when the budget runs out still has
        room to finish before Celery interrupts it.
        """
        return self.soft_time_limit_s / 2

    def policy(self) -> AgentExecutionPolicy:
        """The execution policy the workers run turns with: step limit, retry schedules, deadline reminders.

        The retry schedule of an agent's calls is, from strongest to weakest: its entry in
        `AGENT_RUNNER_RETRY_POLICIES`, then `Agent(retry=...)` in code, then the
        `AGENT_RUNNER_RETRY_*` defaults.
        """
        return AgentExecutionPolicy(
            max_steps=self.max_steps,
            retry=RetryPolicy(
                max_attempts=self.retry_max_attempts,
                initial_backoff=self.retry_initial_backoff_s,
                multiplier=self.retry_multiplier,
                max_backoff=self.retry_max_backoff_s,
                jitter=self.retry_jitter,
            ),
            deadline_reminder=self.deadline_reminder,
            retry_overrides={agent: dict(fields) for agent, fields in self.retry_overrides.items()},
        )


def _raw(env: Mapping[str, str], name: str) -> str | None:
    # An empty variable counts as unset: compose and Kubernetes render unset values as "".
    value = env.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _text(env: Mapping[str, str], name: str, default: str) -> str:
    return _raw(env, name) or default


def _optional_text(env: Mapping[str, str], name: str) -> str | None:
    return _raw(env, name)


def _url(env: Mapping[str, str], name: str, default: str) -> str:
    value = _raw(env, name)
    if value is None:
        return default
    if "://" not in value:
        raise SettingsError(name, value, "expected a URL such as scheme://host/...")
    try:
        check_password_encoding(value)
    except ValueError as exc:
        raise SettingsError(name, value, str(exc)) from None
    try:
        urlsplit(value).port  # noqa: B018 - reading the port is what validates it
    except ValueError:
        raise SettingsError(name, value, "the port is not a number from 0 to 65535") from None
    return value


def _queue(env: Mapping[str, str]) -> str:
    value = _raw(env, "AGENT_RUNNER_QUEUE")
    if value is None:
        return DEFAULT_QUEUE
    if not _QUEUE_NAME.match(value):
        raise SettingsError("AGENT_RUNNER_QUEUE", value, "use letters, digits and . _ : - (at most 200)")
    return value


def _import_path(env: Mapping[str, str], name: str) -> str | None:
    value = _raw(env, name)
    if value is not None and not _IMPORT_PATH.match(value):
        raise SettingsError(name, value, "expected module:attribute, for example myapp.agents:loader")
    return value


_SCHEDULE_FILE = re.compile(r"\.(ya?ml|json)$", re.IGNORECASE)


def _schedules_spec(env: Mapping[str, str]) -> str | None:
    value = _raw(env, "AGENT_RUNNER_SCHEDULES")
    if value is None or _SCHEDULE_FILE.search(value) or _IMPORT_PATH.match(value):
        return value
    raise SettingsError(
        "AGENT_RUNNER_SCHEDULES",
        value,
        "expected a .yaml, .yml or .json file, or module:attribute of a list of workers.schedules.Schedule",
    )


def _webhooks(env: Mapping[str, str]) -> WebhookSettings | None:
    return WebhookSettings.from_env(env)


def _reminder(env: Mapping[str, str]) -> float | None:
    fraction = _number(env, "AGENT_RUNNER_DEADLINE_REMINDER", 0.8, float, minimum=0.0, maximum=0.99)
    return fraction if fraction > 0 else None


def _json(name: str, value: str) -> Any:
    """The JSON a variable holds.

    Raises:
        SettingsError: It is not JSON.
    """
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise SettingsError(name, value, f"expected a JSON object: {exc}") from None


def _retry_overrides(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """`AGENT_RUNNER_RETRY_POLICIES`: `{"agent-id": {"max_attempts": 5, "retry_on": ["module:Error"]}}`."""
    name = "AGENT_RUNNER_RETRY_POLICIES"
    value = _raw(env, name)
    if value is None:
        return {}
    parsed = _json(name, value)
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise SettingsError(name, value, 'expected {"<agent id>": {"<RetryPolicy field>": value, ...}, ...}')
    overrides: dict[str, dict[str, Any]] = {}
    for agent_id, fields in parsed.items():
        fields = dict(fields)
        if "retry_on" in fields:
            fields["retry_on"] = tuple(_exception_class(name, value, item) for item in _names(name, value, fields))
        overrides[agent_id] = fields
    try:
        AgentExecutionPolicy(retry_overrides=overrides)
    except DefinitionError as exc:
        raise SettingsError(name, value, str(exc)) from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        raise SettingsError(name, value, problems) from None
    return overrides


def _model_limits(env: Mapping[str, str]) -> dict[str, ModelLimit]:
    """`AGENT_RUNNER_MODEL_LIMITS`: `{"openai:gpt-4o-mini": {"rpm": 500, "tpm": 200000, "concurrency": 20}}`."""
    name = "AGENT_RUNNER_MODEL_LIMITS"
    value = _raw(env, name)
    if value is None:
        return {}
    try:
        return parse_model_limits(value)
    except DefinitionError as exc:
        raise SettingsError(name, value, str(exc)) from None


def _tenant_weights(env: Mapping[str, str], name: str) -> dict[str, int]:
    """Tenant weights such as `AGENT_RUNNER_MODEL_TENANT_WEIGHTS`: `{"acme": 3, "globex": 1}`."""
    value = _raw(env, name)
    if value is None:
        return {}
    parsed = _json(name, value)
    if not isinstance(parsed, dict):
        raise SettingsError(name, value, 'expected {"<tenant>": weight, ...}')
    try:
        return check_weights(parsed)
    except DefinitionError as exc:
        raise SettingsError(name, value, str(exc)) from None


def _names(name: str, value: str, fields: dict[str, Any]) -> list[str]:
    items = fields["retry_on"]
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise SettingsError(name, value, 'retry_on is a list of exception classes as "module:Class"')
    return items


def _exception_class(name: str, value: str, spec: str) -> type[BaseException]:
    module_name, _, attribute = spec.partition(":")
    try:
        found: Any = importlib.import_module(module_name) if module_name and attribute else None
        for part in attribute.split(".") if found is not None else ():
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise SettingsError(name, value, f"cannot import {spec!r}: {exc}") from None
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        raise SettingsError(name, value, f"{spec!r} is not an exception class (use module:Class)")
    return found


def _number(
    env: Mapping[str, str],
    name: str,
    default: T,
    kind: Callable[[str], T],
    *,
    minimum: float,
    maximum: float | None = None,
) -> T:
    value = _raw(env, name)
    if value is None:
        return default
    try:
        number = kind(value)
    except ValueError:
        raise SettingsError(name, value, f"expected {'an integer' if kind is int else 'a number'}") from None
    if number != number or number in (float("inf"), float("-inf")):  # NaN or infinite
        raise SettingsError(name, value, "expected a finite number")
    if number < minimum:
        raise SettingsError(name, value, f"must be at least {minimum:g}")
    if maximum is not None and number > maximum:
        raise SettingsError(name, value, f"must be at most {maximum:g}")
    return number


def _optional_number(env: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    if _raw(env, name) is None:
        return None
    return _number(env, name, 0, int, minimum=minimum)


def _optional_port(env: Mapping[str, str], name: str) -> int | None:
    if _raw(env, name) is None:
        return None
    return _number(env, name, 0, int, minimum=1, maximum=65535)


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = _raw(env, name)
    if value is None:
        return choices[0]
    if value.lower() not in choices:
        raise SettingsError(name, value, f"expected one of {', '.join(choices)}")
    return value.lower()
