"""The `agent-runner` command line: operate turns from a terminal.

Every command reads the database from `--database-url` or `AGENT_RUNNER_DATABASE_URL`
(default: the embedded SQLite file `./agent_runner.db`). Human-readable output by default,
`--json` for scripts. Every error is one `error: ...` line on standard error (form data
that fails its schema adds one `  - ...` line per schema error), never a traceback. The
exit status is 2 for bad input (an unknown turn, an invalid id, JSON or option value,
invalid form data, a command that does not fit the turn such as a cancel of an ended one,
arguments that are not UTF-8) and 1 for failures of the infrastructure (the database cannot
be reached, a store error).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn
from zoneinfo import ZoneInfo

import click

from workers.defaults import DEFAULT_DATABASE_URL

# The runner, the store and their dependencies (pydantic, SQLAlchemy, Celery) are imported
# by the commands that use them, so `agent-runner --help` and the simple commands start
# without loading what they do not need.
if TYPE_CHECKING:
    from agent_runner import AgentLoader, AgentRunner, AgentRunnerError, AgentTurn
    from store import SqlAgentTurnStore
    from workers.database import Database
    from workers.embedded_timers import Scheduler
    from workers.settings import WorkerSettings

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1
MAX_LIST_LIMIT = 1000
REJECT_REASON = "rejected by the operator"
"""The reason of a `resume --reject` given without `--reason`."""

_AGE = re.compile(r"([0-9]{1,9})([smhd])")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _fail(message: str, code: int = EXIT_FAILURE, details: Iterable[str] = ()) -> NoReturn:
    click.echo(f"error: {_one_line(message)}", err=True)
    for line in details:
        click.echo(f"  - {_one_line(line)}", err=True)
    sys.exit(code)


def _one_line(text: str) -> str:
    """`text` on one line, passwords masked, and printable whatever bytes the arguments held."""
    from store._redaction import mask_url_secrets

    text = " ".join(mask_url_secrets(text).split())
    try:
        # Arguments that were not UTF-8 reach Python as lone surrogates: show their bytes.
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _exit_code(error: AgentRunnerError) -> int:
    from agent_runner import AgentNotFound, DefinitionError, InputLimitError, TurnError
    from workers.settings import SettingsError

    # TurnError: an unknown turn, or a command that does not fit the turn.
    bad_input = (TurnError, InputLimitError, AgentNotFound, DefinitionError, SettingsError)
    return EXIT_BAD_INPUT if isinstance(error, bad_input) else EXIT_FAILURE


class _Commands(click.Group):
    """The command group: whatever goes wrong in any command ends as one `error: ...` line."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; with `standalone_mode=False` errors are raised as click raises them."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()  # the help text, not an error
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            _fail(exc.format_message(), EXIT_BAD_INPUT)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail("aborted")
        except Exception as exc:
            from agent_runner import AgentRunnerError

            if isinstance(exc, AgentRunnerError):
                _fail(str(exc), _exit_code(exc), getattr(exc, "errors", ()))
            # An error no layer turned into a typed one: still one line, never a traceback.
            _fail(f"{type(exc).__name__}: {exc}")
        sys.exit(result if isinstance(result, int) else 0)


class _Seconds(click.FloatRange):
    """A number of seconds in a range; NaN and infinity are refused (a plain FloatRange lets NaN through)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Convert like FloatRange, then refuse what is not finite."""
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


