"""agent-runner: durable, resumable LLM agent turns.

Run a turn in-process with `AgentRunner.run`, or `start` it and let a worker (the
embedded `AgentWorker` or the Celery workers in `workers`) advance it. A turn saves a
snapshot at every stable boundary, suspends without holding a thread when it needs a
person, a child turn or a delayed retry, and is resumed from any process.
"""

from agent_runner.agent import Agent, InMemoryAgentLoader
from agent_runner.errors import (
    AgentConversationBusyException,
    AgentNotFound,
    AgentRunnerError,
    DefinitionError,
    FormProtocolError,
    InputLimitError,
    InvalidCursorError,
    InvalidEventQueryError,
    InvalidResumeCommand,
    InvalidTextError,
    InvalidTransitionError,
    LeaseHeldError,
    LeaseLostError,
    RecoverableError,
    SteeringRefusedError,
    StoreError,
    StoreUnavailableError,
    ToolArgumentsError,
    ToolError,
    TurnError,
    TurnNotFound,
    VersionConflictError,
)
from agent_runner.events import (
    DURABLE_EVENT_TYPES,
    EPHEMERAL_EVENT_TYPES,
    AgentEvent,
    AgentEventListener,
    AgentEventType,
)
from agent_runner.feed import EventFeed
from agent_runner.forms import AgentFormDefinition, AgentFormRequiredException
from agent_runner.in_memory import (
    InMemoryAgentTurnStore,
    InMemoryChatMemory,
    InMemoryChatMemoryProvider,
    InMemoryLiveEvents,
    InMemoryTurnLease,
)
from agent_runner.leasing import HeldLease, LeaseKeeper
from agent_runner.limits import InputLimits
from agent_runner.messages import (
    ActionStatus,
    AgentActionMessage,
    AgentFormMessage,
    AiMessage,
    AnyMessage,
    ModelMessage,
    ProviderPart,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_runner.middleware import Middleware
from agent_runner.model_limits import InProcessModelLimiter, ModelLimit, ModelLimiter
from agent_runner.models import ChatModel, ChatRequest, ChatResponse, ScriptedChatModel, ToolSpec
from agent_runner.operations import OperationPending
from agent_runner.persistence import (
    AgentLoader,
    AgentTurnStore,
    ChatMemory,
    ChatMemoryProvider,
    ConversationGuard,
    ConversationKey,
    DeadlineSource,
    EventLog,
    EventScope,
    Lease,
    LiveEventChannel,
    SteeringMessage,
    SteeringQueue,
    TurnDispatcher,
    TurnLease,
    TurnRef,
)
from agent_runner.policy import AgentExecutionPolicy, Budget, FinalAnswer, RetryPolicy
from agent_runner.results import AdvanceResult, AgentStepResult, StopReason
from agent_runner.runner import AgentRunner
from agent_runner.snapshot import AgentTurn, AgentTurnStatus, ChildLink, ListedTool, PageAction
from agent_runner.suspensions import (
    AgentResumeCommand,
    AgentSuspension,
    Phase,
    ResumeType,
    SuspensionType,
    TimeoutAction,
)
from agent_runner.tools import AgentToolContext, AgentUserInputTool, Tool, ToolApproval, ToolOutcome, tool
from agent_runner.toolsets import Toolset
from agent_runner.usage import Usage
from agent_runner.worker import AgentWorker

__all__ = [
    # Agents and tools
    "Agent",
    "AgentFormDefinition",
    "AgentToolContext",
    "AgentUserInputTool",
    "Tool",
    "ToolApproval",
    "ToolOutcome",
    "OperationPending",
    "Toolset",
    "ListedTool",
    "tool",
    # Messages
    "ActionStatus",
    "AgentActionMessage",
    "AgentFormMessage",
    "AiMessage",
    "AnyMessage",
    "ModelMessage",
    "ProviderPart",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
    # Chat models
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "ScriptedChatModel",
    "ToolSpec",
    "Usage",
    # Turns
    "AgentResumeCommand",
    "AgentSuspension",
    "AgentTurn",
    "AgentTurnStatus",
    "ChildLink",
    "PageAction",
    "Phase",
    "ResumeType",
    "SuspensionType",
    "TimeoutAction",
    # Runner
    "AgentExecutionPolicy",
    "AgentRunner",
    "AdvanceResult",
    "AgentStepResult",
    "AgentWorker",
    "Budget",
    "InputLimits",
    "Middleware",
    "RetryPolicy",
    "InProcessModelLimiter",
    "ModelLimit",
    "ModelLimiter",
    "StopReason",
    # Events
    "AgentEvent",
    "AgentEventListener",
    "AgentEventType",
    "DURABLE_EVENT_TYPES",
    "EPHEMERAL_EVENT_TYPES",
    "EventFeed",
    "EventLog",
    "EventScope",
    "ConversationKey",
    "FinalAnswer",
    "InMemoryLiveEvents",
    "LiveEventChannel",
    # Backends
    "AgentLoader",
    "AgentTurnStore",
    "ChatMemory",
    "ChatMemoryProvider",
    "ConversationGuard",
    "DeadlineSource",
    "InMemoryAgentLoader",
    "InMemoryAgentTurnStore",
    "InMemoryChatMemory",
    "InMemoryChatMemoryProvider",
    "InMemoryTurnLease",
    "HeldLease",
    "Lease",
    "LeaseKeeper",
    "TurnDispatcher",
    "TurnLease",
    "TurnRef",
    # Errors
    "AgentConversationBusyException",
    "AgentFormRequiredException",
    "AgentNotFound",
    "AgentRunnerError",
    "DefinitionError",
    "FormProtocolError",
    "InputLimitError",
    "InvalidCursorError",
    "InvalidEventQueryError",
    "InvalidResumeCommand",
    "InvalidTextError",
    "InvalidTransitionError",
    "LeaseHeldError",
    "LeaseLostError",
    "RecoverableError",
    "SteeringMessage",
    "SteeringQueue",
    "SteeringRefusedError",
    "StoreError",
    "StoreUnavailableError",
    "ToolArgumentsError",
    "ToolError",
    "TurnError",
    "TurnNotFound",
    "VersionConflictError",
]
