// Pieces shared by the views: status badges, masked values, timeline messages, action
// cards (approvals and calls whose outcome is unknown), form cards and the plain-text
// question box.

import { api } from "./api.js";
import { TERMINAL_STATUSES } from "../../console/contract.js";
import { append, clearFieldError, h, requiredText, showFieldError, timeElement, uniqueId } from "./dom.js";
import { SchemaForm, humanize } from "./form.js";

/** The value the server puts in place of an argument a tool marks sensitive. */
export const MASK = "***";

const TERMINAL = new Set(TERMINAL_STATUSES);

export function isTerminal(status) {
  return TERMINAL.has(status);
}

const STATUS_CLASS = {
  WAITING_FOR_APPROVAL: "waiting",
  WAITING_FOR_USER: "waiting",
  RETRY_SCHEDULED: "waiting",
  READY: "running",
  RUNNING: "running",
  WAITING_FOR_CHILD: "running",
  COMPLETED: "ok",
  PENDING: "pending",
  APPROVED: "approved",
  SUBMITTED: "submitted",
  REJECTED: "rejected",
  CANCELLED: "cancelled",
};

const STATUS_TEXT = {
  WAITING_FOR_APPROVAL: "Waiting for approval",
  WAITING_FOR_USER: "Waiting for input",
  WAITING_FOR_CHILD: "Waiting for sub-agents",
  RETRY_SCHEDULED: "Retry scheduled",
  MAX_ITERATIONS_REACHED: "Max iterations reached",
  MAX_STEPS_REACHED: "Max steps reached",
  BUDGET_EXCEEDED: "Budget exceeded",
};

/** A pill showing a turn or action status (`label` in place of the status's usual text). */
export function statusBadge(status, label) {
  const text = label || STATUS_TEXT[status] || humanize(String(status || "unknown"));
  return h("span", { class: `badge ${STATUS_CLASS[status] || (isTerminal(status) ? "bad" : "")}`, dataset: { status } }, text);
}

/** A value for display; the mask is shown as hidden, objects as compact JSON. */
export function valueElement(value) {
  if (value === MASK) return h("span", { class: "masked", title: "hidden: sensitive value", "aria-label": "hidden sensitive value" }, "••••••");
  if (typeof value === "string" || typeof value === "number" || typeof value === "boolean") return h("span", {}, String(value));
  if (value === null) return h("span", { class: "subtle" }, "none");
  return h("code", {}, JSON.stringify(value));
}

/** A definition list of arguments, sensitive ones masked. */
export function argumentsList(args) {
  const entries = Object.entries(args || {});
  if (!entries.length) return h("p", { class: "subtle" }, "No arguments.");
  return h(
    "dl",
    { class: "args" },
    entries.map(([name, value]) => [h("dt", {}, humanize(name) || name), h("dd", {}, maskedDeep(value))]),
  );
}

function maskedDeep(value) {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    const inner = Object.entries(value);
    if (inner.some(([, v]) => v === MASK)) return argumentsList(value);
  }
  return valueElement(value);
}

/** What a decided card says happened, by kind of card and status (also its badge text). */
const DECISION_VERBS = {
  approval: { APPROVED: "Approved", REJECTED: "Rejected", CANCELLED: "Cancelled" },
  outcome_unknown: { APPROVED: "Retried", SUBMITTED: "Marked done", REJECTED: "Failed", CANCELLED: "Cancelled" },
  form: { SUBMITTED: "Submitted", CANCELLED: "Cancelled" },
};

/** `approval`, `outcome_unknown` or `form`. */
function cardKind(message) {
  if (message.role === "agent_form") return "form";
  return message.kind === "outcome_unknown" ? "outcome_unknown" : "approval";
}

