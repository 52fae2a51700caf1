// A form rendered from a JSON Schema, with the server's per-field errors shown next to
// each field. Supports string, number, integer, boolean, enum (select), array (add and
// remove items), nested object (fieldset), required marks, defaults, titles and
// descriptions, local $ref and nullable unions. The server validates; this module only
// collects what the person typed, converts numbers and shows the errors that come back.
// Inputs are never re-rendered when errors arrive, so entered values stay as they were.

import { h, uniqueId } from "./dom.js";

const REQUIRED_MESSAGE = /^'(.+)' is a required property$/;

/** Parse a JSON Pointer ("/items/0/name") into segments; dotted paths ("items.0.name") are accepted too. */
export function parsePointer(path) {
  if (path === undefined || path === null || path === "" || path === "/" || path === "$") return [];
  const text = String(path);
  if (text.startsWith("/")) {
    return text
      .slice(1)
      .split("/")
      .map((part) => part.replaceAll("~1", "/").replaceAll("~0", "~"));
  }
  return text.replace(/^\$\.?/, "").split(".").filter((part) => part !== "");
}

/** Words from a property name: "affected_system" -> "Affected system". */
export function humanize(name) {
  const words = String(name)
    .replace(/([a-z0-9])([A-Z])/g, "$1 $2")
    .replace(/[_-]+/g, " ")
    .trim()
    .toLowerCase();
  return words ? words[0].toUpperCase() + words.slice(1) : "";
}

/** Follow local "$ref"s, single-entry "allOf" wrappers and nullable unions. */
function resolve(schema, root, seen = new Set()) {
  if (schema === true || schema === undefined || schema === null) return { schema: {}, nullable: false };
  let current = { ...schema };
  let nullable = false;
  for (let depth = 0; depth < 32; depth += 1) {
    if (typeof current.$ref === "string" && current.$ref.startsWith("#")) {
      const ref = current.$ref;
      if (seen.has(ref)) break;
      seen.add(ref);
      let target = root;
      for (const part of parsePointer(ref.slice(1))) target = target?.[part];
      const { $ref, ...rest } = current;
      current = { ...(target || {}), ...rest };
      continue;
    }
    if (Array.isArray(current.allOf) && current.allOf.length === 1) {
      const { allOf, ...rest } = current;
      current = { ...allOf[0], ...rest };
      continue;
    }
    const union = current.anyOf || current.oneOf;
    if (Array.isArray(union)) {
      const nonNull = union.filter((s) => !(s && s.type === "null"));
      if (nonNull.length < union.length) nullable = true;
      const consts = nonNull.every((s) => s && "const" in s);
      if (consts && nonNull.length > 0) {
        const { anyOf, oneOf, ...rest } = current;
        current = { ...rest, enum: nonNull.map((s) => s.const), enumTitles: nonNull.map((s) => s.title ?? String(s.const)) };
        break;
      }
      if (nonNull.length === 1) {
        const { anyOf, oneOf, ...rest } = current;
        current = { ...nonNull[0], ...rest };
        continue;
      }
    }
    break;
  }
  if (Array.isArray(current.type)) {
    const types = current.type.filter((t) => t !== "null");
    if (types.length < current.type.length) nullable = true;
    current.type = types.length === 1 ? types[0] : types;
  }
  if ("const" in current && !current.enum) current.enum = [current.const];
  return { schema: current, nullable };
}

function kindOf(schema) {
  if (Array.isArray(schema.enum)) return "enum";
  const type = schema.type;
  if (type === "object" || (!type && schema.properties)) return "object";
  if (type === "array" || (!type && schema.items)) return "array";
  if (type === "string" || type === "number" || type === "integer" || type === "boolean") return type;
  return "json";
}

/** Base of every field: a wrapper, a label, help text and an error slot wired with aria-describedby. */
class Field {
  constructor(ctx, schema, options) {
    this.ctx = ctx;
    this.schema = schema;
    this.name = options.name;
    this.required = Boolean(options.required);
    this.inArray = Boolean(options.inArray);
    this.id = uniqueId(ctx.idPrefix);
    this.label = options.label ?? schema.title ?? humanize(options.name ?? "") ?? "";
    this.helpId = schema.description ? `${this.id}-help` : null;
    this.errorId = `${this.id}-error`;
    this.errorEl = h("p", { class: "field-error", id: this.errorId, hidden: true });
    this.messages = [];
  }

