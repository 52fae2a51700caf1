// A small console written against the client generated from the server's /openapi.json.
// It must type-check with `tsc --strict`; each `@ts-expect-error` proves a type is precise
// (an `any` would let the line through, and tsc would then fail on the unused directive).
import type { components } from "./api";

type Schemas = components["schemas"];
type Turn = Schemas["TurnView"];
type PageItem = Schemas["MessageList"]["items"][number];
type Resume = Schemas["ResumeRequest"];
type AgentEvent = Schemas["AgentEventView"];

export function describeTurn(turn: Turn): string {
  const waiting: Schemas["AgentTurnStatus"][] = ["WAITING_FOR_USER", "WAITING_FOR_APPROVAL"];
  // @ts-expect-error a status the server does not have
  const unknownStatus: Turn["status"] = "PAUSED";
  void unknownStatus;
  const suspension = turn.suspension;
  if (suspension !== null && waiting.includes(turn.status)) {
    if (suspension.form !== null) return `form ${suspension.form.key}: ${Object.keys(suspension.form.schema).join(",")}`;
    if (suspension.tool_call !== null) return `approve ${suspension.tool_call.name}(${JSON.stringify(suspension.tool_call.arguments)})`;
    return suspension.message;
  }
  const phase: "MODEL" | "TOOLS" = turn.phase;
  return `${turn.status} in ${phase} after ${turn.usage.input_tokens + turn.usage.output_tokens} tokens: ${turn.error ?? turn.final_output ?? ""}`;
}

export function renderItem(item: PageItem): string {
  switch (item.role) {
    case "user":
      return item.content;
    case "assistant":
      return item.content ?? item.tool_calls.map((call) => call.name).join(", ");
    case "tool":
      return `${item.tool_name}: ${item.is_error ? "error " : ""}${item.content}`;
    case "agent_action": {
      const status: Schemas["ActionStatus"] = item.status;
      return `${item.kind} ${item.tool_name} ${status} [${item.actions.join("/")}] ${item.decided_by ?? ""}`;
    }
    case "agent_form":
      return `${item.form_key} ${item.status} ${Object.keys(item.schema).length}`;
    default: {
      const never: never = item;
      return never;
    }
  }
}

export const bodies: Resume[] = [
  { action: "approve", tool_call_id: "c1", reason: "looks right" },
  { action: "reject", tool_call_id: "c1", reason: "no" },
  { action: "input", content: "O-1001" },
  { action: "form", tool_call_id: "c2", data: { affected_system: "login", seats: 3, urgent: true } },
  { action: "retry" },
  { action: "tool_result", tool_call_id: "c3", content: "T-1" },
];

// @ts-expect-error approve names the call
export const missingCall: Resume = { action: "approve" };
// @ts-expect-error input takes no form data
export const wrongField: Resume = { action: "input", content: "x", data: {} };

export function onEvent(event: AgentEvent): string {
  switch (event.type) {
    case "MODEL_DELTA":
      return event.data.delta;
    case "MODEL_RESPONSE":
      return `${event.data.message_id}: ${event.data.content ?? ""} (${event.data.tool_calls.join(", ")})`;
    case "TURN_STARTED":
      return `${event.data.agent_id} from ${event.data.message_id}, parent ${event.data.parent_turn_id ?? "-"}, queued ${event.data.queued_message_id ?? "-"}`;
    case "MESSAGE_QUEUED":
      // A queued message has no turn yet: its data has no turn status or version.
      return `${event.data.message_id} queued (${event.data.ahead + 1} in line), starts as ${event.turn_id}`;
    case "MESSAGE_FAILED":
      return `${event.data.message_id} will not start: ${event.data.error}`;
    case "TURN_SUSPENDED": {
      const data = event.data;
      const suspensionType: Schemas["SuspensionType"] = data.suspension_type;
      return `${suspensionType} ${data.form?.key ?? data.tool_call?.name ?? data.message}`;
    }
    case "TURN_RESUMED":
      return `${event.data.command ?? "retry due"} ${event.data.tool_call_id ?? event.data.child_turn_id ?? ""}`;
    case "RETRY_SCHEDULED":
      return `${event.data.error} again at ${event.data.next_retry_at ?? "?"}`;
    case "TOOL_COMPLETED":
      return `${event.data.tool_name} ${event.data.is_error ? "failed" : "done"}`;
    case "TURN_COMPLETED":
    case "TURN_FAILED":
      return `${event.data.status}: ${event.data.final_output ?? event.data.error ?? ""}`;
    default:
      return `${event.type} v${event.data.version}`;
  }
}
