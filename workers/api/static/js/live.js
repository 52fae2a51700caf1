// Live answers: follows an event stream of the API, appends MODEL_DELTA text, replaces it
// with the whole text of MODEL_RESPONSE, and keeps the cursor and the partial text in
// sessionStorage so that a reconnect or a page reload continues with no gap and no repeat.
// Messages queued behind a busy conversation (MESSAGE_QUEUED) show with their place in
// line until the TURN_STARTED of the turn they became (or their MESSAGE_FAILED).

import { apiUrl, authHeaders, authEvents } from "./api.js";
import { TERMINAL_EVENT_TYPES } from "../../console/contract.js";
import { h } from "./dom.js";
import { queuedItem, streamingItem } from "./components.js";
import { EventStream } from "./sse.js";

const STATE_PREFIX = "agent-runner.stream.";

/** Forget every saved stream position (another API key sees other events). */
export function clearStreamStates() {
  for (let i = sessionStorage.length - 1; i >= 0; i -= 1) {
    const key = sessionStorage.key(i);
    if (key && key.startsWith(STATE_PREFIX)) sessionStorage.removeItem(key);
  }
}

authEvents.addEventListener("changed", clearStreamStates);

/**
 * Follow `path` (an events endpoint) and draw the answers being written into `list`.
 *
 * `storageKey` names the saved position; `isShown(messageId)` tells whether the timeline
 * already shows a final message (its streamed copy is then dropped), `showsText(text)`
 * whether it shows an answer with exactly this text; `onEvent(event)` is
 * called for every event after the live text was updated; `onStatus(text)` describes the
 * connection for people.
 */
export class LiveAnswers {
  constructor({ path, storageKey, list, isShown, showsText = () => false, onEvent = () => {}, onStatus = () => {} }) {
    this.path = path;
    this.storageKey = STATE_PREFIX + storageKey;
    this.list = list;
    this.isShown = isShown;
    this.showsText = showsText;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.state = this.load();
    this.partials = new Map(); // turn id -> streaming item
    this.finals = new Map(); // message id -> finished item
    this.queuedItems = new Map(); // turn id the message starts as -> queued item
    this.stream = null;
    for (const [turnId, text] of Object.entries(this.state.partials)) this.partial(turnId).setText(text);
    for (const turnId of Object.keys(this.state.queued)) this.showQueued(turnId);
    this.renumberQueued();
  }

  load() {
    try {
      const saved = JSON.parse(sessionStorage.getItem(this.storageKey) || "null");
      if (saved && typeof saved === "object" && saved.partials && typeof saved.partials === "object") {
        const queued = saved.queued && typeof saved.queued === "object" ? saved.queued : {};
        return { cursor: typeof saved.cursor === "string" ? saved.cursor : "", partials: saved.partials, queued };
      }
    } catch {
      // A damaged entry is dropped: the stream replays from the start instead.
    }
    return { cursor: "", partials: {}, queued: {} };
  }

  save() {
    try {
      sessionStorage.setItem(this.storageKey, JSON.stringify(this.state));
    } catch {
      // Storage full or disabled: the live view still works, a reload replays more.
    }
  }

  start() {
    this.stream = new EventStream(apiUrl(this.path), {
      headers: authHeaders,
      lastEventId: this.state.cursor,
      onEvent: (event) => this.handle(event),
      onState: (state, detail) => this.onStatus(describeState(state, detail)),
    }).start();
    return this;
  }

  stop() {
    if (this.stream) this.stream.close();
    this.stream = null;
  }

  partial(turnId) {
    let entry = this.partials.get(turnId);
    if (!entry) {
      entry = streamingItem(turnId);
      this.partials.set(turnId, entry);
      this.list.append(entry.item);
    }
    return entry;
  }

  showQueued(turnId) {
    const queued = this.state.queued[turnId];
    let entry = this.queuedItems.get(turnId);
    if (!entry) {
      entry = queuedItem(turnId, String(queued.content ?? ""));
      this.queuedItems.set(turnId, entry);
      this.list.append(entry.item);
    }
    if (queued.error !== undefined) entry.fail(String(queued.error));
  }