  helpElement() {
    return this.helpId ? h("p", { class: "help", id: this.helpId }, this.schema.description) : null;
  }

  labelContent() {
    return [
      h("span", { class: "label-text" }, this.label),
      this.required ? h("span", { class: "required-mark", "aria-hidden": "true", title: "required" }, " *") : null,
    ];
  }

  /** The box of a nested object or an array (`kind`): legend, help, the group's errors, then `content`. */
  fieldsetElement(kind, ...content) {
    return h(
      "fieldset",
      { class: `field ${kind}`, id: this.id, tabindex: "-1" },
      h("legend", {}, this.labelContent()),
      this.helpElement(),
      this.errorEl,
      ...content,
    );
  }

  /** The element that receives focus and carries aria-invalid / aria-describedby. */
  control() {
    return null;
  }

  describe() {
    const control = this.control();
    if (!control) return;
    const ids = [this.helpId, this.messages.length ? this.errorId : null].filter(Boolean);
    if (ids.length) control.setAttribute("aria-describedby", ids.join(" "));
    else control.removeAttribute("aria-describedby");
  }

  child() {
    return null;
  }

  addError(message) {
    this.messages.push(message);
    this.errorEl.replaceChildren(...this.messages.flatMap((m, i) => (i ? [h("br"), m] : [m])));
    this.errorEl.hidden = false;
    this.element.classList.add("has-error");
    const control = this.control();
    if (control) control.setAttribute("aria-invalid", "true");
    this.describe();
  }

  clearErrors() {
    this.messages = [];
    this.errorEl.replaceChildren();
    this.errorEl.hidden = true;
    this.element.classList.remove("has-error");
    const control = this.control();
    if (control) control.removeAttribute("aria-invalid");
    this.describe();
  }

  focus() {
    const control = this.control();
    if (control) control.focus();
  }

  setDisabled() {}
}

class TextField extends Field {
  constructor(ctx, schema, options) {
    super(ctx, schema, options);
    const kind = options.kind;
    this.kind = kind;
    const initial = options.value;
    const common = {
      id: this.id,
      name: this.name ?? this.id,
      required: this.required,
      "aria-required": this.required ? "true" : null,
      autocomplete: "off",
    };
    if (kind === "string" && (schema.format === "textarea" || (schema.maxLength ?? 0) > 200)) {
      this.input = h("textarea", { ...common, rows: 3 });
    } else {
      const type =
        kind === "string"
          ? { email: "email", uri: "url", date: "date", "date-time": "datetime-local", password: "password" }[schema.format] || "text"
          : "text";
      this.input = h("input", {
        ...common,
        type,
        inputmode: kind === "integer" ? "numeric" : kind === "number" ? "decimal" : null,
        placeholder: schema.examples?.[0] !== undefined ? String(schema.examples[0]) : null,
      });
    }
    if (initial !== undefined && initial !== null) this.input.value = String(initial);
    this.element = h(
      "div",
      { class: `field field-${kind}` },
      h("label", { for: this.id }, this.labelContent()),
      this.helpElement(),
      this.input,
      this.errorEl,
    );
    this.describe();
  }

  control() {
    return this.input;
  }

  getValue() {
    const raw = this.input.value;
    if (this.kind === "string") {
      if (raw === "") return this.inArray ? "" : undefined;
      return raw;
    }
    const text = raw.trim();
    if (text === "") return this.inArray ? null : undefined;
    const number = Number(text);
    if (Number.isFinite(number) && (this.kind === "number" || Number.isInteger(number))) return number;
    // Not a number: send the text as typed so the server names the problem next to this field.
    return text;
  }

  setDisabled(disabled) {
    this.input.disabled = disabled;
  }
}

