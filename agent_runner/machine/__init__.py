"""The pure turn state machine: snapshot in, new snapshot out, no I/O.

`plan_step` decides what the next step must do; the `apply_*` functions fold the outcome
of that work (a model response, a tool result, an error, a resume command) into a new
snapshot. The runner (`agent_runner.runner`) is the shell that performs the work, saves
the snapshots and emits events. Every status change goes through `transition`, which
checks it against `TRANSITIONS`.

The modules: `_transitions` (statuses and moves), `_ids` (deterministic ids), `_plans`
(what to run next), `_results` (folding outcomes in), `_decisions` (who decided a page
action), `_resumes` (one function per resume command type).
"""

from agent_runner.machine._decisions import DECIDER_METADATA_KEYS, SYSTEM_DECIDER
from agent_runner.machine._ids import child_turn_id, page_message_id
from agent_runner.machine._plans import (
    FORM_SOURCE_TOOL,
    CallModel,
    ExecuteTool,
    ReconcileTool,
    SpawnChildren,
    StepPlan,
    Suspend,
    Terminate,
    WriteToolResult,
    form_suspension,
    plan_step,
)
from agent_runner.machine._results import (
    LIMIT_WAIT_REASON,
    OPERATION_WAIT_REASON,
    apply_children_spawned,
    apply_model_response,
    apply_reminder,
    apply_steering,
    apply_suspension,
    apply_tool_result,
    close_out,
    closed_calls,
    mark_started,
    schedule_limit_wait,
    schedule_operation_wait,
    schedule_retry,
    start_running,
    storable_message,
    unmark_started,
)
from agent_runner.machine._resumes import apply_resume
from agent_runner.machine._transitions import SUSPENSION_STATUS, TRANSITIONS

__all__ = [
    "DECIDER_METADATA_KEYS",
    "FORM_SOURCE_TOOL",
    "LIMIT_WAIT_REASON",
    "OPERATION_WAIT_REASON",
    "SUSPENSION_STATUS",
    "SYSTEM_DECIDER",
    "TRANSITIONS",
    "CallModel",
    "ExecuteTool",
    "ReconcileTool",
    "SpawnChildren",
    "StepPlan",
    "Suspend",
    "Terminate",
    "WriteToolResult",
    "apply_children_spawned",
    "apply_model_response",
    "apply_reminder",
    "apply_steering",
    "apply_resume",
    "apply_suspension",
    "apply_tool_result",
    "child_turn_id",
    "close_out",
    "closed_calls",
    "form_suspension",
    "mark_started",
    "page_message_id",
    "plan_step",
    "schedule_limit_wait",
    "schedule_operation_wait",
    "schedule_retry",
    "start_running",
    "storable_message",
    "unmark_started",
]
