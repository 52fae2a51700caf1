// One turn: status, what it waits for (with the controls to decide), pending tool calls,
// usage, result and messages, refreshed from the turn's event stream.

import { api, seg } from "../api.js";
import { h, timeElement } from "../dom.js";
import { KeyedList, argumentsList, cancelControl, isTerminal, renderKey, statusBadge, suspensionPanel, timelineItem } from "../components.js";
import { LiveAnswers, streamStatusElement } from "../live.js";
import { Refresher } from "../refresher.js";

const POLL_MS = 4000;

function fact(label, value) {
  if (value === null || value === undefined || value === "") return null;
  return h("div", {}, h("dt", {}, label), h("dd", {}, value));
}

function turnLink(id) {
  return id ? h("a", { href: `#/turns/${encodeURIComponent(id)}`, class: "mono" }, id) : null;
}

function usageText(usage) {
  if (!usage) return null;
  const parts = [`${usage.input_tokens ?? 0} in`, `${usage.output_tokens ?? 0} out`];
  if (usage.cost) parts.push(`cost ${usage.cost}`);
  return parts.join(" · ");
}

function pendingCalls(calls) {
  if (!calls || !calls.length) return h("p", { class: "subtle" }, "None.");
  return h(
    "table",
    { class: "calls" },
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Tool"), h("th", { scope: "col" }, "Call id"), h("th", { scope: "col" }, "Arguments"))),
    h(
      "tbody",
      {},
      calls.map((call) => h("tr", {}, h("td", {}, h("code", {}, call.name)), h("td", { class: "mono" }, call.id), h("td", {}, argumentsList(call.arguments)))),
    ),
  );
}

export function mountTurn(main, turnId) {
  const title = h("h1", { tabindex: "-1" }, "Turn");
  const badgeArea = h("div", { class: "turn-badge" });
  const cancelArea = h("div");
  const facts = h("dl", { class: "facts" });
  const outcome = h("div", { class: "stack" });
  const waitingSection = h("section", { "aria-labelledby": "waiting-title", hidden: true }, h("h2", { id: "waiting-title" }, "Waiting for you"));
  const waitingBody = h("div");
  waitingSection.append(waitingBody);
  const calls = h("div");
  const messages = h("ol", { class: "timeline", "aria-label": "Turn messages" });
  const live = h("ol", { class: "timeline live", "aria-label": "Answer being written" });
  const loadError = h("div", { class: "notice error", role: "alert", hidden: true });
  const streamStatus = streamStatusElement();

  main.replaceChildren(
    h("div", { class: "page-head" }, h("div", {}, title, h("p", { class: "subtle mono" }, turnId)), h("div", { class: "stack" }, badgeArea, cancelArea)),
    loadError,
    streamStatus,
    h("section", { class: "card", "aria-label": "Turn facts" }, facts),
    outcome,
    waitingSection,
    h("section", { "aria-labelledby": "calls-title" }, h("h2", { id: "calls-title" }, "Pending tool calls"), calls),
    h("section", { "aria-labelledby": "messages-title" }, h("h2", { id: "messages-title" }, "Messages"), messages, live),
  );

  let stopped = false;
  let panelKey = null;
  const handlers = { onChanged: () => refresher.request() };
  const keyed = new KeyedList(messages, (message) => timelineItem(message, handlers));
  let answers = null;
  let shown = [];

  function render(turn) {
    title.textContent = `Turn of ${turn.agent_id}`;
    badgeArea.replaceChildren(statusBadge(turn.status));
    facts.replaceChildren(
      ...[
        fact("Agent", `${turn.agent_id}${turn.agent_version ? ` (v${turn.agent_version})` : ""}`),
        fact("Conversation", turn.conversation_id ? h("a", { href: `#/conversations/${encodeURIComponent(turn.conversation_id)}`, class: "mono" }, turn.conversation_id) : null),
        fact("Parent turn", turnLink(turn.parent_turn_id)),
        turn.root_turn_id && turn.root_turn_id !== turn.id ? fact("Root turn", turnLink(turn.root_turn_id)) : null,
        fact("Phase", turn.phase),
        fact("Model calls", turn.model_iterations),
        fact("Steps", turn.steps),
        fact("Attempt", turn.attempt),
        fact("Next retry", turn.next_retry_at ? timeElement(turn.next_retry_at) : null),
        fact("Usage", usageText(turn.usage)),
        fact("Created", timeElement(turn.created_at)),
        fact("Updated", timeElement(turn.updated_at)),
        fact("Version", turn.version),
      ].filter(Boolean),
    );
    outcome.replaceChildren(
      ...[
        turn.error ? h("div", { class: "notice error" }, h("strong", {}, "Error: "), turn.error) : null,
        turn.final_output ? h("div", { class: "card" }, h("h2", { style: "margin-top:0" }, "Final answer"), h("div", { class: "bubble" }, turn.final_output)) : null,
      ].filter(Boolean),
    );
    const key = `${turn.status}|${turn.suspension?.type ?? ""}|${turn.suspension?.correlation_id ?? ""}`;
    if (key !== panelKey) {
      panelKey = key;
      const panel = suspensionPanel(turn, handlers);
      waitingBody.replaceChildren(...(panel ? [panel.tagName === "LI" ? h("ol", { class: "timeline" }, panel) : panel] : []));
      waitingSection.hidden = !panel;
      cancelArea.replaceChildren(...(isTerminal(turn.status) ? [] : [cancelControl(turn, handlers)]));
    }
    calls.replaceChildren(pendingCalls(turn.pending_tool_calls));
    shown = turn.messages || [];
    keyed.update(shown, renderKey, (m) => m.id);
    if (answers) answers.prune();
  }

  async function refresh() {
    const turn = await api.getTurn(turnId, { messages: true });
    if (stopped) return;
    loadError.hidden = true;
    render(turn);
  }

  const refresher = new Refresher(refresh, {
    intervalMs: POLL_MS,
    onError: (error) => {
      loadError.textContent = error.status === 404 ? "No such turn." : `Could not load the turn: ${error.message}`;
      loadError.hidden = false;
    },
  });

  refresher.start(() => {
    answers = new LiveAnswers({
      path: `v1/turns/${seg(turnId)}/events`,
      storageKey: `turn.${turnId}`,
      list: live,
      isShown: (messageId) => keyed.has(messageId),
      showsText: (text) => shown.some((m) => m.role === "assistant" && m.content === text),
      onEvent: (event) => {
        if (event.type !== "MODEL_DELTA" && event.type !== "TOOL_PROGRESS") refresher.request();
        if (event.type === "TURN_RECOVERING") {
          const { recoveries, max_recoveries: most } = event.payload.data || {};
          streamStatus.textContent = `recovering: a worker stopped on this turn; another took it over (${recoveries} of ${most} in a row)`;
        }
      },
      onStatus: (text) => {
        streamStatus.textContent = text;
      },
    }).start();
  });

  return () => {
    stopped = true;
    refresher.stop();
    if (answers) answers.stop();
  };
}
