"""The peer: workload W on LangGraph, a model node plus a ToolNode, checkpointed by PostgresSaver.

The graph is the usual tool-calling loop (`agent` -> `tools` -> `agent` ... -> END) over
`MessagesState`. The chat model is a scripted `BaseChatModel` that emits the same tool
calls as W's model, read from the last message alone. Every run uses durability "sync":
each superstep's checkpoint is written before the next superstep starts, which is what
"every stable boundary saved" means for LangGraph.

The approval path puts an `approval` node before the tools: it calls `interrupt()`, the
run stops with its checkpoint saved, and a graph compiled separately (holding nothing of
the first run) resumes it with `Command(resume=...)` until the end.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt
from psycopg import Connection
from psycopg.rows import dict_row

_call_numbers = itertools.count()


@lc_tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


@lc_tool
def refund(order_id: str) -> str:
    """Refund an order (needs a person's approval)."""
    return f"order {order_id}: refunded"


class ScriptedWorkloadModel(BaseChatModel):
    """W's model for LangChain: K `lookup` calls, one per response, then a final answer."""

    k: int = 10

    @property
    def _llm_type(self) -> str:
        return "scripted-workload"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        last = messages[-1]
        done = 0
        if isinstance(last, ToolMessage) and last.tool_call_id.startswith("w"):
            done = int(last.tool_call_id[1:].split("x", 1)[0]) + 1
        if done >= self.k:
            message = AIMessage(content="all orders shipped")
        else:
            call_id = f"w{done}x{next(_call_numbers)}"
            message = AIMessage(
                content="", tool_calls=[{"id": call_id, "name": "lookup", "args": {"order_id": str(done)}}]
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


class ScriptedApprovalModel(BaseChatModel):
    """One `refund` call, then a final answer once its result is in."""

    @property
    def _llm_type(self) -> str:
        return "scripted-approval"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            message = AIMessage(content="refund done")
        else:
            call = {"id": f"r{next(_call_numbers)}", "name": "refund", "args": {"order_id": "1001"}}
            message = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=message)])


def _route(state: MessagesState) -> Literal["next", "__end__"]:
    last = state["messages"][-1]
    return "next" if isinstance(last, AIMessage) and last.tool_calls else END


def workload_graph(k: int, checkpointer: PostgresSaver) -> Any:
    """W(K) as a LangGraph graph: `agent` (the model) and `tools` (a ToolNode) in a loop."""
    model = ScriptedWorkloadModel(k=k)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", _route, {"next": "tools", END: END})
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def approval_graph(checkpointer: PostgresSaver) -> Any:
    """`agent` -> `approval` (interrupts for a person's decision) -> `tools` -> `agent` -> END."""
    model = ScriptedApprovalModel()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def approval(state: MessagesState) -> dict[str, Any]:
        calls = state["messages"][-1].tool_calls
        decision = interrupt({"approve": [c["id"] for c in calls]})
        if decision != "approve":
            raise ValueError(f"unexpected decision {decision!r}")
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("approval", approval)
    graph.add_node("tools", ToolNode([refund]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", _route, {"next": "approval", END: END})
    graph.add_edge("approval", "tools")
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


@contextmanager
def postgres_saver(libpq_url: str) -> Iterator[PostgresSaver]:
    """A PostgresSaver on one connection, set up the way its documentation asks (autocommit, dict rows)."""
    with Connection.connect(libpq_url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as connection:
        saver = PostgresSaver(connection)
        saver.setup()
        yield saver


def new_thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": uuid.uuid4().hex}}


def run_turn(graph: Any, config: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
    """Run one turn of W to its end with durability "sync"; return (final state, steps = node runs)."""
    config = config or new_thread()
    steps = 0
    for _ in graph.stream(
        {"messages": [HumanMessage(content="check my orders")]}, config, stream_mode="updates", durability="sync"
    ):
        steps += 1
    return graph.get_state(config).values, steps


def stream_steps(graph: Any, config: dict[str, Any]) -> Iterator[Any]:
    """Yield after each superstep of a W turn (one node runs per superstep here)."""
    yield from graph.stream(
        {"messages": [HumanMessage(content="check my orders")]}, config, stream_mode="updates", durability="sync"
    )


def run_to_interrupt(graph: Any, config: dict[str, Any]) -> None:
    """Run the approval graph until it interrupts before the tool."""
    result = graph.invoke({"messages": [HumanMessage(content="refund order 1001")]}, config, durability="sync")
    if "__interrupt__" not in result:
        raise RuntimeError("the approval graph did not interrupt")


def resume(graph: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Resume an interrupted approval run with the person's decision and run it to the end."""
    result: dict[str, Any] = graph.invoke(Command(resume="approve"), config, durability="sync")
    return result


def stored_bytes(connection: Connection[Any], thread_id: str) -> int:
    """Bytes PostgresSaver stores for one thread (checkpoints, channel blobs and pending writes)."""
    total = 0
    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
        row = connection.execute(
            f"SELECT coalesce(sum(pg_column_size(t.*)), 0) AS n FROM {table} t WHERE thread_id = %s", (thread_id,)
        ).fetchone()
        assert row is not None
        total += int(row["n"] if isinstance(row, dict) else row[0])
    return total
