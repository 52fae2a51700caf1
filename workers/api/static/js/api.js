// Client of the agent-runner HTTP API (`/v1`). The console talks to nothing else.

import { randomId } from "./dom.js";

const KEY_STORAGE = "agent-runner.api-key";

/** Fired on `authEvents` with type "unauthorized" when the server answers 401, and "changed" on sign-in/out. */
export const authEvents = new EventTarget();

export function getApiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

export function setApiKey(key) {
  const previous = getApiKey();
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
  if (previous !== key) authEvents.dispatchEvent(new Event("changed"));
}

/** Headers that authenticate a request: a bearer key when one was entered, none in loopback dev mode. */
export function authHeaders() {
  const key = getApiKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** An API URL relative to the page, so the console also works when mounted under a path prefix. */
export function apiUrl(path, query) {
  const url = new URL(path.replace(/^\//, ""), document.baseURI);
  for (const [name, value] of Object.entries(query || {})) {
    // An array repeats the parameter (`?status=A&status=B`).
    for (const item of Array.isArray(value) ? value : [value]) {
      if (item === undefined || item === null || item === "") continue;
      url.searchParams.append(name, String(item));
    }
  }
  return url.toString();
}

/** Percent-encode one path segment (ids may hold `:` and `.`). */
export function seg(value) {
  return encodeURIComponent(String(value));
}

/** A failed API call: HTTP status plus the server's `{"error": {type, message, details}}`. */
export class ApiError extends Error {
  constructor(status, error, body) {
    super(error.message || `HTTP ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.type = error.type || "";
    this.details = normalizeDetails(error.details);
    this.error = error;
    this.body = body;
  }
}

/**
 * Per-field details as `[{path, message}]` with JSON-Pointer paths. Also accepts FastAPI's
 * default `[{loc: [...], msg}]` so a validation error of the request body still lands on a field.
 */
function normalizeDetails(details) {
  if (!Array.isArray(details)) return [];
  return details
    .filter((d) => d && typeof d === "object")
    .map((d) => {
      if (typeof d.path === "string") return { path: d.path, message: String(d.message ?? d.msg ?? "") };
      if (Array.isArray(d.path)) return { path: toPointer(d.path), message: String(d.message ?? d.msg ?? "") };
      if (Array.isArray(d.loc)) return { path: toPointer(d.loc.slice(1)), message: String(d.msg ?? d.message ?? "") };
      return { path: "", message: String(d.message ?? d.msg ?? JSON.stringify(d)) };
    });
}

function toPointer(parts) {
  return parts.map((p) => "/" + String(p).replaceAll("~", "~0").replaceAll("/", "~1")).join("");
}

function errorFromBody(status, body) {
  if (body && typeof body === "object") {
    if (body.error && typeof body.error === "object") return body.error;
    if (Array.isArray(body.detail)) return { type: "ValidationError", message: "The request was not valid.", details: body.detail };
    if (typeof body.detail === "string") return { message: body.detail };
  }
  return { message: status === 401 ? "An API key is required." : `The server answered HTTP ${status}.` };
}

/**
 * Call the API and return the parsed JSON body (or null for an empty one).
 *
 * `idempotencyKey` (true for a fresh random key, or a string) sets the Idempotency-Key header
 * so that a retried POST never acts twice. Throws `ApiError` for any non-2xx answer.
 */
export async function request(method, path, { body, query, idempotencyKey, signal } = {}) {
  const headers = { Accept: "application/json", ...authHeaders() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey === true ? randomId() : idempotencyKey;
  let response;
  try {
    response = await fetch(apiUrl(path, query), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, { type: "NetworkError", message: "The server could not be reached." }, null);
  }
  const text = await response.text();
  let parsed = null;
  if (text) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
  }
  if (!response.ok) {
    if (response.status === 401) authEvents.dispatchEvent(new Event("unauthorized"));
    throw new ApiError(response.status, errorFromBody(response.status, parsed), parsed);
  }
  return parsed;
}

export const api = {
  listAgents: () => request("GET", "v1/agents"),
  listTurns: (query, options) => request("GET", "v1/turns", { query, ...options }),
  getTurn: (id, { messages = false } = {}) =>
    request("GET", `v1/turns/${seg(id)}`, { query: messages ? { messages: "true" } : undefined }),
  startTurn: (body) => request("POST", "v1/turns", { body, idempotencyKey: true }),
  resume: (id, body) => request("POST", `v1/turns/${seg(id)}/resume`, { body, idempotencyKey: true }),
  cancel: (id, reason) => request("POST", `v1/turns/${seg(id)}/cancel`, { body: reason ? { reason } : {}, idempotencyKey: true }),
  conversationMessages: (id, query) => request("GET", `v1/conversations/${seg(id)}/messages`, { query }),
};