/** Who decided, when and why, for a decided page message; null while nothing is known. */
export function decisionLine(message) {
  const verb = DECISION_VERBS[cardKind(message)][message.status];
  if (!verb || !(message.decided_by || message.decided_at || message.reason)) return null;
  const line = h("p", { class: "decision-line" }, verb);
  if (message.decided_by) append(line, [" by ", h("strong", { class: "decided-by" }, message.decided_by)]);
  if (message.decided_at) append(line, [" on ", timeElement(message.decided_at)]);
  return h(
    "div",
    { class: "decision" },
    line,
    message.reason ? h("p", { class: "decision-reason" }, h("span", { class: "reason-label" }, "Reason: "), message.reason) : null,
  );
}

/** Label of a timeline speaker. */
function who(text) {
  return h("div", { class: "who" }, text);
}

/** A user, assistant, tool or system message as a timeline item (`li`). */
export function messageItem(message) {
  const item = h("li", { class: `msg msg-${message.role}`, dataset: { messageId: message.id, role: message.role } });
  if (message.role === "user") {
    item.append(who("You"), h("div", { class: "bubble" }, message.content));
  } else if (message.role === "assistant") {
    item.append(who("Assistant"));
    if (message.content) item.append(h("div", { class: "bubble" }, message.content));
    if (message.tool_calls?.length) {
      item.append(
        h(
          "div",
          { class: "tool-calls", "aria-label": "tool calls" },
          message.tool_calls.map((call) => h("span", { class: "chip" }, "→ ", call.name)),
        ),
      );
    }
  } else if (message.role === "tool") {
    item.classList.toggle("error", Boolean(message.is_error));
    item.append(
      h(
        "details",
        {},
        h("summary", {}, message.is_error ? `Error from ${message.tool_name}` : `Result of ${message.tool_name}`),
        h("pre", {}, message.content),
      ),
    );
  } else if (message.role === "system") {
    item.classList.add("msg-tool");
    item.append(h("details", {}, h("summary", {}, "Instructions"), h("pre", {}, message.content)));
  } else {
    item.append(who(message.role || "message"), h("div", { class: "bubble" }, JSON.stringify(message)));
  }
  return item;
}

/** The text shown while an answer streams in (`li`, updated with `setText`). */
export function streamingItem(turnId) {
  const bubble = h("div", { class: "bubble", "aria-busy": "true" });
  const item = h(
    "li",
    { class: "msg msg-assistant msg-streaming", dataset: { streamTurnId: turnId } },
    who("Assistant · answering"),
    bubble,
  );
  return {
    item,
    setText(text) {
      bubble.textContent = text;
    },
    finish(text, messageId) {
      bubble.textContent = text;
      bubble.setAttribute("aria-busy", "false");
      item.classList.remove("msg-streaming");
      item.dataset.messageId = messageId || "";
      item.querySelector(".who").textContent = "Assistant";
    },
  };
}

/** A message queued behind a busy conversation, until its turn starts (`setLine`) or it fails (`fail`). */
export function queuedItem(turnId, content) {
  const label = who("You · queued");
  const item = h("li", { class: "msg msg-user msg-queued", dataset: { queuedTurnId: turnId } }, label, h("div", { class: "bubble" }, content));
  return {
    item,
    setLine(position) {
      label.textContent = position <= 1 ? "You · queued, next in line" : `You · queued, ${position} in line`;
    },
    fail(error) {
      item.classList.add("msg-queued-failed");
      label.textContent = `You · not sent: ${error}`;
    },
  };
}

function errorText(error) {
  if (error.status === 409) return `${error.message} The page has been refreshed.`;
  return error.message || String(error);
}

const DECIDER_STORAGE = "agent-runner.decided-by";

/** The name last given with a decision in this browser ("" when none). */
function savedDecider() {
  try {
    return localStorage.getItem(DECIDER_STORAGE) || "";
  } catch {
    return "";
  }
}

function rememberDecider(name) {
  try {
    if (name) localStorage.setItem(DECIDER_STORAGE, name);
    else localStorage.removeItem(DECIDER_STORAGE);
  } catch {
    // Storage disabled: the name is typed again next time.
  }
}

