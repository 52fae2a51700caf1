"""`agent-runner turns list|show`, `resume` and `cancel`: inspect turns and decide for the waiting ones."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from workers.cli.common import EXIT_BAD_INPUT, fail, fail_with, json_object
from workers.cli.context import CliContext, pass_context

if TYPE_CHECKING:
    from agent_runner import AgentTurn

MAX_LIST_LIMIT = 1000
REJECT_REASON = "rejected by the operator"
"""The reason of a `resume --reject` given without `--reason`."""


class TurnStatusType(click.ParamType[str, Any]):
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


@click.group()
def turns() -> None:
    """Inspect turns."""


@turns.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=TurnStatusType(),
    help="Only turns in this status (repeatable).",
)
@click.option("--conversation", default=None, help="Only turns of this conversation (TENANT/ID: a tenant's).")
@click.option(
    "--limit", type=click.IntRange(1, MAX_LIST_LIMIT), default=50, show_default=True, help="Most turns to list."
)
@pass_context
def turns_list(obj: CliContext, statuses: tuple[str, ...], conversation: str | None, limit: int) -> None:
    """List turns, most recently updated first."""
    from agent_runner import AgentTurnStatus
    from agent_runner.limits import check_conversation_id, check_tenant_id
    from workers.views import turn_summary

    tenant_id = None
    if conversation is not None:
        # TENANT/ID names a tenant's conversation; a plain ID, one without a tenant.
        owner, separator, own = conversation.partition("/")
        if separator:
            tenant_id = check_tenant_id(owner, "--conversation")
            conversation = own
        conversation = check_conversation_id(conversation, "--conversation")
    found = obj.turn_store().list_turns(
        statuses=[AgentTurnStatus(s.upper()) for s in statuses] or None,
        conversation_id=conversation,
        tenant_id=tenant_id,
        limit=limit,
    )
    if conversation is not None:
        found = [turn for turn in found if turn.tenant_id == tenant_id]

    def human() -> None:
        if not found:
            click.echo(f"no turns in {obj.shown_url}")
        for turn in found:
            click.echo(f"{turn.id}  {turn.status.value:<22} {turn.agent_id:<20} {turn.updated_at:%Y-%m-%d %H:%M:%S}")

    obj.emit([turn_summary(t) for t in found], human)


def _load(obj: CliContext, turn_id: str) -> AgentTurn:
    from agent_runner import AgentRunnerError
    from agent_runner.limits import check_id

    check_id(turn_id, "TURN_ID")
    try:
        return obj.turn_store().load(turn_id)
    except AgentRunnerError as exc:
        fail_with(exc)


@turns.command("show")
@click.argument("turn_id")
@pass_context
def turns_show(obj: CliContext, turn_id: str) -> None:
    """Show a turn: status, suspension and history (tool arguments are not shown)."""
    from workers.views import decisions_view, find_agent, history_view, qualified_conversation, turn_view

    turn = _load(obj, turn_id)
    suspension = turn.suspension
    data = {
        **turn_view(turn, find_agent(obj.loader(), turn), show_conversation=qualified_conversation),
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
        fail(f"say who decides: {source}; pass --by NAME", EXIT_BAD_INPUT)
    check_text(name, "--by", DEFAULT_LIMITS.max_message_bytes)
    return name


@click.command()
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
    obj: CliContext,
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
        fail("give exactly one of --approve, --reject, --mark-done, --input, --form, --retry", EXIT_BAD_INPUT)
    operator = _decider(by)
    if reason is not None:
        if approve is None and reject is None and mark_done is None:
            fail("--reason goes with --approve, --reject or --mark-done", EXIT_BAD_INPUT)
        check_text(reason, "--reason", DEFAULT_LIMITS.max_message_bytes)
    data = json_object(form[1], "--form") if form is not None else None
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
        fail_with(exc)
    obj.emit(turn_summary(turn), lambda: click.echo(f"turn {turn.id} is {turn.status.value}"))


@click.command()
@click.argument("turn_id")
@click.option("--reason", default=None, help="Reason recorded in the close-out (default: the policy's).")
@_by_option
@pass_context
def cancel(obj: CliContext, turn_id: str, reason: str | None, by: str | None) -> None:
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
        fail_with(exc)
    if ended_before or (turn.is_terminal and turn.status is not AgentTurnStatus.CANCELLED):
        fail(f"turn {turn.id!r} has already ended ({turn.status.value}); there is nothing to cancel", EXIT_BAD_INPUT)
    message = "cancel requested; it stops at its next boundary" if turn.status is AgentTurnStatus.RUNNING else ""
    obj.emit(turn_summary(turn), lambda: click.echo(f"turn {turn.id} is {turn.status.value} {message}".rstrip()))
