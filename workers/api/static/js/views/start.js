// Start a turn: agent, optional conversation, message, and what to do when the
// conversation is busy.

import { api } from "../api.js";
import { h, randomId, replaceChildren, requiredText } from "../dom.js";
import { agentPicker, busyPicker, startErrorText } from "./agents.js";

export function mountStart(main) {
  const picker = agentPicker("start-agent");
  const busy = busyPicker("start-busy");
  const conv = h("input", { id: "start-conversation", type: "text", autocomplete: "off", "aria-describedby": "start-conversation-help" });
  const message = h("textarea", { id: "start-input", rows: 4, required: true, "aria-required": "true" });
  const error = h("p", { class: "field-error", id: "start-input-error", hidden: true });
  const summary = h("div", { class: "notice error", role: "alert", hidden: true });
  const status = h("span", { class: "form-status", role: "status", "aria-live": "polite" });
  const submit = h("button", { type: "submit", class: "primary" }, "Start turn");
  const newConv = h("button", { type: "button", class: "small" }, "New id");
  newConv.addEventListener("click", () => {
    conv.value = `c-${randomId().slice(0, 12)}`;
    conv.focus();
  });
  const form = h(
    "form",
    { class: "card form-grid", novalidate: true },
    h("div", { class: "inline-fields" }, picker.field, busy.field),
    h(
      "div",
      { class: "field" },
      h("label", { for: "start-conversation" }, "Conversation id"),
      h("p", { class: "help", id: "start-conversation-help" }, "Optional. Turns of one conversation share their history; leave empty for a one-off turn."),
      h("div", { class: "inline-fields" }, conv, newConv),
    ),
    h("div", { class: "field" }, h("label", { for: "start-input" }, h("span", {}, "Message"), h("span", { class: "required-mark", "aria-hidden": "true" }, " *")), message, error),
    h("div", { class: "form-actions" }, submit, status),
  );
  main.replaceChildren(h("div", { class: "page-head" }, h("h1", { tabindex: "-1" }, "Start a turn")), summary, form);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    summary.hidden = true;
    const input = requiredText(message, error, "Please write a message.");
    if (!input) return;
    const body = { agent_id: picker.select.value, input, if_busy: busy.select.value };
    const conversationId = conv.value.trim();
    if (conversationId) body.conversation_id = conversationId;
    submit.disabled = true;
    status.textContent = "Starting…";
    try {
      const result = await api.startTurn(body);
      if (result && result.status === "QUEUED") {
        status.textContent = "Queued: it starts when the active turn ends.";
        location.hash = `#/conversations/${encodeURIComponent(result.conversation_id || conversationId)}`;
      } else if (result.conversation_id) {
        location.hash = `#/conversations/${encodeURIComponent(result.conversation_id)}`;
      } else {
        location.hash = `#/turns/${encodeURIComponent(result.id)}`;
      }
    } catch (err) {
      status.textContent = "";
      const detail = (err.details || []).map((d) => `${d.path || "request"}: ${d.message}`);
      replaceChildren(summary, h("p", { style: "margin:0" }, startErrorText(err)), detail.length ? h("ul", {}, detail.map((d) => h("li", {}, d))) : null);
      summary.hidden = false;
      summary.setAttribute("tabindex", "-1");
      summary.focus();
    } finally {
      submit.disabled = false;
    }
  });
}