class BooleanField extends Field {
  constructor(ctx, schema, options) {
    super(ctx, schema, options);
    this.input = h("input", { type: "checkbox", id: this.id, name: this.name ?? this.id });
    this.input.checked = options.value === true;
    this.element = h(
      "div",
      { class: "field field-boolean" },
      h("div", { class: "checkbox-row" }, this.input, h("label", { for: this.id }, this.labelContent())),
      this.helpElement(),
      this.errorEl,
    );
    this.describe();
  }

  control() {
    return this.input;
  }

  getValue() {
    return this.input.checked;
  }

  setDisabled(disabled) {
    this.input.disabled = disabled;
  }
}

class EnumField extends Field {
  constructor(ctx, schema, options) {
    super(ctx, schema, options);
    this.values = schema.enum;
    const titles = schema.enumTitles || schema["x-enumNames"] || schema.enumNames || [];
    this.select = h("select", {
      id: this.id,
      name: this.name ?? this.id,
      required: this.required,
      "aria-required": this.required ? "true" : null,
    });
    const initialIndex = this.values.findIndex((v) => JSON.stringify(v) === JSON.stringify(options.value));
    if (initialIndex < 0 || !this.required) {
      this.select.append(h("option", { value: "" }, this.required ? "Choose…" : "—"));
    }
    this.values.forEach((value, index) => {
      const text = titles[index] ?? (value === null ? "none" : String(value));
      this.select.append(h("option", { value: String(index) }, text));
    });
    this.select.value = initialIndex >= 0 ? String(initialIndex) : "";
    this.element = h(
      "div",
      { class: "field field-enum" },
      h("label", { for: this.id }, this.labelContent()),
      this.helpElement(),
      this.select,
      this.errorEl,
    );
    this.describe();
  }

  control() {
    return this.select;
  }

  getValue() {
    if (this.select.value === "") return this.inArray ? null : undefined;
    return this.values[Number(this.select.value)];
  }

  setDisabled(disabled) {
    this.select.disabled = disabled;
  }
}

/** Free JSON for a schema this renderer has no widget for; text that is not JSON is sent as a string. */
class JsonField extends TextField {
  constructor(ctx, schema, options) {
    const value = options.value === undefined ? undefined : JSON.stringify(options.value);
    super(ctx, { ...schema, format: "textarea" }, { ...options, kind: "string", value });
    this.element.classList.add("field-json");
  }

  getValue() {
    const raw = this.input.value.trim();
    if (raw === "") return this.inArray ? null : undefined;
    try {
      return JSON.parse(raw);
    } catch {
      return raw;
    }
  }
}

class ObjectField extends Field {
  constructor(ctx, schema, options) {
    super(ctx, schema, options);
    this.isRoot = Boolean(options.root);
    const initial = options.value && typeof options.value === "object" ? options.value : {};
    const required = new Set(schema.required || []);
    this.children = new Map();
    const body = [];
    for (const [name, propSchema] of Object.entries(schema.properties || {})) {
      const child = createField(ctx, propSchema, { name, required: required.has(name), value: initial[name] });
      this.children.set(name, child);
      body.push(child.element);
    }
    this.errorEl.classList.add("group-error");
    if (this.isRoot) {
      this.element = h("div", { class: "form-fields" }, this.helpElement(), this.errorEl, body);
    } else {
      this.element = this.fieldsetElement("field-object", body);
    }
    this.describe();
  }

  control() {
    return this.isRoot ? null : this.element;
  }

  child(segment) {
    return this.children.get(segment) || null;
  }

  getValue() {
    const value = {};
    let any = false;
    for (const [name, child] of this.children) {
      const childValue = child.getValue();
      if (childValue !== undefined) {
        value[name] = childValue;
        if (!(child instanceof BooleanField) || childValue) any = true;
      }
    }
    if (!any && !this.required && !this.isRoot && !this.inArray) return undefined;
    return value;
  }

  clearErrors() {
    super.clearErrors();
    for (const child of this.children.values()) child.clearErrors();
  }

  setDisabled(disabled) {
    for (const child of this.children.values()) child.setDisabled(disabled);
  }

  focus() {
    if (this.isRoot) this.children.values().next().value?.focus();
    else this.element.focus();
  }
}