/** Each choice a card can offer: its button, its words while and after it runs, and the resume action it sends. */
const CHOICES = {
  APPROVE: { label: "Approve", busy: "Approving…", done: "Approved.", action: "approve", class: "approve" },
  REJECT: { label: "Reject", busy: "Rejecting…", done: "Rejected.", action: "reject", class: "danger" },
  RETRY: { label: "Retry", busy: "Retrying…", done: "Retrying.", action: "approve", class: "" },
  MARK_DONE: { label: "Mark done", busy: "Marking done…", done: "Marked done.", action: "tool_result", class: "approve", needsResult: true },
  FAIL: { label: "Fail", busy: "Failing…", done: "Failed.", action: "reject", class: "danger" },
};

/** The choices a pending card offers (the server lists `actions`; older servers only the status). */
function openChoices(message) {
  if (Array.isArray(message.actions)) return message.actions.filter((name) => CHOICES[name]);
  if ((message.status || "PENDING") !== "PENDING") return [];
  return cardKind(message) === "outcome_unknown" ? ["RETRY", "MARK_DONE", "FAIL"] : ["APPROVE", "REJECT"];
}

function labelledField(id, label, help, control, extra = null) {
  return h(
    "div",
    { class: "field" },
    h("label", { for: id }, h("span", { class: "label-text" }, label)),
    help ? h("p", { class: "help", id: `${id}-help` }, help) : null,
    control,
    extra,
  );
}

/**
 * The buttons of `choices` with a reason box, the decider's name (remembered in this
 * browser) and, when a choice needs one, a result box. `decide(choice, {reason, result,
 * decidedBy})` performs the call; errors are shown in the card and announced.
 */
function decisionControls({ choices, decide, idPrefix, reasonHelp }) {
  const reasonId = uniqueId(`${idPrefix}-reason`);
  const reason = h("textarea", { id: reasonId, rows: 2, "aria-describedby": `${reasonId}-help` });
  const nameId = uniqueId(`${idPrefix}-decider`);
  const name = h("input", { id: nameId, type: "text", autocomplete: "name", value: savedDecider(), "aria-describedby": `${nameId}-help` });
  const needsResult = choices.some((choice) => CHOICES[choice].needsResult);
  const resultId = uniqueId(`${idPrefix}-result`);
  const result = needsResult ? h("textarea", { id: resultId, rows: 2, "aria-describedby": `${resultId}-help` }) : null;
  const resultError = h("p", { class: "field-error", id: `${resultId}-error`, hidden: true });
  const status = h("p", { class: "form-status", role: "status", "aria-live": "polite" });
  const error = h("p", { class: "field-error", role: "alert", hidden: true });
  const buttons = choices.map((choice) => h("button", { type: "button", class: CHOICES[choice].class || null, dataset: { choice } }, CHOICES[choice].label));
  const inputs = [reason, name, result].filter(Boolean);
  const setBusy = (busy) => {
    for (const element of [...buttons, ...inputs]) element.disabled = busy;
  };
  const showResultError = (text) => {
    resultError.textContent = text;
    resultError.hidden = !text;
    if (text) {
      result.setAttribute("aria-invalid", "true");
      result.setAttribute("aria-describedby", `${resultId}-help ${resultError.id}`);
    } else {
      result.removeAttribute("aria-invalid");
      result.setAttribute("aria-describedby", `${resultId}-help`);
    }
  };
  const run = async (choice) => {
    const spec = CHOICES[choice];
    error.hidden = true;
    if (result) showResultError("");
    if (spec.needsResult && !result.value.trim()) {
      showResultError("Please write what the call did before marking it done.");
      result.focus();
      return;
    }
    setBusy(true);
    status.textContent = spec.busy;
    const decidedBy = name.value.trim();
    try {
      await decide(choice, { reason: reason.value.trim(), result: result ? result.value.trim() : "", decidedBy });
      rememberDecider(decidedBy);
      status.textContent = spec.done;
    } catch (err) {
      status.textContent = "";
      error.textContent = errorText(err);
      error.hidden = false;
      setBusy(false);
    }
  };
  buttons.forEach((button, index) => button.addEventListener("click", () => run(choices[index])));
  if (result) result.addEventListener("input", () => !resultError.hidden && showResultError(""));
  return h(
    "div",
    { class: "decision-actions" },
    result
      ? h(
          "div",
          { class: "result-field" },
          labelledField(resultId, "Result", "What the call did, as the agent will read it; needed to mark it done.", result, resultError),
        )
      : null,
    h("div", { class: "reason-field" }, labelledField(reasonId, "Reason", reasonHelp, reason)),
    h("div", { class: "decider-field" }, labelledField(nameId, "Your name", "Optional; recorded as who decided.", name)),
    h("div", { class: "decision-buttons" }, buttons),
    status,
    error,
  );
}

