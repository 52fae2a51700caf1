"""The `events` and `debug` stream modes: what a turn did, in the shapes LangGraph Server sends.

`events` follows LangChain's `astream_events` (v2): each part is
`{"event", "name", "run_id", "tags", "metadata", "data", "parent_ids"}`. A turn is a chain
(`on_chain_start` with the user's message, `on_chain_end` with the thread's messages when it
completes), each model call a chat model (`on_chat_model_start`, `on_chat_model_stream` per
piece of text with `data.chunk` an `AIMessageChunk`, `on_chat_model_end` with the whole
message), each tool call a tool (`on_tool_start` with its masked arguments, `on_tool_end`
with its ToolMessage), and a tool's `report_progress` an `on_custom_event`. Run ids are
the turn id, `<turn id>:model-<n>` and the tool call id; `parent_ids` lists the enclosing
turns, outermost first. A model is named `model` (which provider answered is not in the
events); a tool by its name.

`debug` follows LangGraph's debug stream: `{"type", "timestamp", "step", "payload"}` with
`checkpoint` parts (the state after the turn started, after each model answer and tool
result, when it waits and when it ends other than completed: `values`, `next`, `tasks`, `config` with the
thread, and as `checkpoint_id` the id of the newest message, as the thread's state shows
it), `task` parts when a model call or a tool call starts, and `task_result` parts when one
ends (`result` is `[["messages", [message]]]`; `error` is the turn's error when the turn
failed during it). A model call is known once it streams or answers: a turn that fails in
its first call shows the error in its last checkpoint's task only. Steps count the turn's tasks: the input checkpoint is step -1, then
each model call and each tool call is the next step. There are no checkpoints inside
a task, and no checkpoint can be resumed from: a turn is the unit of history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_runner import AgentEvent, AgentTurn, Phase

MODEL_NODE = "model"
TOOLS_NODE = "tools"


def next_node(turn: AgentTurn) -> str:
    """The graph node a turn continues in: the model, or the tools of its recorded calls."""
    return MODEL_NODE if turn.phase is Phase.MODEL else TOOLS_NODE


def run_event(
    kind: str, name: str, run_id: str, data: dict[str, Any], metadata: dict[str, Any], parent_ids: list[str]
) -> dict[str, Any]:
    """One part of the `events` mode."""
    return {
        "event": kind,
        "name": name,
        "run_id": run_id,
        "tags": [],
        "metadata": metadata,
        "data": data,
        "parent_ids": parent_ids,
    }


@dataclass
class _Task:
    id: str
    name: str
    step: int


@dataclass
class DebugSteps:
    """The step counter and the running tasks of each turn of a run, for the `debug` mode.

    Args:
        thread_id: The thread as the client knows it.
    """

    thread_id: str
    _steps: dict[str, int] = field(default_factory=dict)
    _open: dict[str, dict[str, _Task]] = field(default_factory=dict)

    def _part(self, kind: str, moment: datetime, step: int, payload: dict[str, Any]) -> dict[str, Any]:
        return {"type": kind, "timestamp": moment.isoformat(), "step": step, "payload": payload}

    def task(self, event: AgentEvent, task_id: str, name: str, task_input: Any) -> dict[str, Any]:
        """A `task` part: the model call or tool call `task_id` started."""
        step = self._steps[event.turn_id] = self._steps.get(event.turn_id, -1) + 1
        self._open.setdefault(event.turn_id, {})[task_id] = _Task(task_id, name, step)
        payload = {"id": task_id, "name": name, "input": task_input, "triggers": [f"branch:to:{name}"]}
        return self._part("task", event.timestamp, step, payload)

    def task_result(
        self, event: AgentEvent, task_id: str, result: list[Any], error: str | None = None
    ) -> list[dict[str, Any]]:
        """The `task_result` part of a task `task` announced (none for a task it did not)."""
        task = self._open.get(event.turn_id, {}).pop(task_id, None)
        if task is None:
            return []
        payload = {"id": task.id, "name": task.name, "error": error, "result": result, "interrupts": []}
        return [self._part("task_result", event.timestamp, task.step, payload)]

    def failed(self, event: AgentEvent, error: str) -> list[dict[str, Any]]:
        """`task_result` parts with the error for every task still running when the turn failed."""
        running = list(self._open.get(event.turn_id, {}))
        return [part for task_id in running for part in self.task_result(event, task_id, [], error)]

    def checkpoint(
        self,
        event: AgentEvent,
        namespace: str,
        values: dict[str, Any],
        *,
        next_nodes: list[str],
        interrupts: list[dict[str, Any]] | None = None,
        error: str | None = None,
    ) -> dict[str, Any]:
        """A `checkpoint` part: the state `values` after `event`, with what runs next (and its error, if it failed)."""
        step = self._steps.get(event.turn_id, -1)
        messages = values.get("messages") or []
        config = {
            "configurable": {
                "thread_id": self.thread_id,
                "checkpoint_ns": namespace,
                "checkpoint_id": messages[-1]["id"] if messages else None,
            }
        }
        task: dict[str, Any] = {"error": error} if error is not None else {"interrupts": interrupts or []}
        tasks = [{"id": f"{event.turn_id}:{node}", "name": node, **task, "state": None} for node in next_nodes]
        payload = {
            "config": config,
            "parent_config": None,
            "values": values,
            "metadata": {"source": "input" if step < 0 else "loop", "step": step, "run_id": event.turn_id},
            "next": next_nodes,
            "tasks": tasks,
        }
        return self._part("checkpoint", event.timestamp, step, payload)