class ArrayField extends Field {
  constructor(ctx, schema, options) {
    super(ctx, schema, options);
    this.itemSchema = schema.items && typeof schema.items === "object" ? schema.items : {};
    this.items = [];
    this.list = h("ol", { class: "array-items" });
    this.addButton = h(
      "button",
      { type: "button", class: "secondary small", onClick: () => this.addItem(undefined, true) },
      `Add ${this.itemNoun()}`,
    );
    this.errorEl.classList.add("group-error");
    this.element = this.fieldsetElement("field-array", this.list, h("div", { class: "array-actions" }, this.addButton));
    const initial = Array.isArray(options.value) ? options.value : [];
    for (const value of initial) this.addItem(value, false);
    for (let i = this.items.length; i < (schema.minItems || 0); i += 1) this.addItem(undefined, false);
    this.describe();
  }

  itemNoun() {
    const { schema } = resolve(this.itemSchema, this.ctx.root);
    return (schema.title || "item").toLowerCase();
  }

  control() {
    return this.element;
  }

  addItem(value, focus) {
    const item = { field: null, row: null, remove: null };
    item.field = createField(this.ctx, this.itemSchema, { name: null, label: "", value, inArray: true });
    item.remove = h("button", { type: "button", class: "secondary small remove", onClick: () => this.removeItem(item) }, "Remove");
    item.row = h("li", { class: "array-item" }, item.field.element, item.remove);
    this.items.push(item);
    this.list.append(item.row);
    this.relabel();
    if (focus) item.field.focus();
  }

  removeItem(item) {
    const index = this.items.indexOf(item);
    if (index < 0) return;
    this.items.splice(index, 1);
    item.row.remove();
    this.relabel();
    // Keep keyboard focus in the list: the next item, else the previous, else "Add".
    const next = this.items[index] || this.items[index - 1];
    if (next) next.remove.focus();
    else this.addButton.focus();
  }

  relabel() {
    const noun = this.itemNoun();
    const name = this.label || "list";
    this.items.forEach((item, index) => {
      const text = `${noun[0].toUpperCase()}${noun.slice(1)} ${index + 1}`;
      item.field.label = text;
      const labelText = item.field.element.querySelector(":scope > label .label-text, :scope > legend .label-text, :scope > .checkbox-row label .label-text");
      if (labelText) labelText.textContent = text;
      item.remove.setAttribute("aria-label", `Remove ${noun} ${index + 1} of ${name}`);
    });
  }

  child(segment) {
    if (!/^\d+$/.test(segment)) return null;
    return this.items[Number(segment)]?.field || null;
  }

  getValue() {
    if (this.items.length === 0 && !this.required && this.schema.default === undefined) return undefined;
    return this.items.map((item) => {
      const value = item.field.getValue();
      return value === undefined ? null : value;
    });
  }

  clearErrors() {
    super.clearErrors();
    for (const item of this.items) item.field.clearErrors();
  }

  setDisabled(disabled) {
    this.addButton.disabled = disabled;
    for (const item of this.items) {
      item.remove.disabled = disabled;
      item.field.setDisabled(disabled);
    }
  }
}

/** Build the field for `schema` (resolved against `ctx.root`). */
export function createField(ctx, rawSchema, options = {}) {
  const { schema, nullable } = resolve(rawSchema, ctx.root);
  const value = options.value !== undefined ? options.value : schema.default;
  const opts = { ...options, value, nullable };
  switch (kindOf(schema)) {
    case "object":
      return new ObjectField(ctx, schema, opts);
    case "array":
      return new ArrayField(ctx, schema, opts);
    case "enum":
      return new EnumField(ctx, schema, opts);
    case "boolean":
      return new BooleanField(ctx, schema, opts);
    case "string":
    case "number":
    case "integer":
      return new TextField(ctx, schema, { ...opts, kind: kindOf(schema) });
    default:
      return new JsonField(ctx, schema, opts);
  }
}

/**
 * A `<form>` for a JSON Schema.
 *
 * Options: `idPrefix` (ids of the inputs), `value` (initial data; schema defaults fill the
 * rest), `submitLabel`, `onSubmit(value)`: an async function; when it throws an error with
 * `details` (`[{path, message}]`, JSON-Pointer paths) each message is shown next to its
 * field, and any other error message is shown above the fields. After a successful
 * submission the form stays disabled unless `reusable` is true.
 */