/** A card for an `agent_action` page message (`li`): an approval, or a call whose outcome is unknown. */
export function actionCard(message, { onChanged }) {
  const status = message.status || "PENDING";
  const kind = cardKind(message);
  const choices = openChoices(message);
  const pending = choices.length > 0;
  const unknown = kind === "outcome_unknown";
  const card = h(
    "li",
    {
      class: `card action-card ${unknown ? "outcome-unknown " : ""}${pending ? "pending" : `done ${status.toLowerCase()}`}`,
      dataset: { messageId: message.id, role: "agent_action", status, kind, actionId: message.action_id },
    },
    h(
      "div",
      { class: "card-head" },
      h("h3", {}, unknown ? "Outcome unknown: " : "Approval: ", h("code", {}, message.tool_name)),
      statusBadge(status, DECISION_VERBS[kind][status]),
    ),
    message.summary ? h("p", { class: "summary subtle" }, message.summary) : null,
    argumentsList(message.arguments),
  );
  if (pending) {
    if (unknown) {
      card.append(
        h(
          "p",
          { class: "notice choices-help" },
          h("strong", {}, "Retry"),
          " runs the call again: only if you know it did not take effect. ",
          h("strong", {}, "Mark done"),
          " if it did, with its result. ",
          h("strong", {}, "Fail"),
          " tells the agent it did not work.",
        ),
      );
    }
    card.append(
      decisionControls({
        choices,
        idPrefix: `action-${message.action_id}`,
        reasonHelp: unknown
          ? "Optional; recorded with your decision, and read by the agent if you fail the call."
          : "Optional; recorded with your decision, and read by the agent if you reject.",
        decide: async (choice, { reason, result, decidedBy }) => {
          const body = { action: CHOICES[choice].action, tool_call_id: message.action_id };
          if (reason) body.reason = reason;
          if (CHOICES[choice].needsResult) body.content = result;
          if (decidedBy) body.metadata = { decided_by: decidedBy };
          try {
            await api.resume(message.turn_id, body);
          } finally {
            onChanged();
          }
        },
      }),
    );
  } else {
    append(card, decisionLine(message));
  }
  return card;
}

/** A form card for an `agent_form` page message (`li`). */
export function formCard(message, { onChanged }) {
  const status = message.status || "PENDING";
  const pending = Array.isArray(message.actions) ? message.actions.includes("SUBMIT") : status === "PENDING";
  const schema = message.schema || message.form_schema || {};
  const title = message.description || schema.title || humanize(message.form_key);
  const card = h(
    "li",
    {
      class: `card form-card ${pending ? "pending" : `done ${status.toLowerCase()}`}`,
      dataset: { messageId: message.id, role: "agent_form", status, actionId: message.action_id },
    },
    h("div", { class: "card-head" }, h("h3", {}, title), statusBadge(status)),
  );
  if (pending) {
    const form = new SchemaForm(schema, {
      idPrefix: `form-${message.action_id}`,
      submitLabel: "Submit",
      onSubmit: async (data) => {
        await api.resume(message.turn_id, { action: "form", tool_call_id: message.action_id, data });
        onChanged();
      },
    });
    card.append(form.element);
  } else {
    append(card, decisionLine(message));
  }
  return card;
}

