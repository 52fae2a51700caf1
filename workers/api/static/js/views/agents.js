// The agent picker, filled from GET /v1/agents.

import { api } from "../api.js";
import { h } from "../dom.js";

let cached = null;

/** The server's agents (fetched once per page load). */
export async function loadAgents() {
  if (!cached) {
    cached = api.listAgents().then(
      (page) => page.items || [],
      (error) => {
        cached = null;
        throw error;
      },
    );
  }
  return cached;
}

/** A labelled `<select>` of agents; `preferred` is selected when present. */
export function agentPicker(id, preferred) {
  const select = h("select", { id, name: "agent_id", required: true, "aria-required": "true" }, h("option", { value: "" }, "Loading agents…"));
  const field = h("div", { class: "field" }, h("label", { for: id }, "Agent"), select);
  loadAgents().then(
    (agents) => {
      select.replaceChildren(
        ...agents.map((agent) => h("option", { value: agent.id }, agent.version ? `${agent.id} (v${agent.version})` : agent.id)),
      );
      if (!agents.length) select.append(h("option", { value: "" }, "No agents on this server"));
      if (preferred && agents.some((a) => a.id === preferred)) select.value = preferred;
    },
    (error) => {
      select.replaceChildren(h("option", { value: "" }, `Agents unavailable: ${error.message}`));
    },
  );
  return { field, select, prefer: (agentId) => { if (agentId && [...select.options].some((o) => o.value === agentId)) select.value = agentId; } };
}

/** A labelled `<select>` for what to do when the conversation is busy. */
export function busyPicker(id, initial = "reject") {
  const select = h(
    "select",
    { id, name: "if_busy" },
    h("option", { value: "reject" }, "Refuse while a turn is active"),
    h("option", { value: "enqueue" }, "Queue after the active turn"),
    h("option", { value: "interrupt" }, "Cancel the active turn and start"),
  );
  select.value = initial;
  return { field: h("div", { class: "field" }, h("label", { for: id }, "If the conversation is busy"), select), select };
}

/** Text for the answer of POST /v1/turns that did not start a turn (queued) or failed. */
export function startErrorText(error) {
  const active = error.error?.active_turn_id;
  if (error.status === 409 && active) return `${error.message} (active turn ${active}). Choose to queue or cancel it.`;
  return error.message;
}