export class SchemaForm {
  constructor(schema, { idPrefix = "form", value, submitLabel = "Submit", onSubmit, extra, reusable = false } = {}) {
    this.schema = schema || {};
    this.onSubmit = onSubmit;
    this.reusable = reusable;
    const ctx = { root: this.schema, idPrefix };
    this.root = createField(ctx, this.schema, { root: true, name: null, required: true, value });
    if (!(this.root instanceof ObjectField)) this.root.element.classList.add("root-field");
    this.summaryList = h("ul");
    this.summary = h(
      "div",
      { class: "error-summary", role: "alert", tabindex: "-1", hidden: true },
      h("p", { class: "error-summary-title" }, "Please correct the following:"),
      this.summaryList,
    );
    this.submitButton = h("button", { type: "submit", class: "primary" }, submitLabel);
    this.status = h("span", { class: "form-status", role: "status", "aria-live": "polite" });
    const hasRequired = this.root.element.querySelector(".required-mark");
    this.element = h(
      "form",
      { class: "schema-form", novalidate: true },
      this.summary,
      hasRequired ? h("p", { class: "required-note" }, "Fields marked ", h("span", { class: "required-mark", "aria-hidden": "true" }, "*"), " are required.") : null,
      this.root.element,
      extra || null,
      h("div", { class: "form-actions" }, this.submitButton, this.status),
    );
    this.element.addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
  }

  getValue() {
    const value = this.root.getValue();
    return value === undefined ? {} : value;
  }

  clearErrors() {
    this.root.clearErrors();
    this.summaryList.replaceChildren();
    this.summary.hidden = true;
  }

  /** Show errors next to their fields; returns how many found no field (those show in the summary only). */
  showErrors(details, message) {
    this.clearErrors();
    let unmatched = 0;
    const entries = [];
    for (const detail of details || []) {
      const field = this.locate(detail);
      if (field && field !== this.root) {
        field.addError(detail.message);
        entries.push({ field, message: detail.message });
      } else {
        if (field === this.root && this.root.addError && !(this.root instanceof ObjectField)) this.root.addError(detail.message);
        unmatched += 1;
        entries.push({ field: null, message: detail.message });
      }
    }
    if (!entries.length && message) entries.push({ field: null, message });
    for (const { field, message: text } of entries) {
      const label = field ? this.pathLabel(field) : null;
      const item = field
        ? h(
            "li",
            {},
            h(
              "button",
              { type: "button", class: "link", onClick: () => field.focus() },
              label ? `${label}: ${text}` : text,
            ),
          )
        : h("li", {}, text);
      this.summaryList.append(item);
    }
    this.summary.hidden = entries.length === 0;
    if (entries.length) this.summary.focus();
    return unmatched;
  }

  /** The deepest field a detail's path reaches; "'x' is a required property" goes to field x. */
  locate(detail) {
    let node = this.root;
    for (const segment of parsePointer(detail.path)) {
      const next = node.child(segment);
      if (!next) return node;
      node = next;
    }
    const missing = REQUIRED_MESSAGE.exec(detail.message || "");
    if (missing && node.child(missing[1])) return node.child(missing[1]);
    return node;
  }

  pathLabel(field) {
    return field.label || "";
  }

  setDisabled(disabled) {
    this.root.setDisabled(disabled);
    this.submitButton.disabled = disabled;
  }

  async submit() {
    if (!this.onSubmit) return;
    this.clearErrors();
    const value = this.getValue();
    this.setDisabled(true);
    this.status.textContent = "Sending…";
    try {
      await this.onSubmit(value);
      this.status.textContent = "Sent.";
      // A one-shot form stays disabled so it cannot be sent twice; the page replaces it.
      if (this.reusable) this.setDisabled(false);
    } catch (error) {
      this.status.textContent = "";
      this.setDisabled(false);
      this.showErrors(error.details || [], error.message || String(error));
      return;
    }
  }
}
