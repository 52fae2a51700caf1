// Small DOM functions shared by every module of the console (no framework).

/**
 * Create an element.
 *
 * `attrs` keys: `class`, `text`, `html` is not supported on purpose (no innerHTML),
 * `on<Event>` for listeners, `dataset` for data-* attributes, boolean values toggle an
 * attribute, `null`/`undefined`/`false` leave it out. Children may be nodes, strings,
 * numbers, arrays (flattened) or null (skipped).
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === "value" && "value" in el) el.value = value;
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

/** Append children (nodes, strings, nested arrays; null skipped) to `parent`. */
export function append(parent, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/** Remove every child of `el`, then append `children`. */
export function replaceChildren(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

let counter = 0;

/** A document-unique id with a readable prefix. */
export function uniqueId(prefix = "id") {
  counter += 1;
  return `${prefix}-${counter}`;
}

/** A random id for Idempotency-Key headers; works outside secure contexts too. */
export function randomId() {
  if (globalThis.crypto && typeof crypto.randomUUID === "function" && globalThis.isSecureContext) {
    return crypto.randomUUID();
  }
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Local date and time of an ISO timestamp, or "" when absent. */
export function formatTime(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  return date.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

/** A `<time>` element for an ISO timestamp. */
export function timeElement(iso) {
  return h("time", { datetime: iso, title: iso }, formatTime(iso));
}

/** Show `text` in a lone control's error element and mark the control invalid, pointing at it. */
export function showFieldError(control, error, text) {
  error.textContent = text;
  error.hidden = false;
  control.setAttribute("aria-invalid", "true");
  control.setAttribute("aria-describedby", error.id);
}

/** Hide a lone control's error element and drop the marks `showFieldError` set. */
export function clearFieldError(control, error) {
  error.hidden = true;
  control.removeAttribute("aria-invalid");
  control.removeAttribute("aria-describedby");
}

/** The trimmed text of a lone required control; when it is empty, `message` shows as its error and it gets focus. */
export function requiredText(control, error, message) {
  clearFieldError(control, error);
  const text = control.value.trim();
  if (!text) {
    showFieldError(control, error, message);
    control.focus();
  }
  return text;
}
