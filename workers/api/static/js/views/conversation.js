// A conversation: the page timeline with approval cards and forms updating in place, the
// answer streaming in live, a question box when the agent asks in plain text, cancel, and
// a composer that starts the next turn.

import { api, seg } from "../api.js";
import { h, replaceChildren, requiredText, showFieldError, timeElement, uniqueId } from "../dom.js";
import { KeyedList, cancelControl, isTerminal, questionCard, renderKey, statusBadge, timelineItem } from "../components.js";
import { LiveAnswers, streamStatusElement } from "../live.js";
import { Refresher } from "../refresher.js";
import { agentPicker, busyPicker, startErrorText } from "./agents.js";

const POLL_MS = 4000;
const PAGE = 200;

export function mountConversation(main, conversationId) {
  const timeline = h("ol", { class: "timeline", "aria-label": "Conversation timeline" });
  const live = h("ol", { class: "timeline live", "aria-label": "Answer being written" });
  const streamStatus = streamStatusElement();
  const activeArea = h("div", { class: "turn-bar active-turn", "aria-label": "Latest turn" });
  const questionArea = h("div", { class: "question-area" });
  const loadError = h("div", { class: "notice error", role: "alert", hidden: true });
  const empty = h("p", { class: "empty", hidden: true }, "No messages yet.");
  const earlier = h("button", { type: "button", class: "small", hidden: true }, "Show earlier messages");

  const picker = agentPicker("composer-agent");
  const busy = busyPicker("composer-busy", "reject");
  const inputId = uniqueId("composer-input");
  const input = h("textarea", { id: inputId, rows: 3, required: true, "aria-required": "true" });
  const composerError = h("p", { class: "field-error", id: `${inputId}-error`, hidden: true });
  const composerStatus = h("span", { class: "form-status", role: "status", "aria-live": "polite" });
  const send = h("button", { type: "submit", class: "primary" }, "Send");
  const composer = h(
    "form",
    { class: "card composer", novalidate: true, "aria-labelledby": "composer-title" },
    h("h2", { id: "composer-title" }, "Start a turn"),
    h("div", { class: "inline-fields" }, picker.field, busy.field),
    h("div", { class: "field" }, h("label", { for: inputId }, "Message"), input, composerError),
    h("div", { class: "form-actions" }, send, composerStatus),
  );

  main.replaceChildren(
    h(
      "div",
      { class: "page-head" },
      h("div", {}, h("h1", { tabindex: "-1" }, "Conversation"), h("p", { class: "subtle mono" }, conversationId)),
    ),
    activeArea,
    loadError,
    empty,
    earlier,
    timeline,
    live,
    questionArea,
    composer,
  );

  let stopped = false;
  let activeKey = "";
  let older = []; // pages fetched with `before`, oldest first
  let latest = [];
  let moreBefore = false;
  const handlers = { onChanged: () => refresher.request() };
  const keyed = new KeyedList(timeline, (message) => timelineItem(message, handlers));

  const answers = new LiveAnswers({
    path: `v1/conversations/${seg(conversationId)}/events`,
    storageKey: `conversation.${conversationId}`,
    list: live,
    isShown: (messageId) => keyed.has(messageId),
    showsText: (text) => [...older, ...latest].some((m) => m.role === "assistant" && m.content === text),
    onEvent: (event) => {
      if (event.type !== "MODEL_DELTA" && event.type !== "TOOL_PROGRESS") refresher.request();
    },
    onStatus: (text) => {
      streamStatus.textContent = text;
    },
  });

  function renderActive(turn) {
    const key = turn ? `${turn.id}|${turn.status}|${turn.suspension?.correlation_id ?? ""}` : "";
    if (key === activeKey) return;
    activeKey = key;
    questionArea.replaceChildren();
    replaceChildren(
      activeArea,
      ...(turn
        ? [
            statusBadge(turn.status),
            h("a", { href: `#/turns/${encodeURIComponent(turn.id)}` }, "Latest turn"),
            h("span", { class: "subtle" }, turn.agent_id, " · ", timeElement(turn.updated_at)),
          ]
        : [h("span", { class: "subtle" }, "No turns yet")]),
      h("span", { class: "spacer" }),
      streamStatus,
      turn && !isTerminal(turn.status) ? cancelControl(turn, handlers) : null,
    );
    if (!turn) return;
    if (turn.status === "WAITING_FOR_USER" && turn.suspension && !turn.suspension.form) {
      questionArea.append(questionCard(turn, handlers));
    }
    if (turn.agent_id) picker.prefer(turn.agent_id);
  }

  async function refresh() {
    const [messages, turns] = await Promise.all([
      api.conversationMessages(conversationId, { limit: PAGE }),
      api.listTurns({ conversation_id: conversationId, limit: 1 }),
    ]);
    if (stopped) return;
    latest = messages.items || [];
    if (!older.length) moreBefore = latest.length >= PAGE;
    const items = drawTimeline();
    answers.prune();
    empty.hidden = items.length > 0 || live.children.length > 0;
    renderActive((turns.items || [])[0] || null);
    loadError.hidden = true;
  }

  function drawTimeline() {
    const seen = new Set();
    const items = [...older, ...latest].filter((m) => m.role !== "system" && !seen.has(m.id) && seen.add(m.id));
    keyed.update(items, renderKey, (m) => m.id);
    earlier.hidden = !moreBefore;
    return items;
  }

  earlier.addEventListener("click", async () => {
    const first = older[0] || latest[0];
    if (!first) return;
    earlier.disabled = true;
    try {
      const page = await api.conversationMessages(conversationId, { limit: PAGE, before: first.id });
      const items = page.items || [];
      older = [...items, ...older];
      moreBefore = items.length >= PAGE;
      drawTimeline();
    } catch (error) {
      loadError.textContent = `Could not load earlier messages: ${error.message}`;
      loadError.hidden = false;
    } finally {
      earlier.disabled = false;
    }
  });

  const refresher = new Refresher(refresh, {
    intervalMs: POLL_MS,
    onError: (error) => {
      loadError.textContent = `Could not load the conversation: ${error.message}`;
      loadError.hidden = false;
    },
  });

  composer.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = requiredText(input, composerError, "Please write a message.");
    if (!text) return;
    send.disabled = true;
    composerStatus.textContent = "Starting…";
    try {
      const result = await api.startTurn({ agent_id: picker.select.value, input: text, conversation_id: conversationId, if_busy: busy.select.value });
      input.value = "";
      composerStatus.textContent = result && result.status === "QUEUED" ? "Queued: it starts when the active turn ends." : "Started.";
      refresher.request();
    } catch (error) {
      composerStatus.textContent = "";
      showFieldError(input, composerError, startErrorText(error));
    } finally {
      send.disabled = false;
    }
  });

  // The timeline first, so that replayed answers already shown are not drawn twice.
  refresher.start(() => answers.start());

  return () => {
    stopped = true;
    refresher.stop();
    answers.stop();
  };
}
