// What every view shares: messages, going to a route, and asking for a refresh now.

import { ApiError } from "./api.js";
import { h } from "./dom.js";

export function toast(text, kind = "ok") {
  let box = document.querySelector(".toasts");
  if (!box) box = document.body.appendChild(h("div", { class: "toasts", "aria-live": "polite" }));
  const el = h("div", { class: `toast toast-${kind}`, role: "status", "data-testid": "toast" }, text);
  box.append(el);
  setTimeout(() => el.remove(), kind === "error" ? 8000 : 4000);
}

export function errorText(err) {
  if (err instanceof ApiError) return err.field ? `${err.field}: ${err.message}` : err.message;
  return String(err && err.message ? err.message : err);
}

let router = () => {};
let refresher = async () => {};
export function setRouter(route, refresh) { router = route; refresher = refresh; }

export function go(hash) {
  if (location.hash === hash) router();
  else location.hash = hash;
}

export function refreshNow() { return refresher(); }

// Runs an action of a button: disabled while it runs, a message when it is done or refused.
export async function act(button, action, done) {
  button.disabled = true;
  try {
    const result = await action();
    if (done) toast(typeof done === "function" ? done(result) : done);
    await refreshNow();
    return result;
  } catch (err) {
    toast(errorText(err), "error");
    return undefined;
  } finally {
    button.disabled = false;
  }
}