  dropQueued(turnId) {
    const entry = this.queuedItems.get(turnId);
    if (entry) entry.item.remove();
    this.queuedItems.delete(turnId);
    delete this.state.queued[turnId];
  }

  /** Each waiting message's place in line: 1 + the waiting messages queued before it. */
  renumberQueued() {
    const waiting = Object.entries(this.state.queued).filter(([, q]) => q.error === undefined);
    for (const [turnId, queued] of waiting) {
      const before = waiting.filter(([, other]) => other.sequence < queued.sequence).length;
      this.queuedItems.get(turnId)?.setLine(before + 1);
    }
  }

  handle(event) {
    let payload = {};
    try {
      payload = event.data ? JSON.parse(event.data) : {};
    } catch {
      payload = {};
    }
    const data = payload.data || {};
    const turnId = payload.turn_id || "";
    if (event.type === "MODEL_DELTA" && turnId) {
      const text = (this.state.partials[turnId] || "") + String(data.delta ?? "");
      this.state.partials[turnId] = text;
      this.partial(turnId).setText(text);
    } else if (event.type === "MODEL_RESPONSE" && turnId) {
      // `content` is the whole text (null when the model only called tools): it replaces what streamed.
      const text = typeof data.content === "string" ? data.content : "";
      delete this.state.partials[turnId];
      const entry = this.partials.get(turnId);
      this.partials.delete(turnId);
      const messageId = data.message_id || "";
      if (text && !(messageId && this.isShown(messageId))) {
        const finished = entry || streamingItem(turnId);
        finished.finish(text, messageId);
        if (!entry) this.list.append(finished.item);
        if (messageId) this.finals.set(messageId, finished);
      } else if (entry) {
        entry.item.remove();
      }
    } else if (event.type === "MESSAGE_QUEUED" && turnId) {
      this.state.queued[turnId] = { content: data.content, sequence: Number(data.sequence) || 0 };
      this.showQueued(turnId);
      this.renumberQueued();
    } else if (event.type === "MESSAGE_FAILED" && this.state.queued[turnId]) {
      this.state.queued[turnId].error = String(data.error ?? "");
      this.showQueued(turnId);
      this.renumberQueued();
    } else if (event.type === "TURN_STARTED" && data.queued_message_id && this.state.queued[turnId]) {
      // The queued message became this turn: the timeline shows it from now on.
      this.dropQueued(turnId);
      this.renumberQueued();
    } else if (payload.type && isEnd(payload.type) && turnId) {
      // The turn ended without a final answer (cancelled, failed): drop its partial text.
      delete this.state.partials[turnId];
      const entry = this.partials.get(turnId);
      if (entry) entry.item.remove();
      this.partials.delete(turnId);
    }
    if (event.id) this.state.cursor = event.id;
    this.save();
    this.onEvent({ type: event.type, id: event.id, payload });
  }

  /** Drop streamed copies of answers the timeline now shows itself. */
  prune() {
    for (const [messageId, entry] of this.finals) {
      if (this.isShown(messageId)) {
        entry.item.remove();
        this.finals.delete(messageId);
      }
    }
    // The timeline may show a finished answer before its MODEL_RESPONSE event arrives:
    // a partial text that equals a shown answer is that answer.
    let changed = false;
    for (const [turnId, entry] of this.partials) {
      const text = this.state.partials[turnId];
      if (text && this.showsText(text)) {
        entry.item.remove();
        this.partials.delete(turnId);
        delete this.state.partials[turnId];
        changed = true;
      }
    }
    if (changed) this.save();
  }
}

const END_TYPES = new Set(TERMINAL_EVENT_TYPES);

function isEnd(type) {
  return END_TYPES.has(type);
}

function describeState(state, detail) {
  switch (state) {
    case "connecting":
      return "Connecting…";
    case "open":
      return "Live";
    case "retrying":
      return "Connection lost; reconnecting…";
    case "ended":
      return "Finished";
    case "error":
      return detail && detail.status === 401 ? "Sign in to follow live events" : `Live events unavailable (HTTP ${detail?.status})`;
    default:
      return "";
  }
}

/** A small live-status line for the page. */
export function streamStatusElement() {
  return h("p", { class: "stream-status", role: "status", "aria-live": "polite" });
}
