// #/jobs: the team's jobs with their schedule, next fire time (the job's own timezone and
// UTC), state, tags and last finished run; search, a tag filter, a status filter, run now, pause
// and resume. The filters are kept in the URL (#/jobs?q=...&tag=...&status=...), so a link to the
// page opens it filtered as it was.

import { get, patch, post } from "./api.js";
import { FINISHED, ago, badge, finishedCell, h, inZone, lastFinished, ms, replace, target, utc, when } from "./dom.js";
import { act, go } from "./ui.js";

const STATUSES = ["", "active", "paused", "finished", "cancelled"];
// GET /v1/jobs without a status leaves cancelled jobs out: the default says so.
const STATUS_LABELS = { "": "not cancelled" };
const PAGE = 50;

const FILTERS = ["q", "tag", "status"];

export function jobsView(params = new URLSearchParams()) {
  const state = { q: "", tag: "", status: "", pages: 1 };
  for (const name of FILTERS) state[name] = (params.get(name) || "").trim();
  if (!STATUSES.includes(state.status)) state.status = "";
  const tiles = h("section", { class: "tiles", "data-testid": "tiles" });
  const body = h("tbody");
  const more = h("div", { class: "more" });
  const search = h("input", {
    type: "search", placeholder: "Find a job by name or id", "data-testid": "search",
    "aria-label": "search", value: state.q,
  });
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.q = search.value.trim(); state.pages = 1; view.refresh(); }, 250);
  });
  const tag = h("input", {
    type: "search", placeholder: "Tag, e.g. team=payments", "data-testid": "tag-filter",
    "aria-label": "tag", spellcheck: "false", value: state.tag,
  });
  let typingTag = null;
  tag.addEventListener("input", () => {
    clearTimeout(typingTag);
    typingTag = setTimeout(() => { state.tag = tag.value.trim(); state.pages = 1; view.refresh(); }, 250);
  });
  // A tag shown on a row filters by it when clicked.
  const byTag = (value) => { tag.value = value; state.tag = value; state.pages = 1; view.refresh(); };
  const status = h("select", { "data-testid": "status-filter", "aria-label": "status" },
    STATUSES.map((s) => h("option", { value: s, selected: s === state.status }, STATUS_LABELS[s] || s)));
  status.addEventListener("change", () => { state.status = status.value; state.pages = 1; view.refresh(); });

  const el = h("div", { class: "page" },
    h("div", { class: "page-head" },
      h("h1", {}, "Jobs"),
      h("div", { class: "spacer" }),
      h("button", { class: "primary", onclick: () => go("#/new"), "data-testid": "new-job" }, "New job")),
    tiles,
    h("div", { class: "toolbar" }, search, tag, status),
    h("div", { class: "card table-card" },
      h("table", { class: "grid", "data-testid": "jobs" },
        h("thead", {}, h("tr", {},
          ["Job", "Schedule", "Next fire", "State", "Last finished", ""].map((t) => h("th", { scope: "col" }, t)))),
        body)),
    more);

  async function loadJobs() {
    const jobs = [];
    let cursor = null;
    for (let i = 0; i < state.pages; i++) {
      const page = await get("/v1/jobs", { q: state.q, tag: state.tag, status: state.status, limit: PAGE, cursor });
      jobs.push(...page.jobs);
      cursor = page.next_cursor;
      if (!cursor) break;
    }
    return { jobs, cursor };
  }

  // The filters in the URL, replacing the entry (no new history step, no new route).
  function keepInUrl() {
    const kept = new URLSearchParams();
    for (const name of FILTERS) if (state[name]) kept.set(name, state[name]);
    const hash = kept.toString() ? `#/jobs?${kept}` : "#/jobs";
    if (location.hash !== hash && (location.hash || "#/jobs").startsWith("#/jobs")) {
      history.replaceState(null, "", hash);
    }
  }

  const view = {
    el,
    async refresh() {
      keepInUrl();
      const [{ jobs, cursor }, stats, team] = await Promise.all([
        loadJobs(), get("/v1/stats", { window_min: 60 }), get("/v1/team"),
      ]);
      renderTiles(tiles, team, stats);
      await findFinished(jobs);
      replace(body, jobs.length ? jobs.map((job) => row(job, byTag)) :
        h("tr", {}, h("td", { colspan: 6, class: "empty" },
          state.q || state.tag || state.status ? "No job matches." : "No jobs yet: create one with New job.")));
      replace(more, cursor ? h("button", { class: "ghost", onclick: () => { state.pages += 1; view.refresh(); } }, "Show more") : "");
    },
    failed(err) { replace(more, h("p", { class: "error" }, String(err.message || err))); },
  };
  return view;
}

// A job's newest run (its last_run) is most of the time the slot materialised ahead, still
// pending: the last finished one is asked for (GET /v1/jobs/<id>/runs, newest first) only when
// the newest run is not finished itself, and asked again only once the newest run changes or a
// run older than it was still going.
const finished = new Map(); // job id -> { newest, settled, run }