class _TurnStatus(click.ParamType[str, Any]):
    """A turn status, in any case; the statuses are read from the runner only when one is needed."""

    name = "status"

    @staticmethod
    def values() -> list[str]:
        """Every turn status."""
        from agent_runner import AgentTurnStatus

        return [status.value for status in AgentTurnStatus]

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        """The statuses, as `--help` of the command shows them."""
        return "[" + "|".join(self.values()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Return the status in upper case; refuse one that does not exist."""
        if isinstance(value, str) and value.upper() in self.values():
            return value.upper()
        self.fail(f"{value!r} is not one of {', '.join(self.values())}", param, ctx)


def _unusable_url(url: str, error: Exception) -> NoReturn:
    _fail(f"cannot use --database-url {url!r}: {type(error).__name__}: {error}", EXIT_BAD_INPUT)


def _fail_with(error: AgentRunnerError) -> NoReturn:
    """Exit for a runner error: 2 for bad input (unknown turn, a command that does not fit), else 1."""
    _fail(str(error), _exit_code(error), getattr(error, "errors", ()))


class _Context:
    """What the commands share: the database URL and where it came from, the agents, the runner.

    Commands that act on turns (`resume`, `cancel`) use the runner the deployment uses:
    with a broker configured (`CELERY_BROKER_URL` set, or a database other than SQLite)
    the Celery wiring of `workers.wiring.build_wiring` (dispatching runner, Redis guard),
    so a resumed turn is enqueued for the workers at once and a cancel frees the
    conversation's Redis mark; otherwise the embedded runner on the SQL store. Both get
    `AGENT_RUNNER_SETUP` applied.
    """

    def __init__(self, database_url: str, agents: str | None, as_json: bool, url_source: str = "") -> None:
        self.database_url = database_url
        self.agents = agents
        self.as_json = as_json
        self.url_source = url_source
        self._runner: AgentRunner | None = None
        self._database: Database | None = None
        self._closers: list[Callable[[], object]] = []

    @property
    def shown_url(self) -> str:
        """The database URL with its password masked, and where it came from."""
        from store._redaction import mask_url_secrets

        shown = mask_url_secrets(self.database_url)
        return f"{shown} ({self.url_source})" if self.url_source else shown

    def uses_broker(self) -> bool:
        """Whether the deployment runs Celery workers: a broker is configured, or the database is not SQLite."""
        return bool(os.environ.get("CELERY_BROKER_URL", "").strip()) or not self.database_url.startswith("sqlite")

    def settings(self) -> WorkerSettings:
        """The deployment's settings, with this command line's database and agents."""
        from workers.settings import SettingsError, WorkerSettings

        environ = {**os.environ, "AGENT_RUNNER_DATABASE_URL": self.database_url}
        if self.agents:
            environ["AGENT_RUNNER_AGENT_LOADER"] = self.agents
        try:
            return WorkerSettings.from_env(environ)
        except SettingsError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)

    def require_database(self) -> None:
        """Refuse to go on against a SQLite file that does not exist (a read would create an empty one)."""
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        from store._redaction import check_password_encoding

        try:
            check_password_encoding(self.database_url)
            url = make_url(self.database_url)
        except (ArgumentError, ValueError) as exc:
            _unusable_url(self.database_url, exc)
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return
        if not os.path.exists(url.database):
            _fail(
                f"no database at {self.shown_url}: the file {url.database} does not exist. "
                "Point --database-url (or AGENT_RUNNER_DATABASE_URL) at your database; "
                "`agent-runner db upgrade` creates a new one.",
                EXIT_BAD_INPUT,
            )

    def database(self) -> Database:
        """The database and its SQL backends, opened once as every process opens it (`workers.database`).

        A SQLite file that does not exist is created and migrated; commands on existing
        turns call `require_database` first.
        """
        if self._database is None:
            from agent_runner import AgentRunnerError
            from store import SchemaVersionError
            from store._redaction import check_password_encoding
            from workers.database import open_database

            try:
                check_password_encoding(self.database_url)  # a ValueError: bad input, below
                self._database = open_database(self.database_url)
            except SchemaVersionError as exc:  # names the database and `agent-runner db upgrade`
                _fail(str(exc))
            except AgentRunnerError as exc:
                _fail(f"{exc} (database {self.shown_url})", _exit_code(exc))
            except Exception as exc:  # a URL SQLAlchemy cannot parse or has no driver for
                _unusable_url(self.database_url, exc)
            self._closers.append(self._database.close)
        return self._database

    def turn_store(self) -> SqlAgentTurnStore:
        """The SQL turn store, for reading (an existing database at the schema this code needs)."""
        self.require_database()
        return self.database().turn_store

    def loader(self) -> AgentLoader:
        """The agents named by --agents (or AGENT_RUNNER_AGENT_LOADER); none when unset."""
        from workers.agents import load_agent_loader
        from workers.settings import SettingsError

        try:
            return load_agent_loader(self.agents)
        except SettingsError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)

    def runner(self) -> AgentRunner:
        """The runner `resume` and `cancel` act through (see the class docstring)."""
        if self._runner is None:
            self.require_database()
            self._runner = self._wired_runner() if self.uses_broker() else self.embedded_runner()
        return self._runner

    def embedded_runner(self) -> AgentRunner:
        """A runner on the SQL store that works in this process (SQLite migrates itself)."""
        from agent_runner import AgentRunner
        from workers.agents import apply_runner_setup
        from workers.settings import SettingsError

        settings = self.settings()
        loader = self.loader()
        database = self.database()
        runner = AgentRunner(
            turn_store=database.turn_store,
            agent_loader=loader,
            chat_memory_provider=database.memories,
            policy=settings.policy(),
        )
        try:
            return apply_runner_setup(runner, settings.runner_setup)
        except SettingsError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)

    def _wired_runner(self) -> AgentRunner:
        from agent_runner import AgentRunnerError
        from workers.celery_app.config import create_app
        from workers.settings import SettingsError
        from workers.wiring import build_wiring

        settings = self.settings()
        try:
            wiring = build_wiring(settings, create_app(settings))
        except SettingsError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
        except AgentRunnerError as exc:
            _fail(f"{exc} (database {self.shown_url})", _exit_code(exc))
        self._closers.append(wiring.close)
        return wiring.runner

    def close(self) -> None:
        """Close what the commands opened (pools, Redis clients)."""
        for close in reversed(self._closers):
            try:
                close()
            except Exception:  # closing is best effort on the way out
                pass
        self._closers.clear()

    def emit(self, data: Any, human: Callable[[], None]) -> None:
        if self.as_json:
            click.echo(json.dumps(data, indent=2, default=str))
        else:
            human()


pass_context = click.make_pass_decorator(_Context)


@click.group(cls=_Commands)
@click.option(
    "--database-url",
    envvar="AGENT_RUNNER_DATABASE_URL",
    default=DEFAULT_DATABASE_URL,
    show_default=True,
    help="SQLAlchemy URL of the turn store.",
)
@click.option("--agents", envvar="AGENT_RUNNER_AGENT_LOADER", default=None, help="module:attribute of the agents.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.pass_context
def main(ctx: click.Context, database_url: str, agents: str | None, as_json: bool) -> None:
    """Operate agent-runner turns: inspect, resume, cancel, migrate, run a worker.

    Exit status: 0 done; 2 bad input, or a command that does not fit the turn (a cancel of
    a turn that has ended); 1 the database or another service failed.
    """
    source = ctx.get_parameter_source("database_url")
    origin = (
        {
            click.core.ParameterSource.COMMANDLINE: "from --database-url",
            click.core.ParameterSource.ENVIRONMENT: "from AGENT_RUNNER_DATABASE_URL",
            click.core.ParameterSource.DEFAULT: "the default",
        }.get(source, "")
        if source is not None
        else ""
    )
    ctx.obj = _Context(database_url, agents, as_json, origin)
    ctx.call_on_close(ctx.obj.close)


@main.command()
def demo() -> None:
    """Run the support-desk demo on a temporary SQLite file."""
    from workers.demo import main as run_demo

    sys.exit(run_demo([]))


@main.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@pass_context
def db_upgrade(obj: _Context) -> None:
    """Migrate the database to the newest schema (idempotent), and say what was done."""
    from agent_runner import AgentRunnerError
    from store import migrate

    try:
        done = migrate(obj.database_url)
    except AgentRunnerError as exc:
        _fail(str(exc))
    except Exception as exc:
        _unusable_url(obj.database_url, exc)
    data = {"upgraded": done.changed, "from_revision": done.before, "to_revision": done.after}
    obj.emit(data, lambda: click.echo(f"{done.describe()} ({obj.shown_url})"))


@main.command()
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=64,
    show_default=True,
    help="Stepping threads: turns in flight at once (a turn waiting on its model holds one).",
)
@click.option(
    "--lease-ttl",
    type=_Seconds(0.1, 3600.0),
    default=30.0,
    show_default=True,
    help="Seconds a turn lease lasts without renewal.",
)
@click.option(
    "--poll-interval",
    type=_Seconds(0.01, 3600.0),
    default=0.5,
    show_default=True,
    help="Seconds between polls when idle.",
)
@click.option(
    "--run-for",
    type=_Seconds(0.0, None),
    default=None,
    help="Stop after this many seconds (default: until Ctrl-C).",
)
@pass_context
def worker(obj: _Context, concurrency: int, lease_ttl: float, poll_interval: float, run_for: float | None) -> None:
    """Run the embedded AgentWorker (SQL leases, no Redis or Celery needed).

    Besides stepping turns it does what beat and the Celery tasks do for a Celery
    deployment: it applies approval and form deadlines and their reminders (every
    AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S seconds), starts queued inbox messages when
    their conversation frees, and fires the scheduled turns of AGENT_RUNNER_SCHEDULES
    (each tick starts one turn, however many processes fire it).
    """
    from agent_runner.worker import AgentWorker
    from store import SqlTurnLease
    from workers.inbox import INBOX_SWEEP_INTERVAL_S, InboxPump
    from workers.telemetry import WORKER_SERVICE_NAME, instrument
    from workers.telemetry.logs import configure_service_logging
    from workers.telemetry.metrics import start_metrics_server
    from workers.webhooks import build_deliverer

    settings = obj.settings()
    runner = obj.embedded_runner()
    database = obj.database()
    pump = InboxPump(runner, database.inbox, settings.inbox_agent, INBOX_SWEEP_INTERVAL_S)
    runner.add_event_listener(pump.on_event)
    scheduler = _scheduler(runner, database, settings.schedules, pump.notify)
    embedded = AgentWorker(
        runner,
        lease=SqlTurnLease(database.engine),
        concurrency=concurrency,
        lease_ttl=lease_ttl,
        poll_interval=poll_interval,
        deadline_interval=settings.deadline_sweep_interval_s,
    )
    # Spans, metrics and the log context of every step, as `serve` and the Celery workers have them.
    configure_service_logging()
    instrument(runner, service_name=WORKER_SERVICE_NAME)
    port = settings.metrics_port
    metrics_server = None if port is None else start_metrics_server(port, settings.metrics_addr)
    names = ", ".join(schedule.name for schedule in scheduler.schedules) if scheduler is not None else ""
    firing = f", firing schedules {names}" if names else ""
    if metrics_server is not None:
        firing += f", metrics on http://{metrics_server.addr}:{metrics_server.port}/metrics"
    click.echo(
        f"worker {embedded.owner} stepping turns with {concurrency} thread(s){firing}; Ctrl-C or SIGTERM stops",
        err=True,
    )
    # SIGTERM (docker stop, systemd, Kubernetes) stops as gracefully as Ctrl-C: steps in flight finish.
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    deliverer = build_deliverer(settings.webhooks, database.engine)
    embedded.start()
    pump.start()
    if scheduler is not None:
        scheduler.start()
    if deliverer is not None:
        deliverer.start()
    try:
        deadline = None if run_for is None else time.monotonic() + run_for
        while not stopping.is_set() and (deadline is None or time.monotonic() < deadline):
            stopping.wait(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if deliverer is not None:
            deliverer.stop()
        if scheduler is not None:
            scheduler.stop()
        pump.stop()
        embedded.stop()
        if metrics_server is not None:
            metrics_server.close()


def _scheduler(
    runner: AgentRunner, database: Database, spec: str | None, notify_inbox: Callable[[str], object]
) -> Scheduler | None:
    """The scheduler of `AGENT_RUNNER_SCHEDULES` (None when unset); schedules that cannot be loaded end the command."""
    if spec is None:
        return None
    from workers.embedded_timers import build_scheduler
    from workers.schedules import ScheduleError

    try:
        return build_scheduler(runner, database.inbox, spec, notify_inbox=notify_inbox)
    except ScheduleError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@main.command()
@click.option(
    "--agents", "agents_spec", default=None, help="module:attribute of the agents (default: --agents of the group)."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option(
    "--worker",
    "worker_mode",
    type=click.Choice(["embedded", "celery", "none"]),
    default=None,
    help="Who steps turns: threads in this process, Celery workers, or nobody here "
    "(default: AGENT_RUNNER_API_WORKER, else embedded on SQLite and celery otherwise).",
)
@click.option("--concurrency", type=click.IntRange(1, 64), default=None, help="Threads of the embedded worker.")
@pass_context
def serve(
    obj: _Context, agents_spec: str | None, host: str, port: int, worker_mode: str | None, concurrency: int | None
) -> None:
    """Serve the HTTP API (and the console) for web apps; see docs/http-api.md."""
    from agent_runner import AgentRunnerError
    from workers.agents import load_agent_loader
    from workers.settings import SettingsError

    try:
        import uvicorn  # noqa: F401 - checked here, so that a missing extra is one clear line

        from workers.api import ApiSettings, WorkerMode, create_app
        from workers.api.app import run_server
        from workers.telemetry.logs import configure_service_logging
    except ImportError as exc:
        _fail(f"serving needs the api extra (pip install 'agent-runner[api]'): {exc}", EXIT_BAD_INPUT)
    spec = agents_spec or obj.agents
    if not spec:
        _fail("give the agents to serve with --agents module:attribute (or AGENT_RUNNER_AGENT_LOADER)", EXIT_BAD_INPUT)
    try:
        loader = load_agent_loader(spec)
    except SettingsError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    try:
        settings = ApiSettings.from_env({**os.environ, "AGENT_RUNNER_DATABASE_URL": obj.database_url})
    except AgentRunnerError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    if not settings.keys.enabled and not _is_loopback(host):
        _fail(
            f"refusing to listen on {host}: without AGENT_RUNNER_API_KEYS the API has no authentication, "
            "so it only listens on a loopback address (127.0.0.1, ::1, localhost). Set "
            "AGENT_RUNNER_API_KEYS='tenant:key,...' to serve other hosts.",
            EXIT_BAD_INPUT,
        )
    if concurrency is not None:
        settings = dataclasses.replace(settings, worker_concurrency=concurrency)
    app = create_app(settings, agents=loader, worker=WorkerMode(worker_mode) if worker_mode else None)
    mode = app.state.settings.worker_mode.value
    click.echo(f"agent-runner API on http://{host}:{port} (docs at /docs, worker: {mode})", err=True)
    configure_service_logging()
    run_server(app, host, port)


@main.group()
def turns() -> None:
    """Inspect turns."""


@turns.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=_TurnStatus(),
    help="Only turns in this status (repeatable).",
)
@click.option("--conversation", default=None, help="Only turns of this conversation (TENANT/ID: a tenant's).")
@click.option(
    "--limit", type=click.IntRange(1, MAX_LIST_LIMIT), default=50, show_default=True, help="Most turns to list."
)
@pass_context
def turns_list(obj: _Context, statuses: tuple[str, ...], conversation: str | None, limit: int) -> None:
    """List turns, most recently updated first."""
    from agent_runner import AgentTurnStatus
    from agent_runner.limits import check_conversation_id
    from workers.views import turn_summary

    if conversation is not None:
        check_conversation_id(conversation, "--conversation")
    found = obj.turn_store().list_turns(
        statuses=[AgentTurnStatus(s.upper()) for s in statuses] or None, conversation_id=conversation, limit=limit
    )

    def human() -> None:
        if not found:
            click.echo(f"no turns in {obj.shown_url}")
        for turn in found:
            click.echo(f"{turn.id}  {turn.status.value:<22} {turn.agent_id:<20} {turn.updated_at:%Y-%m-%d %H:%M:%S}")

    obj.emit([turn_summary(t) for t in found], human)


def _load(obj: _Context, turn_id: str) -> AgentTurn:
    from agent_runner import AgentRunnerError
    from agent_runner.limits import check_id

    check_id(turn_id, "TURN_ID")
    try:
        return obj.turn_store().load(turn_id)
    except AgentRunnerError as exc:
        _fail_with(exc)


@turns.command("show")
@click.argument("turn_id")
@pass_context
def turns_show(obj: _Context, turn_id: str) -> None:
    """Show a turn: status, suspension and history (tool arguments are not shown)."""
    from workers.views import decisions_view, find_agent, history_view, turn_view

    turn = _load(obj, turn_id)
    suspension = turn.suspension
    data = {
        **turn_view(turn, find_agent(obj.loader(), turn)),
        "decisions": decisions_view(turn),
        "history": history_view(turn),
    }

    def human() -> None:
        click.echo(f"turn {turn.id}  ({turn.agent_id} v{turn.agent_version})")
        click.echo(f"  status   {turn.status.value}  phase {turn.phase.value}  version {turn.version}")
        if turn.error:
            click.echo(f"  error    {turn.error}")
        if suspension is not None:
            click.echo(
                f"  waiting  {suspension.type.value} on {suspension.correlation_id or '-'}: {suspension.message}"
            )
            if suspension.deadline is not None and suspension.on_timeout is not None:
                click.echo(f"  deadline {suspension.deadline.isoformat()}, then {suspension.on_timeout.value}")
            if suspension.form is not None:
                click.echo("  form schema " + json.dumps(suspension.form.schema))
        if data["decisions"]:
            click.echo("  decisions")
        for item in data["decisions"]:
            click.echo("    " + _decision_line(item))
        click.echo("  history")
        for item in data["history"]:
            extra = f" -> {', '.join(item['tool_calls'])}" if item.get("tool_calls") else ""
            click.echo(f"    {item['role']:<9} {item.get('content') or ''}{extra}")

    obj.emit(data, human)


def _decision_line(item: dict[str, Any]) -> str:
    """`approval c2 (deploy): APPROVED by u-100 at 2027-01-11T10:00:00+00:00 - reason`."""
    subject = item.get("tool_name") or item.get("form_key") or "-"
    line = f"{item['kind']} {item['action_id']} ({subject}): {item['status']}"
    if item.get("decided_by"):
        line += f" by {item['decided_by']}"
    if item.get("decided_at"):
        line += f" at {item['decided_at']}"
    if item.get("reason"):
        line += f" - {item['reason']}"
    return line


def _by_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--by",
        "by",
        metavar="NAME",
        default=None,
        help="Who decides, recorded with the decision (default: $USER).",
    )(function)


def _decider(by: str | None) -> str:
    """Who takes a decision: `--by`, else `$USER`; refused rather than recorded as nobody."""
    from agent_runner.limits import DEFAULT_LIMITS, check_text

    name = by if by is not None else os.environ.get("USER", "")
    if not name.strip():
        source = "--by is empty" if by is not None else "$USER is not set"
        _fail(f"say who decides: {source}; pass --by NAME", EXIT_BAD_INPUT)
    check_text(name, "--by", DEFAULT_LIMITS.max_message_bytes)
    return name


@main.command()
@click.argument("turn_id")
@click.option("--approve", "approve", metavar="CALL", default=None, help="Approve the pending tool call CALL.")
@click.option("--reject", "reject", metavar="CALL", default=None, help="Reject the pending tool call CALL.")
@click.option(
    "--mark-done",
    "mark_done",
    nargs=2,
    metavar="CALL RESULT",
    default=None,
    help="Settle CALL, whose outcome is unknown, as done with RESULT as its result.",
)
@click.option(
    "--reason",
    default=None,
    help="Why, recorded with the decision of --approve, --reject or --mark-done "
    f"(the model reads a rejection's; default for --reject: {REJECT_REASON!r}).",
)
@click.option("--input", "text", metavar="TEXT", default=None, help="Answer a plain-text question.")
@click.option("--form", "form", nargs=2, metavar="CALL JSON", default=None, help="Submit form data for CALL.")
@click.option("--retry", is_flag=True, help="Retry a RETRY_SCHEDULED turn now.")
@click.option("--run", "run_now", is_flag=True, help="Continue the turn in this process (needs --agents).")
@_by_option
@pass_context
def resume(
    obj: _Context,
    turn_id: str,
    approve: str | None,
    reject: str | None,
    mark_done: tuple[str, str] | None,
    reason: str | None,
    text: str | None,
    form: tuple[str, str] | None,
    retry: bool,
    run_now: bool,
    by: str | None,
) -> None:
    """Resume a waiting turn; by default it is saved runnable for a worker to continue.

    A decision (--approve, --reject, --mark-done) is recorded as taken by --by (default
    $USER; with neither the command refuses), with --reason as why; `turns show` and the
    HTTP API show both.
    """
    from agent_runner import AgentRunnerError
    from agent_runner.limits import DEFAULT_LIMITS, check_text
    from workers.views import ResumeAction, resume_command, turn_summary

    chosen = [x for x in (approve, reject, mark_done, text, form, retry or None) if x is not None]
    if len(chosen) != 1:
        _fail("give exactly one of --approve, --reject, --mark-done, --input, --form, --retry", EXIT_BAD_INPUT)
    operator = _decider(by)
    if reason is not None:
        if approve is None and reject is None and mark_done is None:
            _fail("--reason goes with --approve, --reject or --mark-done", EXIT_BAD_INPUT)
        check_text(reason, "--reason", DEFAULT_LIMITS.max_message_bytes)
    data: dict[str, Any] | None = None
    if form is not None:
        try:
            data = json.loads(form[1], parse_constant=_not_json)
        except RecursionError:
            _fail("--form data is nested too deeply", EXIT_BAD_INPUT)
        except ValueError as exc:  # JSONDecodeError, and numbers too long to convert
            _fail(f"--form data is not valid JSON: {exc}", EXIT_BAD_INPUT)
        if not isinstance(data, dict):
            _fail("--form data must be a JSON object", EXIT_BAD_INPUT)
    if approve is not None:
        command = resume_command(ResumeAction.APPROVE, tool_call_id=approve, reason=reason)
    elif reject is not None:
        command = resume_command(ResumeAction.REJECT, tool_call_id=reject, reason=reason or REJECT_REASON)
    elif mark_done is not None:
        command = resume_command(
            ResumeAction.TOOL_RESULT, tool_call_id=mark_done[0], content=mark_done[1], reason=reason
        )
    elif text is not None:
        command = resume_command(ResumeAction.INPUT, content=text)
    elif form is not None:
        command = resume_command(ResumeAction.FORM, tool_call_id=form[0], data=data)
    else:
        command = resume_command(ResumeAction.RETRY)
    # `decided_by` is what the page card and `turns show` report as the decider.
    command = command.with_metadata("channel", "cli").with_metadata("operator", operator)
    command = command.with_metadata("decided_by", operator)
    runner = obj.runner()
    try:
        turn = runner.resume(turn_id, command) if run_now else runner.submit_resume(turn_id, command)
    except AgentRunnerError as exc:
        _fail_with(exc)
    obj.emit(turn_summary(turn), lambda: click.echo(f"turn {turn.id} is {turn.status.value}"))


@main.command()
@click.argument("turn_id")
@click.option("--reason", default=None, help="Reason recorded in the close-out (default: the policy's).")
@_by_option
@pass_context
def cancel(obj: _Context, turn_id: str, reason: str | None, by: str | None) -> None:
    """Cancel a turn and its children (a running turn stops at its next boundary).

    The pending approval and form cards of a turn that ends at once are settled as
    decided by --by (default $USER; with neither the command refuses). A turn that has
    already ended exits 2, as any command that does not fit the turn.
    """
    from agent_runner import AgentRunnerError, AgentTurnStatus
    from agent_runner.limits import DEFAULT_LIMITS, check_id, check_text
    from workers.views import turn_summary

    check_id(turn_id, "TURN_ID")
    if reason is not None:
        check_text(reason, "--reason", DEFAULT_LIMITS.max_message_bytes)
    operator = _decider(by)
    try:
        runner = obj.runner()
        ended_before = runner.turn_store.get_ref(turn_id).status.is_terminal
        turn = runner.cancel(turn_id, reason, cancelled_by=operator)
    except AgentRunnerError as exc:
        _fail_with(exc)
    if ended_before or (turn.is_terminal and turn.status is not AgentTurnStatus.CANCELLED):
        _fail(f"turn {turn.id!r} has already ended ({turn.status.value}); there is nothing to cancel", EXIT_BAD_INPUT)
    message = "cancel requested; it stops at its next boundary" if turn.status is AgentTurnStatus.RUNNING else ""
    obj.emit(turn_summary(turn), lambda: click.echo(f"turn {turn.id} is {turn.status.value} {message}".rstrip()))


def parse_age(text: str) -> timedelta:
    """Return the duration written as a positive number with a unit: `90s`, `15m`, `12h`, `30d`.

    Raises:
        ValueError: The text is not such a duration.
    """
    match = _AGE.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"--older-than expects a positive number followed by s, m, h or d (such as 30d), got {text!r}")
    return timedelta(**{_AGE_UNITS[match.group(2)]: int(match.group(1))})


@main.command()
@click.option("--older-than", "older_than", required=True, metavar="AGE", help="Age such as 30d, 12h, 15m or 90s.")
@click.option("--batch-size", default=500, show_default=True, help="Turn trees deleted per transaction.")
@pass_context
def prune(obj: _Context, older_than: str, batch_size: int) -> None:
    """Delete turns that ended more than AGE ago, with their messages and events; active turns stay."""
    from agent_runner import AgentRunnerError

    try:
        age = parse_age(older_than)
    except ValueError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    if batch_size < 1:
        _fail(f"--batch-size must be at least 1, got {batch_size}", EXIT_BAD_INPUT)
    turn_store = obj.turn_store()
    try:
        removed = turn_store.prune(age, batch_size=batch_size)
    except AgentRunnerError as exc:
        _fail(str(exc))
    obj.emit(
        {"pruned_turns": removed, "older_than": older_than},
        lambda: click.echo(f"pruned {removed} turn(s) that ended more than {older_than} ago"),
    )


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


SCHEDULERS = (
    "fired by every `agent-runner worker` and `agent-runner serve` (worker embedded) on the database, "
    "or by `celery -A workers.app beat` in a Celery deployment; each tick starts one turn"
)
"""Which processes fire the scheduled turns, as `schedules list` says."""


@main.group()
def schedules() -> None:
    """Scheduled turns, fired by `agent-runner worker`, `agent-runner serve` (embedded) or Celery beat."""


@schedules.command("list")
@click.option(
    "--schedules",
    "spec",
    envvar="AGENT_RUNNER_SCHEDULES",
    default=None,
    help="A .yaml/.json file or module:attribute of the schedules (default: AGENT_RUNNER_SCHEDULES).",
)
@pass_context
def schedules_list(obj: _Context, spec: str | None) -> None:
    """List the scheduled turns and when each runs next."""
    from workers.schedules import ScheduleError, load_schedules

    try:
        found = load_schedules(spec)
    except ScheduleError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    now = datetime.now(UTC)
    rows = [{**schedule.to_dict(), "next_run": schedule.next_run(now).isoformat()} for schedule in found]

    def human() -> None:
        if not found:
            click.echo("no schedules (set AGENT_RUNNER_SCHEDULES or pass --schedules)")
            return
        for schedule in found:
            upcoming = schedule.next_run(now)
            local = upcoming.astimezone(ZoneInfo(schedule.timezone))
            click.echo(
                f"{schedule.name:<24} {schedule.agent_id:<20} {schedule.describe():<36} "
                f"conversation {schedule.conversation_id or '-'}  if busy {schedule.if_busy}  "
                f"next {local:%Y-%m-%d %H:%M:%S %Z}"
            )
        click.echo(f"({SCHEDULERS})")

    obj.emit(rows, human)


if __name__ == "__main__":
    main()
