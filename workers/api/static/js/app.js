// Console entry point: hash routes, the sign-in box and the header.

import { authEvents, getApiKey, setApiKey } from "./api.js";
import { h } from "./dom.js";
import { mountConversation } from "./views/conversation.js";
import { mountStart } from "./views/start.js";
import { mountTurn } from "./views/turn.js";
import { mountWaiting } from "./views/waiting.js";

const main = document.getElementById("main");
const authArea = document.getElementById("auth-area");
const dialog = document.getElementById("sign-in");
const keyInput = document.getElementById("api-key");
const signInReason = document.getElementById("sign-in-reason");

const routes = [
  { pattern: /^#?\/?$/, nav: "waiting", mount: (el) => mountWaiting(el), title: "Waiting" },
  { pattern: /^#\/start$/, nav: "start", mount: (el) => mountStart(el), title: "Start a turn" },
  { pattern: /^#\/conversations\/(.+)$/, nav: null, mount: (el, id) => mountConversation(el, id), title: "Conversation" },
  { pattern: /^#\/turns\/(.+)$/, nav: null, mount: (el, id) => mountTurn(el, id), title: "Turn" },
];

let unmount = null;

function route() {
  if (unmount) unmount();
  unmount = null;
  const hash = location.hash || "#/";
  const found = routes.find((r) => r.pattern.test(hash));
  for (const link of document.querySelectorAll(".main-nav a")) {
    if (found && link.dataset.nav === found.nav) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (!found) {
    main.replaceChildren(h("h1", { tabindex: "-1" }, "Not found"), h("p", {}, h("a", { href: "#/" }, "Back to the waiting list")));
    document.title = "Not found · agent-runner";
    return;
  }
  const match = hash.match(found.pattern);
  let param = match[1];
  if (param !== undefined) {
    try {
      param = decodeURIComponent(param);
    } catch {
      // Leave a malformed escape as typed; the server answers 404 or 422 for it.
    }
  }
  document.title = `${found.title} · agent-runner`;
  unmount = found.mount(main, param) || null;
  // Move focus to the new page's heading so keyboard and screen-reader users follow along.
  const heading = main.querySelector("h1");
  if (heading && document.activeElement && document.activeElement !== document.body && !main.contains(document.activeElement)) {
    heading.focus({ preventScroll: true });
  }
}

function renderAuth() {
  const key = getApiKey();
  authArea.replaceChildren(
    key
      ? h("span", {}, "Signed in with an API key")
      : h("span", {}, "No API key"),
    key
      ? h("button", { type: "button", class: "small", onClick: () => setApiKey("") }, "Sign out")
      : h("button", { type: "button", class: "small", onClick: () => openSignIn("") }, "Sign in"),
  );
}

function openSignIn(reason) {
  signInReason.textContent = reason;
  signInReason.hidden = !reason;
  keyInput.value = "";
  if (!dialog.open) dialog.showModal();
  keyInput.focus();
}

dialog.querySelector("form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = keyInput.value.trim();
  if (!key) {
    keyInput.setAttribute("aria-invalid", "true");
    keyInput.focus();
    return;
  }
  keyInput.removeAttribute("aria-invalid");
  dialog.close();
  setApiKey(key);
});
document.getElementById("sign-in-cancel").addEventListener("click", () => dialog.close());

authEvents.addEventListener("unauthorized", () => {
  openSignIn(getApiKey() ? "The server did not accept this API key. Enter another one." : "This server needs an API key.");
});
authEvents.addEventListener("changed", () => {
  renderAuth();
  route();
});

window.addEventListener("hashchange", route);
renderAuth();
route();

// The skip link must not change the hash: the hash is the route.
document.querySelector(".skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});