/** A page message (approval card or form) or a plain message, as a timeline item. */
export function timelineItem(message, handlers) {
  if (message.role === "agent_action") return actionCard(message, handlers);
  if (message.role === "agent_form") return formCard(message, handlers);
  return messageItem(message);
}

/** Key that changes whenever a timeline item must be drawn again. */
export function renderKey(message) {
  return `${message.role}|${message.version ?? 0}|${message.status ?? ""}|${(message.actions || []).join(",")}`;
}

/** A box to answer a plain-text question of a turn waiting for the user. */
export function questionCard(turn, { onChanged }) {
  const id = uniqueId("answer");
  const input = h("textarea", { id, rows: 2, required: true, "aria-required": "true" });
  const error = h("p", { class: "field-error", id: `${id}-error`, hidden: true });
  const status = h("span", { class: "form-status", role: "status", "aria-live": "polite" });
  const button = h("button", { type: "submit", class: "primary" }, "Send answer");
  const form = h(
    "form",
    { class: "card question-card", novalidate: true, dataset: { turnId: turn.id } },
    h("div", { class: "card-head" }, h("h3", {}, "The agent asks"), statusBadge(turn.status)),
    h("p", { class: "question-text" }, turn.suspension?.message || "Please answer to continue."),
    h("div", { class: "field" }, h("label", { for: id }, h("span", { class: "label-text" }, "Your answer")), input, error),
    h("div", { class: "form-actions" }, button, status),
  );
  input.addEventListener("input", () => {
    if (!error.hidden) clearFieldError(input, error);
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const content = requiredText(input, error, "Please write an answer.");
    if (!content) return;
    button.disabled = input.disabled = true;
    status.textContent = "Sending…";
    try {
      await api.resume(turn.id, { action: "input", content });
      status.textContent = "Sent.";
      onChanged();
    } catch (err) {
      status.textContent = "";
      showFieldError(input, error, errorText(err));
      button.disabled = input.disabled = false;
    }
  });
  return form;
}

const TIMEOUT_DEFAULTS = {
  approve: "it is approved",
  reject: "it is rejected",
  submit: "the form's default answer is submitted",
};

/** "Decide by <time>; then it is rejected." under a card whose wait has a deadline. */
function withDeadline(card, suspension) {
  if (!card || !suspension.deadline) return card;
  const then = TIMEOUT_DEFAULTS[suspension.on_timeout] || "the default applies";
  card.append(
    h("p", { class: "subtle deadline" }, "Decide by ", timeElement(suspension.deadline), `; then ${then}.`),
  );
  return card;
}

/** Approval, form or question controls for a turn's current suspension (turn detail view). */
export function suspensionPanel(turn, { onChanged }) {
  const suspension = turn.suspension;
  if (!suspension) return null;
  return withDeadline(suspensionControls(turn, suspension, { onChanged }), suspension);
}

