// The shell: sign-in, the top bar, the routes (#/jobs, #/jobs/<id>, #/jobs/<id>/edit,
// #/new, #/runs, #/dead, #/stats) and a refresh every few seconds while the tab is visible.

import { api, ApiError, get, session, whenUnauthorized } from "./api.js";
import { h, replace } from "./dom.js";
import { errorText, go, setRouter } from "./ui.js";
import { deadView } from "./dead.js";
import { editorView } from "./editor.js";
import { jobView } from "./job.js";
import { jobsView } from "./jobs.js";
import { runsView } from "./runs.js";
import { statsView } from "./stats.js";

const REFRESH_MS = 3000;
const root = document.getElementById("app");
let current = null; // { refresh, stop? } of the view on screen
let timer = null;
let team = null;

function signInView(message) {
  const input = h("input", {
    type: "password", name: "token", id: "token", autocomplete: "off", spellcheck: "false",
    placeholder: "the team's bearer token", "data-testid": "token",
  });
  const note = h("p", { class: "error", "data-testid": "signin-error" }, message || "");
  const submit = async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) return;
    try {
      team = await api("GET", "/v1/team", { token });
      session.signIn(token);
      input.value = "";
      go(location.hash && location.hash !== "#/signin" ? location.hash : "#/jobs");
      route();
    } catch (err) {
      replace(note, err instanceof ApiError && err.status === 401
        ? "That token is not one this node knows." : errorText(err));
    }
  };
  return h("div", { class: "signin" },
    h("form", { class: "card signin-card", onsubmit: submit },
      h("div", { class: "brand brand-big" }, h("span", { class: "logo" }), "cronlog"),
      h("p", { class: "muted" }, "Sign in with your team's API token. It stays in this tab only and is sent to this node alone."),
      h("label", { for: "token" }, "Token"),
      input,
      h("button", { type: "submit", class: "primary", "data-testid": "signin" }, "Sign in"),
      note,
      h("p", { class: "muted small" }, "Where to find it: the tokens file in the node's data directory, or ask your operator. ",
        h("a", { href: "/docs" }, "API reference"))));
}

const NAV = [
  ["#/jobs", "Jobs"],
  ["#/runs", "Runs"],
  ["#/dead", "Dead letters"],
  ["#/stats", "Figures"],
];

function shell(active) {
  const main = h("main", { id: "main" });
  const signOut = () => { session.signOut(); team = null; go("#/signin"); };
  const bar = h("header", { class: "topbar" },
    h("a", { class: "brand", href: "#/jobs" }, h("span", { class: "logo" }), "cronlog"),
    h("nav", {}, NAV.map(([href, label]) =>
      h("a", { href, class: active === href ? "active" : null, "data-testid": `nav-${label.split(" ")[0].toLowerCase()}` }, label))),
    h("div", { class: "spacer" }),
    h("a", { href: "/docs", class: "quiet" }, "API"),
    h("span", { class: "team", "data-testid": "team" }, team ? `team ${team.tenant}` : ""),
    h("button", { class: "ghost", onclick: signOut, "data-testid": "signout" }, "Sign out"));
  replace(root, bar, main);
  return main;
}

async function route() {
  clearInterval(timer);
  if (current && current.stop) current.stop();
  current = null;
  const hash = location.hash || "#/jobs";
  if (!session.token() || hash === "#/signin") {
    replace(root, signInView());
    return;
  }
  if (!team) {
    try { team = await get("/v1/team"); } catch { /* a 401 lands on the sign-in page */ }
    if (!session.token()) return;
  }
  // "#/jobs?q=report&status=paused": a view's filters ride after the "?", so a link keeps them.
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.slice(2).split("/").map(decodeURIComponent);
  let view;
  let tab = "#/jobs";
  if (parts[0] === "jobs" && parts[1] && parts[2] === "edit") view = editorView(parts[1]);
  else if (parts[0] === "jobs" && parts[1]) view = jobView(parts[1]);
  else if (parts[0] === "new") view = editorView(null);
  else if (parts[0] === "runs") { view = runsView(parts[1]); tab = "#/runs"; }
  else if (parts[0] === "dead") { view = deadView(params); tab = "#/dead"; }
  else if (parts[0] === "stats") { view = statsView(); tab = "#/stats"; }
  else view = jobsView(params);
  const main = shell(tab);
  main.append(view.el);
  current = view;
  await refresh();
  if (view.refresh && view.poll !== false) {
    timer = setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
  }
}

async function refresh() {
  const view = current;
  if (!view || !view.refresh) return;
  try {
    await view.refresh();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return;
    if (view === current) view.failed && view.failed(err);
  }
}

setRouter(route, refresh);

whenUnauthorized(() => {
  session.signOut();
  team = null;
  clearInterval(timer);
  replace(root, signInView("The token was refused: sign in again."));
});

window.addEventListener("hashchange", route);
route();
