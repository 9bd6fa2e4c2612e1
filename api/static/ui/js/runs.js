// #/runs/<state>: the team's runs in one state, with cancel for live ones. Without a state it
// opens on the first of OPENING that has runs now (running is empty most of the time), and each
// tab says how many runs are in its state.

import { get, post } from "./api.js";
import { ago, badge, h, jobCell, ms, namesOf, replace, utc } from "./dom.js";
import { act } from "./ui.js";

const STATES = ["running", "pending", "retrying", "blocked", "failed", "succeeded", "cancelled", "dead"];
const LIVE = new Set(["blocked", "pending", "running", "failed", "retrying"]);
const OPENING = ["running", "retrying", "failed", "dead", "succeeded", "pending"];

export function runsView(state) {
  let current = STATES.includes(state) ? state : null;
  const body = h("tbody");
  const tabs = h("div", { class: "tabs" });
  const showTabs = (counts) => replace(tabs, STATES.map((s) =>
    h("a", { href: `#/runs/${s}`, class: s === current ? "active" : null, "data-testid": `runs-${s}` },
      s, counts && counts[s] !== undefined ? h("span", { class: "count" }, ` ${counts[s]}`) : null)));
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
      const counts = (await get("/v1/stats", { window_min: 1 })).runs_by_state;
      if (current === null) current = OPENING.find((s) => counts[s] > 0) || "running";
      showTabs(counts);
      const page = await get("/v1/runs", { state: current, limit: 100 });
      const nameOf = await namesOf((id) => get(`/v1/jobs/${encodeURIComponent(id)}`), page.runs.map((r) => r.job_id));
      replace(body, page.runs.length ? page.runs.map((r) => row(r, nameOf)) : h("tr", {}, h("td", { colspan: 8, class: "empty" }, `No ${current} runs.`)));
    },
  };
}

function row(run, nameOf) {
  const rid = encodeURIComponent(run.run_id);
  const last = run.attempts[run.attempts.length - 1];
  return h("tr", { "data-run": run.run_id },
    h("td", {}, jobCell(run, nameOf)),
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