function suspensionControls(turn, suspension, { onChanged }) {
  if (turn.status === "WAITING_FOR_APPROVAL" && suspension.tool_call) {
    const call = suspension.tool_call;
    return actionCard(
      {
        id: `suspension-${turn.id}`,
        role: "agent_action",
        turn_id: turn.id,
        action_id: suspension.correlation_id || call.id,
        tool_name: call.name,
        summary: suspension.message,
        arguments: call.arguments,
        kind: suspension.kind || "approval",
        status: "PENDING",
      },
      { onChanged },
    );
  }
  if (turn.status === "WAITING_FOR_USER" && suspension.form) {
    return formCard(
      {
        id: `suspension-${turn.id}`,
        role: "agent_form",
        turn_id: turn.id,
        action_id: suspension.correlation_id,
        form_key: suspension.form.key,
        description: suspension.form.description || suspension.message,
        schema: suspension.form.schema,
        status: "PENDING",
      },
      { onChanged },
    );
  }
  if (turn.status === "WAITING_FOR_USER") return questionCard(turn, { onChanged });
  if (turn.status === "RETRY_SCHEDULED") {
    const status = h("span", { class: "form-status", role: "status", "aria-live": "polite" });
    const button = h("button", { type: "button" }, "Retry now");
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await api.resume(turn.id, { action: "retry" });
        status.textContent = "Retrying.";
        onChanged();
      } catch (err) {
        status.textContent = errorText(err);
        button.disabled = false;
      }
    });
    return h(
      "div",
      { class: "card" },
      h("p", {}, suspension.message || "The turn will be retried."),
      turn.next_retry_at ? h("p", { class: "subtle" }, "Next attempt: ", timeElement(turn.next_retry_at)) : null,
      h("div", { class: "form-actions" }, button, status),
    );
  }
  return h("div", { class: "card" }, h("p", {}, suspension.message || humanize(suspension.type)));
}

/** A cancel button with a confirmation step and an optional reason. */
export function cancelControl(turn, { onChanged }) {
  const wrap = h("div", { class: "cancel-control" });
  const open = h("button", { type: "button", class: "danger small" }, "Cancel turn");
  wrap.append(open);
  open.addEventListener("click", () => {
    const id = uniqueId("cancel-reason");
    const reason = h("input", { id, type: "text", placeholder: "turn cancelled by caller" });
    const status = h("span", { class: "form-status", role: "status", "aria-live": "polite" });
    const confirm = h("button", { type: "submit", class: "danger small" }, "Confirm cancel");
    const back = h("button", { type: "button", class: "small" }, "Keep running");
    const form = h(
      "form",
      { class: "card stack", novalidate: true },
      h("div", { class: "field" }, h("label", { for: id }, "Reason for cancelling"), reason),
      h("div", { class: "form-actions" }, confirm, back, status),
    );
    back.addEventListener("click", () => {
      form.replaceWith(open);
      open.focus();
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      confirm.disabled = back.disabled = true;
      status.textContent = "Cancelling…";
      try {
        await api.cancel(turn.id, reason.value.trim());
        status.textContent = "Cancelled.";
        onChanged();
      } catch (err) {
        status.textContent = errorText(err);
        confirm.disabled = back.disabled = false;
      }
    });
    open.replaceWith(form);
    reason.focus();
  });
  return wrap;
}

/** Keyed reconciliation of a list: keeps elements whose key is unchanged (and the values typed in them). */
export class KeyedList {
  constructor(element, render) {
    this.element = element;
    this.render = render;
    this.entries = new Map();
  }

  update(items, keyOf, idOf) {
    const next = new Map();
    const ordered = [];
    for (const item of items) {
      const id = idOf(item);
      const key = keyOf(item);
      const existing = this.entries.get(id);
      const element = existing && existing.key === key ? existing.element : this.render(item);
      if (existing && existing.element !== element && existing.element.contains(document.activeElement)) {
        // The item under the keyboard changed: keep focus on the new version of it.
        queueMicrotask(() => element.querySelector("button, textarea, input, select")?.focus());
      }
      next.set(id, { key, element });
      ordered.push(element);
    }
    for (const [id, entry] of this.entries) if (!next.has(id)) entry.element.remove();
    ordered.forEach((element, index) => {
      if (this.element.children[index] !== element) this.element.insertBefore(element, this.element.children[index] || null);
    });
    while (this.element.children.length > ordered.length) this.element.lastElementChild.remove();
    this.entries = next;
  }

  has(id) {
    return this.entries.has(id);
  }
}