async function findFinished(jobs) {
  await Promise.all(jobs.map(async (job) => {
    const newest = job.last_run;
    if (!newest || FINISHED.has(newest.state)) {
      finished.set(job.job_id, { newest: newest && newest.run_id, settled: true, run: newest || null, looked: 1 });
      return;
    }
    const known = finished.get(job.job_id);
    if (known && known.newest === newest.run_id && known.settled) return;
    try {
      const { runs } = await get(`/v1/jobs/${encodeURIComponent(job.job_id)}/runs`, { limit: 5 });
      const run = lastFinished(runs);
      const between = runs.filter((r) => r.run_id !== newest.run_id && (!run || r.scheduled_for > run.scheduled_for));
      finished.set(job.job_id, { newest: newest.run_id, settled: between.every((r) => FINISHED.has(r.state)), run, looked: runs.length });
    } catch {
      finished.delete(job.job_id); // shown as unknown; asked again at the next refresh
    }
  }));
}

function renderTiles(tiles, team, stats) {
  const states = stats.runs_by_state;
  const t = stats.total;
  replace(tiles,
    tile("Jobs", team.jobs, `of ${team.limits.max_jobs.toLocaleString()} allowed`),
    tile("Running now", states.running, `${states.pending + states.retrying} waiting to start`),
    tile("Dead letters", states.dead, states.dead ? "waiting for a replay" : "none", states.dead ? "warn" : null, "#/dead"),
    tile("Delay p50 / p99", t.started ? `${ms(t.delay_p50_ms)} / ${ms(t.delay_p99_ms)}` : "—", `${t.started} scheduled starts, last hour`, null, "#/stats"),
    tile("Last hour", `${t.succeeded} ok`, `${t.failed} failed attempts, ${t.dead} dead`, t.dead ? "warn" : null, "#/stats"));
}

function tile(label, value, note, kind, href) {
  const inner = [h("div", { class: "tile-label" }, label), h("div", { class: "tile-value" }, value), h("div", { class: "tile-note" }, note)];
  return href ? h("a", { class: `tile ${kind || ""}`, href }, inner) : h("div", { class: `tile ${kind || ""}` }, inner);
}

function row(job, byTag) {
  const id = encodeURIComponent(job.job_id);
  const next = job.status === "paused" ? null : job.next_run_at; // a paused job's slot waits
  const newest = job.last_run;
  const known = finished.get(job.job_id);
  const pauseOrResume = job.status === "active"
    ? h("button", { class: "small", "data-testid": "pause", onclick: (e) =>
        act(e.target, () => patch(`/v1/jobs/${id}`, { status: "paused" }), `Paused ${job.name}`) }, "Pause")
    : job.status === "paused"
      ? h("button", { class: "small", "data-testid": "resume", onclick: (e) =>
          act(e.target, () => patch(`/v1/jobs/${id}`, { status: "active" }), `Resumed ${job.name}`) }, "Resume")
      : null;
  const live = job.status !== "cancelled";
  return h("tr", { "data-job": job.job_id },
    h("td", {},
      h("a", { href: `#/jobs/${id}`, class: "job-name" }, job.name),
      h("div", { class: "sub mono" }, job.job_id, " · ", target(job.target)),
      (job.tags || []).length ? h("div", { class: "tags" }, job.tags.map((t) =>
        h("button", { type: "button", class: "tag", "data-testid": "tag", title: `Jobs tagged ${t}`, onclick: () => byTag(t) }, t))) : null),
    h("td", {},
      h("div", { class: "mono nowrap" }, when(job)),
      h("div", { class: "sub" }, job.timezone)),
    h("td", { "data-testid": "next-fire" }, next
      ? [h("div", {}, inZone(next, job.timezone), h("span", { class: "sub" }, ` ${ago(next)}`)), h("div", { class: "sub mono" }, utc(next))]
      : h("span", { class: "sub" }, job.status === "paused" ? "none while paused" : "—")),
    h("td", {}, badge(job.status)),
    h("td", { "data-testid": "last-finished" },
      !newest ? h("span", { class: "sub" }, "no run yet") : !known ? "—"
        : known.run || known.looked < 5 ? finishedCell(known.run) : h("span", { class: "sub" }, "none of its last 5 runs"),
      // a run under way (not the pending one ahead, which Next fire shows) is worth a line
      newest && !FINISHED.has(newest.state) && newest.state !== "pending"
        ? h("div", { class: "sub", "data-testid": "under-way" }, "now ", badge(newest.state)) : null),
    h("td", { class: "actions" },
      live ? h("button", { class: "small", "data-testid": "run-now", onclick: (e) =>
        act(e.target, () => post(`/v1/jobs/${id}/runs`), (run) => `Triggered ${run.run_id}`) }, "Run now") : null,
      pauseOrResume,
      live ? h("button", { class: "small ghost", onclick: () => go(`#/jobs/${id}/edit`) }, "Edit") : null));
}
