// #/dead: the dead-letter list, replay of one run, and replay of every run a filter names
// (counted first with a dry run, then replayed on confirmation). The filter is kept in the URL
// (#/dead?job_id=...&reason=...&scheduled_after=...&scheduled_before=...), so a link opens it
// filled in; a replayed run leaves the list with a note that says where it went.

import { get, post } from "./api.js";
import { ago, badge, h, jobCell, namesOf, replace, utc } from "./dom.js";
import { act, errorText } from "./ui.js";

const PAGE = 50;
const REASONS = [["", "any reason"], ["attempts_exhausted", "attempts exhausted"], ["permanent_failure", "permanent failure"], ["outcome_unknown", "outcome unknown"]];

// The filter's inputs by their URL parameter; the datetime-local ones hold the browser's wall
// clock, the URL an instant (ISO 8601, UTC).
const INSTANTS = ["scheduled_after", "scheduled_before"];

function wallClock(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
}

export function deadView(params = new URLSearchParams()) {
  let pages = 1;
  const body = h("tbody");
  const more = h("div", { class: "more" });
  const f = {
    job_id: h("input", { name: "job_id", type: "text", placeholder: "any job", "data-testid": "filter-job", spellcheck: "false" }),
    reason: h("select", { name: "reason", "data-testid": "filter-reason" }, REASONS.map(([v, l]) => h("option", { value: v }, l))),
    after: h("input", { name: "scheduled_after", type: "datetime-local" }),
    before: h("input", { name: "scheduled_before", type: "datetime-local" }),
  };
  const byParam = { job_id: f.job_id, reason: f.reason, scheduled_after: f.after, scheduled_before: f.before };
  for (const [name, input] of Object.entries(byParam)) {
    const given = (params.get(name) || "").trim();
    if (!given) continue;
    input.value = INSTANTS.includes(name) ? wallClock(given) : given;
  }
  if (![...f.reason.options].some((o) => o.value === f.reason.value)) f.reason.value = "";
  const outcome = h("p", { class: "muted", "data-testid": "filter-outcome" });
  const note = h("div", { "data-testid": "replay-note" });
  // The filter in the URL, replacing the entry (no new history step, no new route).
  const keepInUrl = () => {
    const kept = new URLSearchParams();
    const chosen = filter();
    for (const name of Object.keys(byParam)) if (chosen[name]) kept.set(name, chosen[name]);
    const hash = kept.toString() ? `#/dead?${kept}` : "#/dead";
    if (location.hash !== hash && location.hash.startsWith("#/dead")) history.replaceState(null, "", hash);
  };
  const filter = () => {
    const out = { limit: 1000 };
    if (f.job_id.value.trim()) out.job_id = f.job_id.value.trim();
    if (f.reason.value) out.reason = f.reason.value;
    if (f.after.value) out.scheduled_after = new Date(f.after.value).toISOString();
    if (f.before.value) out.scheduled_before = new Date(f.before.value).toISOString();
    return out;
  };
  const count = async (e) => {
    try {
      const out = await post("/v1/runs/replay", { ...filter(), dry_run: true });
      replace(outcome, `${out.matched} dead run${out.matched === 1 ? "" : "s"} match${out.next_cursor ? " (more beyond the first 1,000 looked at)" : ""}.`);
      return out;
    } catch (err) {
      replace(outcome, h("span", { class: "error" }, errorText(err)));
      return null;
    }
  };
  const replayAll = async (e) => {
    const dry = await count(e);
    if (!dry || !dry.matched) return;
    if (!confirm(`Replay ${dry.matched} dead run${dry.matched === 1 ? "" : "s"}? Each gets a fresh budget of attempts.`)) return;
    await act(e.target, () => post("/v1/runs/replay", filter()), (out) => {
      replace(outcome, `Replayed ${out.replayed.length}` + (out.refused.length ? `; ${out.refused.length} were no longer dead` : "") + ".");
      return `Replayed ${out.replayed.length} run${out.replayed.length === 1 ? "" : "s"}`;
    });
  };
  for (const input of Object.values(f)) {
    input.addEventListener("input", keepInUrl);
    input.addEventListener("change", keepInUrl);
  }
  // A replayed run is pending again, so it leaves this list: say so, and where to follow it.
  const replayed = (run, out, nameOf) => replace(note, h("p", { class: "note", role: "status" },
    `Replayed ${nameOf(run.job_id) || run.job_id}'s run of ${utc(run.scheduled_for)}: it is ${(out && out.state) || "pending"} again and has left this list. `,
    h("a", { href: `#/jobs/${encodeURIComponent(run.job_id)}` }, "Follow it on its job's page")));
  const el = h("div", { class: "page" },
    h("div", { class: "page-head" }, h("h1", {}, "Dead letters")),
    h("p", { class: "muted" }, "Runs that failed for good: their attempts ran out, the target said retrying cannot help, or a critical run's outcome is unknown. A replay requeues a run with a fresh budget of attempts."),
    h("div", { class: "card filter" },
      h("h3", {}, "Replay by filter"),
      h("div", { class: "row" },
        h("label", {}, "Job", f.job_id), h("label", {}, "Reason", f.reason),
        h("label", {}, "Slot from", f.after), h("label", {}, "Slot before", f.before)),
      h("div", { class: "form-actions" },
        h("button", { class: "ghost", "data-testid": "filter-count", onclick: count }, "Count"),
        h("button", { class: "primary", "data-testid": "filter-replay", onclick: replayAll }, "Replay matching")),
      outcome),
    note,
    h("div", { class: "card table-card" },
      h("table", { class: "grid", "data-testid": "dead" },
        h("thead", {}, h("tr", {}, ["Run", "Slot", "Reason", "Attempts", "Error", "Died", ""].map((t) => h("th", { scope: "col" }, t)))),
        body)),
    more);

  return {
    el,
    async refresh() {
      keepInUrl();
      const runs = [];
      let cursor = null;
      for (let i = 0; i < pages; i++) {
        const page = await get("/v1/runs", { state: "dead", limit: PAGE, cursor });
        runs.push(...page.runs);
        cursor = page.next_cursor;
        if (!cursor) break;
      }
      const nameOf = await namesOf((id) => get(`/v1/jobs/${encodeURIComponent(id)}`), runs.map((r) => r.job_id));
      replace(body, runs.length ? runs.map((r) => row(r, nameOf, replayed)) : h("tr", {}, h("td", { colspan: 7, class: "empty" }, "No dead letters. ")));
      replace(more, cursor ? h("button", { class: "ghost", onclick: () => { pages += 1; this.refresh(); } }, "Show more") : "");
    },
  };
}

function row(run, nameOf, replayed) {
  const rid = encodeURIComponent(run.run_id);
  return h("tr", { "data-run": run.run_id },
    h("td", {}, jobCell(run, nameOf)),
    h("td", { class: "mono" }, utc(run.scheduled_for)),
    h("td", {}, badge(run.dead_reason || "dead")),
    h("td", {}, String(run.attempts.length)),
    h("td", { class: "error-cell" }, run.error),
    h("td", {}, ago(run.finished_at)),
    h("td", { class: "actions" }, h("button", { class: "small", "data-testid": "replay", onclick: (e) =>
      act(e.target, () => post(`/v1/runs/${rid}/replay`), (out) => { replayed(run, out, nameOf); return `Replayed ${run.run_id}`; }) },
      "Replay")));
}

