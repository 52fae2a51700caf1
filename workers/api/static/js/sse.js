// Server-sent events over fetch(), so that the request can carry an Authorization header
// (EventSource cannot). Parses text/event-stream as the HTML standard describes and
// reconnects with Last-Event-ID like EventSource does.

/** Incremental text/event-stream parser: feed it decoded text, it calls `onEvent` per dispatched event. */
export class EventStreamParser {
  constructor(onEvent, onRetry = () => {}) {
    this.onEvent = onEvent;
    this.onRetry = onRetry;
    this.buffer = "";
    this.lastEventId = "";
    this.reset();
  }

  reset() {
    this.eventType = "";
    this.data = [];
    this.idSeen = false;
  }

  feed(text) {
    this.buffer += text;
    // Lines end with CRLF, LF or CR. A CR at the very end may be the first half of a CRLF: wait.
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (!match) break;
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      this.line(line);
    }
  }

  line(line) {
    if (line === "") {
      this.dispatch();
      return;
    }
    if (line.startsWith(":")) return; // comment (keep-alive)
    const colon = line.indexOf(":");
    let field = line;
    let value = "";
    if (colon >= 0) {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
    }
    if (field === "event") this.eventType = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id") {
      if (!value.includes("\0")) {
        this.lastEventId = value;
        this.idSeen = true;
      }
    } else if (field === "retry" && /^\d+$/.test(value)) this.onRetry(Number(value));
  }

  dispatch() {
    const hasData = this.data.length > 0;
    // The standard drops events without data; a bare `event: end` still means the end here.
    if (hasData || this.eventType) {
      this.onEvent({ id: this.lastEventId, type: this.eventType || "message", data: this.data.join("\n") });
    }
    this.reset();
  }
}

/**
 * A reconnecting event stream.
 *
 * Options: `headers()` returns request headers (called on every connect), `lastEventId`
 * resumes after a known cursor, `onEvent({id, type, data})`, `onState(state, detail)` with
 * state "connecting" | "open" | "retrying" | "closed" | "ended" | "error", and
 * `endEvent` (default "end"): the event type after which the stream is finished for good.
 */
export class EventStream {
  constructor(url, { headers = () => ({}), lastEventId = "", onEvent, onState = () => {}, endEvent = "end" } = {}) {
    this.url = url;
    this.headers = headers;
    this.lastEventId = lastEventId || "";
    this.onEvent = onEvent;
    this.onState = onState;
    this.endEvent = endEvent;
    this.retryMs = 1000;
    this.failures = 0;
    this.closed = false;
    this.controller = null;
    this.timer = null;
  }

  start() {
    this.closed = false;
    this.connect();
    return this;
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.controller) this.controller.abort();
    this.onState("closed");
  }

  async connect() {
    if (this.closed) return;
    this.controller = new AbortController();
    const headers = { Accept: "text/event-stream", "Cache-Control": "no-cache", ...this.headers() };
    if (this.lastEventId) headers["Last-Event-ID"] = this.lastEventId;
    this.onState("connecting");
    let ended = false;
    try {
      const response = await fetch(this.url, { headers, signal: this.controller.signal, cache: "no-store" });
      if (response.status === 204) {
        this.finish("ended");
        return;
      }
      if (!response.ok) {
        const fatal = response.status >= 400 && response.status < 500 && response.status !== 408 && response.status !== 429;
        this.onState("error", { status: response.status, fatal });
        if (fatal) {
          this.closed = true;
          return;
        }
        throw new Error(`HTTP ${response.status}`);
      }
      this.onState("open");
      this.failures = 0;
      const parser = new EventStreamParser(
        (event) => {
          if (event.id) this.lastEventId = event.id;
          if (event.type === this.endEvent) ended = true;
          this.onEvent(event);
        },
        (ms) => {
          this.retryMs = ms;
        },
      );
      parser.lastEventId = this.lastEventId;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      while (!ended) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.feed(value);
      }
      if (ended) {
        reader.cancel().catch(() => {});
        this.finish("ended");
        return;
      }
    } catch (error) {
      if (this.closed) return;
      this.failures += 1;
    }
    if (this.closed) return;
    // The server closed the stream or the network failed: come back after the cursor.
    const delay = Math.min(this.retryMs * 2 ** Math.min(this.failures, 4), 15000);
    this.onState("retrying", { delay });
    this.timer = setTimeout(() => this.connect(), delay);
  }

  finish(state) {
    this.closed = true;
    this.onState(state);
  }
}
