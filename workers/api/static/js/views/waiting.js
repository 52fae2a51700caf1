// The turns waiting for a person: approvals and answers, newest first, kept live by polling.

import { api } from "../api.js";
import { h, timeElement } from "../dom.js";
import { humanize } from "../form.js";
import { KeyedList, statusBadge } from "../components.js";
import { WAITING_FOR_A_PERSON } from "../../../console/contract.js";

const POLL_MS = 2500;

function title(turn) {
  const suspension = turn.suspension || {};
  if (turn.status === "WAITING_FOR_APPROVAL") {
    const tool = h("code", {}, suspension.tool_call?.name || "a tool call");
    // A call that started and whose outcome nobody recorded: retry, mark done or fail it.
    return suspension.kind === "outcome_unknown" ? ["Settle ", tool, " (outcome unknown)"] : ["Approve ", tool];
  }
  if (suspension.form) return ["Fill in: ", suspension.form.description || humanize(suspension.form.key)];
  return "Answer a question";
}

function turnItem(turn) {
  const href = turn.conversation_id ? `#/conversations/${encodeURIComponent(turn.conversation_id)}` : `#/turns/${encodeURIComponent(turn.id)}`;
  return h(
    "li",
    { class: "card turn-item", dataset: { turnId: turn.id, status: turn.status } },
    h("h3", {}, h("a", { href }, title(turn))),
    statusBadge(turn.status),
    h(
      "div",
      { class: "meta" },
      h("span", {}, "Agent ", h("strong", {}, turn.agent_id)),
      turn.conversation_id ? h("span", {}, "Conversation ", h("code", {}, turn.conversation_id)) : null,
      h("span", {}, "Since ", timeElement(turn.updated_at || turn.created_at)),
    ),
    turn.suspension?.message ? h("p", { class: "question" }, turn.suspension.message) : null,
    h(
      "div",
      { class: "links" },
      turn.conversation_id ? h("a", { href }, "Open conversation") : null,
      h("a", { href: `#/turns/${encodeURIComponent(turn.id)}` }, "Turn details"),
    ),
  );
}

export function mountWaiting(main) {
  const list = h("ul", { class: "turn-list", "aria-label": "Turns waiting for a person" });
  const empty = h("p", { class: "empty", hidden: true }, "Nothing is waiting for you. New approvals and questions appear here.");
  const status = h("p", { class: "stream-status", role: "status", "aria-live": "polite" });
  const convId = h("input", { id: "open-conversation", type: "text", autocomplete: "off" });
  const openForm = h(
    "form",
    { class: "inline-fields", novalidate: true },
    h("div", { class: "field" }, h("label", { for: "open-conversation" }, "Open a conversation by id"), convId),
    h("button", { type: "submit" }, "Open"),
  );
  openForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const id = convId.value.trim();
    if (id) location.hash = `#/conversations/${encodeURIComponent(id)}`;
  });
  main.replaceChildren(
    h(
      "div",
      { class: "page-head" },
      h("div", {}, h("h1", { tabindex: "-1" }, "Waiting for you"), h("p", { class: "subtle" }, "Tool calls to approve and questions to answer, newest first.")),
    ),
    status,
    list,
    empty,
    h("h2", {}, "Go to"),
    openForm,
  );
  const keyed = new KeyedList(list, turnItem);
  let timer = null;
  let stopped = false;
  let lastText = "";

  async function refresh() {
    try {
      const page = await api.listTurns({ status: WAITING_FOR_A_PERSON, limit: 100 });
      const turns = page.items || [];
      turns.sort((a, b) => String(b.updated_at || b.created_at).localeCompare(String(a.updated_at || a.created_at)));
      if (stopped) return;
      keyed.update(turns, (t) => `${t.version}|${t.status}`, (t) => t.id);
      empty.hidden = turns.length > 0;
      const text = turns.length ? `${turns.length} waiting` : "";
      if (text !== lastText) status.textContent = lastText = text;
    } catch (error) {
      if (!stopped) status.textContent = lastText = `Could not load the waiting turns: ${error.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
