// #/runs/<state>: the team's runs in one state (running by default), with cancel for live ones.

import { get, post } from "./api.js";
import { ago, badge, h, ms, replace, utc } from "./dom.js";
import { act } from "./ui.js";

const STATES = ["running", "pending", "retrying", "blocked", "failed", "succeeded", "cancelled", "dead"];
const LIVE = new Set(["blocked", "pending", "running", "failed", "retrying"]);

export function runsView(state) {
  const current = STATES.includes(state) ? state : "running";
  const body = h("tbody");
  const tabs = h("div", { class: "tabs" }, STATES.map((s) =>
    h("a", { href: `#/runs/${s}`, class: s === current ? "active" : null, "data-testid": `runs-${s}` }, s)));
  const el = h("div", { class: "page" },
    h("div", { class: "page-head" }, h("h1", {}, "Runs")),
    tabs,
    h("div", { class: "card table-card" },
      h("table", { class: "grid", "data-testid": "state-runs" },
        h("thead", {}, h("tr", {}, ["Run", "Slot", "State", "Attempt", "Started", "Lateness", "Worker", ""].map((t) => h("th", { scope: "col" }, t)))),
        body)));
  return {
    el,
    async refresh() {
      const page = await get("/v1/runs", { state: current, limit: 100 });
      replace(body, page.runs.length ? page.runs.map(row) : h("tr", {}, h("td", { colspan: 8, class: "empty" }, `No ${current} runs.`)));
    },
  };
}

function row(run) {
  const rid = encodeURIComponent(run.run_id);
  const last = run.attempts[run.attempts.length - 1];
  return h("tr", { "data-run": run.run_id },
    h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(run.job_id)}` }, run.job_id), h("div", { class: "sub mono" }, run.run_id)),
    h("td", { class: "mono" }, utc(run.scheduled_for)),
    h("td", {}, badge(run.state)),
    h("td", {}, String(run.attempt)),
    h("td", {}, run.started_at ? ago(run.started_at) : "—"),
    h("td", {}, ms(run.lateness_ms)),
    h("td", { class: "mono" }, last ? last.worker_id : "—"),
    h("td", { class: "actions" }, LIVE.has(run.state)
      ? h("button", { class: "small danger", "data-testid": "cancel-run", onclick: (e) =>
          act(e.target, () => post(`/v1/runs/${rid}/cancel`), `Cancelled ${run.run_id}`) }, "Cancel")
      : null));
}

