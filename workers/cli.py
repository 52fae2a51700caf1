"""The `agent-runner` command line: operate turns from a terminal.

Every command reads the database from `--database-url` or `AGENT_RUNNER_DATABASE_URL`
(default: the embedded SQLite file `./agent_runner.db`). Human-readable output by default,
`--json` for scripts. Every error is one `error: ...` line on standard error (form data
that fails its schema adds one `  - ...` line per schema error), never a traceback. The
exit status is 2 for bad input (an unknown turn, an invalid id, JSON or option value,
invalid form data, a command that does not fit the turn, arguments that are not UTF-8)
and 1 for failures of the infrastructure (the database cannot be reached, a store error).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, NoReturn

import click

from agent_runner import (
    AgentNotFound,
    AgentRunner,
    AgentRunnerError,
    AgentTurn,
    AgentTurnStatus,
    DefinitionError,
    InputLimitError,
    TurnError,
)
from agent_runner.limits import DEFAULT_LIMITS, check_id, check_text
from workers.agents import load_agent_loader
from workers.settings import DEFAULT_DATABASE_URL, SettingsError, mask_url_secrets
from workers.views import (
    ResumeAction,
    find_agent,
    history_view,
    resume_command,
    turn_summary,
    turn_view,
)

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1
MAX_LIST_LIMIT = 1000

_BAD_INPUT_ERRORS: tuple[type[AgentRunnerError], ...] = (
    TurnError,  # an unknown turn, a command that does not fit the turn
    InputLimitError,
    AgentNotFound,
    DefinitionError,
    SettingsError,
)
_AGE = re.compile(r"([0-9]{1,9})([smhd])")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _fail(message: str, code: int = EXIT_FAILURE, details: Iterable[str] = ()) -> NoReturn:
    click.echo(f"error: {_one_line(message)}", err=True)
    for line in details:
        click.echo(f"  - {_one_line(line)}", err=True)
    sys.exit(code)


def _one_line(text: str) -> str:
    """`text` on one line, passwords masked, and printable whatever bytes the arguments held."""
    text = " ".join(mask_url_secrets(text).split())
    try:
        # Arguments that were not UTF-8 reach Python as lone surrogates: show their bytes.
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _exit_code(error: AgentRunnerError) -> int:
    return EXIT_BAD_INPUT if isinstance(error, _BAD_INPUT_ERRORS) else EXIT_FAILURE


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
        except AgentRunnerError as exc:
            _fail(str(exc), _exit_code(exc), getattr(exc, "errors", ()))
        except Exception as exc:
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


def _unusable_url(url: str, error: Exception) -> NoReturn:
    _fail(f"cannot use --database-url {url!r}: {type(error).__name__}: {error}", EXIT_BAD_INPUT)


def _fail_with(error: AgentRunnerError) -> NoReturn:
    """Exit for a runner error: 2 for bad input (unknown turn, a command that does not fit), else 1."""
    _fail(str(error), _exit_code(error), getattr(error, "errors", ()))


class _Context:
    def __init__(self, database_url: str, agents: str | None, as_json: bool) -> None:
        self.database_url = database_url
        self.agents = agents
        self.as_json = as_json
        self._runner: AgentRunner | None = None

    def runner(self) -> AgentRunner:
        if self._runner is None:
            from store import SqlAgentTurnStore, SqlChatMemoryProvider

            try:
                loader = load_agent_loader(self.agents)
            except SettingsError as exc:
                _fail(str(exc), EXIT_BAD_INPUT)
            try:
                turn_store = SqlAgentTurnStore(self.database_url)
                chat_memory = SqlChatMemoryProvider(self.database_url)
            except AgentRunnerError:
                raise
            except Exception as exc:  # a URL SQLAlchemy cannot parse or has no driver for
                _unusable_url(self.database_url, exc)
            self._runner = AgentRunner(turn_store=turn_store, agent_loader=loader, chat_memory_provider=chat_memory)
        return self._runner

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
    """Operate agent-runner turns: inspect, resume, cancel, migrate, run a worker."""
    ctx.obj = _Context(database_url, agents, as_json)


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
    """Migrate the database to the newest schema (idempotent)."""
    from store import migrate

    try:
        migrate(obj.database_url)
    except AgentRunnerError as exc:
        _fail(str(exc))
    except Exception as exc:
        _unusable_url(obj.database_url, exc)
    obj.emit({"upgraded": True}, lambda: click.echo("database schema is up to date"))


@main.command()
@click.option("--concurrency", type=click.IntRange(1, 256), default=2, show_default=True, help="Stepping threads.")
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
    """Run the embedded AgentWorker (SQL leases, no Redis or Celery needed)."""
    from agent_runner.worker import AgentWorker
    from store import SqlTurnLease

    runner = obj.runner()
    embedded = AgentWorker(
        runner,
        lease=SqlTurnLease(obj.database_url),
        concurrency=concurrency,
        lease_ttl=lease_ttl,
        poll_interval=poll_interval,
    )
    click.echo(f"worker {embedded.owner} stepping turns with {concurrency} thread(s); Ctrl-C stops", err=True)
    embedded.start()
    try:
        deadline = None if run_for is None else time.monotonic() + run_for
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        embedded.stop()


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
    try:
        import uvicorn

        from workers.api import ApiSettings, WorkerMode, create_app
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
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)


@main.group()
def turns() -> None:
    """Inspect turns."""


@turns.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([s.value for s in AgentTurnStatus], case_sensitive=False),
    help="Only turns in this status (repeatable).",
)
@click.option("--conversation", default=None, help="Only turns of this conversation.")
@click.option(
    "--limit", type=click.IntRange(1, MAX_LIST_LIMIT), default=50, show_default=True, help="Most turns to list."
)
@pass_context
def turns_list(obj: _Context, statuses: tuple[str, ...], conversation: str | None, limit: int) -> None:
    """List turns, most recently updated first."""
    if conversation is not None:
        check_id(conversation, "--conversation")
    found = obj.runner().turn_store.list_turns(
        statuses=[AgentTurnStatus(s.upper()) for s in statuses] or None, conversation_id=conversation, limit=limit
    )

    def human() -> None:
        if not found:
            click.echo("no turns")
        for turn in found:
            click.echo(f"{turn.id}  {turn.status.value:<22} {turn.agent_id:<20} {turn.updated_at:%Y-%m-%d %H:%M:%S}")

    obj.emit([turn_summary(t) for t in found], human)


def _load(obj: _Context, turn_id: str) -> AgentTurn:
    check_id(turn_id, "TURN_ID")
    try:
        return obj.runner().turn_store.load(turn_id)
    except AgentRunnerError as exc:
        _fail_with(exc)


@turns.command("show")
@click.argument("turn_id")
@pass_context
def turns_show(obj: _Context, turn_id: str) -> None:
    """Show a turn: status, suspension and history (tool arguments are not shown)."""
    turn = _load(obj, turn_id)
    suspension = turn.suspension
    data = {**turn_view(turn, find_agent(obj.runner().agent_loader, turn)), "history": history_view(turn)}

    def human() -> None:
        click.echo(f"turn {turn.id}  ({turn.agent_id} v{turn.agent_version})")
        click.echo(f"  status   {turn.status.value}  phase {turn.phase.value}  version {turn.version}")
        if turn.error:
            click.echo(f"  error    {turn.error}")
        if suspension is not None:
            click.echo(
                f"  waiting  {suspension.type.value} on {suspension.correlation_id or '-'}: {suspension.message}"
            )
            if suspension.form is not None:
                click.echo("  form schema " + json.dumps(suspension.form.schema))
        click.echo("  history")
        for item in data["history"]:
            extra = f" -> {', '.join(item['tool_calls'])}" if item.get("tool_calls") else ""
            click.echo(f"    {item['role']:<9} {item.get('content') or ''}{extra}")

    obj.emit(data, human)


@main.command()
@click.argument("turn_id")
@click.option("--approve", "approve", metavar="CALL", default=None, help="Approve the pending tool call CALL.")
@click.option("--reject", "reject", metavar="CALL", default=None, help="Reject the pending tool call CALL.")
@click.option("--reason", default="rejected by the operator", show_default=True, help="Why, with --reject.")
@click.option("--input", "text", metavar="TEXT", default=None, help="Answer a plain-text question.")
@click.option("--form", "form", nargs=2, metavar="CALL JSON", default=None, help="Submit form data for CALL.")
@click.option("--retry", is_flag=True, help="Retry a RETRY_SCHEDULED turn now.")
@click.option("--run", "run_now", is_flag=True, help="Continue the turn in this process (needs --agents).")
@pass_context
def resume(
    obj: _Context,
    turn_id: str,
    approve: str | None,
    reject: str | None,
    reason: str,
    text: str | None,
    form: tuple[str, str] | None,
    retry: bool,
    run_now: bool,
) -> None:
    """Resume a waiting turn; by default it is saved runnable for a worker to continue."""
    chosen = [x for x in (approve, reject, text, form, retry or None) if x is not None]
    if len(chosen) != 1:
        _fail("give exactly one of --approve, --reject, --input, --form, --retry", EXIT_BAD_INPUT)
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
        command = resume_command(ResumeAction.APPROVE, tool_call_id=approve)
    elif reject is not None:
        command = resume_command(ResumeAction.REJECT, tool_call_id=reject, reason=reason)
    elif text is not None:
        command = resume_command(ResumeAction.INPUT, content=text)
    elif form is not None:
        command = resume_command(ResumeAction.FORM, tool_call_id=form[0], data=data)
    else:
        command = resume_command(ResumeAction.RETRY)
    command = command.with_metadata("channel", "cli").with_metadata("operator", os.environ.get("USER", "unknown"))
    runner = obj.runner()
    try:
        turn = runner.resume(turn_id, command) if run_now else runner.submit_resume(turn_id, command)
    except AgentRunnerError as exc:
        _fail_with(exc)
    obj.emit(turn_summary(turn), lambda: click.echo(f"turn {turn.id} is {turn.status.value}"))


@main.command()
@click.argument("turn_id")
@click.option("--reason", default=None, help="Reason recorded in the close-out (default: the policy's).")
@pass_context
def cancel(obj: _Context, turn_id: str, reason: str | None) -> None:
    """Cancel a turn and its children (a running turn stops at its next boundary)."""
    check_id(turn_id, "TURN_ID")
    if reason is not None:
        check_text(reason, "--reason", DEFAULT_LIMITS.max_message_bytes)
    try:
        turn = obj.runner().cancel(turn_id, reason)
    except AgentRunnerError as exc:
        _fail_with(exc)
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
    try:
        age = parse_age(older_than)
    except ValueError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    if batch_size < 1:
        _fail(f"--batch-size must be at least 1, got {batch_size}", EXIT_BAD_INPUT)
    from store import SqlAgentTurnStore

    try:
        with SqlAgentTurnStore(obj.database_url) as turn_store:
            removed = turn_store.prune(age, batch_size=batch_size)
    except AgentRunnerError as exc:
        _fail(str(exc))
    obj.emit(
        {"pruned_turns": removed, "older_than": older_than},
        lambda: click.echo(f"pruned {removed} turn(s) that ended more than {older_than} ago"),
    )


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


if __name__ == "__main__":
    main()
