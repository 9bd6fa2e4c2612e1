// #/jobs/<id>: one job, its next fire times, and its runs newest first, each with its
// lateness and every attempt (outcome, error, fencing token, worker); cancel a live run,
// replay a dead one.

import { api, get, patch, post } from "./api.js";
import { ago, badge, finishedCell, h, inZone, lastFinished, local, ms, replace, seconds, target, utc, when } from "./dom.js";
import { act, go } from "./ui.js";

const LIVE = new Set(["blocked", "pending", "running", "failed", "retrying"]);
const PAGE = 25;

export function jobView(jobId) {
  const id = encodeURIComponent(jobId);
  const open = new Set(); // runs whose attempts are shown
  let pages = 1;
  const head = h("div", { class: "page-head" });
  const facts = h("div", { class: "card facts", "data-testid": "facts" });
  const fires = h("div", { class: "card" });
  const runs = h("tbody");
  const more = h("div", { class: "more" });
  const el = h("div", { class: "page" },
    h("a", { href: "#/jobs", class: "back" }, "← Jobs"),
    head,
    h("div", { class: "columns" }, facts, fires),
    h("h2", {}, "Runs"),
    h("div", { class: "card table-card" },
      h("table", { class: "grid", "data-testid": "runs" },
        h("thead", {}, h("tr", {}, ["Slot", "Trigger", "State", "Started", "Lateness", "Attempts", "Error", ""]
          .map((t) => h("th", { scope: "col" }, t)))),
        runs)),
    more);

  async function loadRuns() {
    const all = [];
    let cursor = null;
    for (let i = 0; i < pages; i++) {
      const page = await get(`/v1/jobs/${id}/runs`, { limit: PAGE, cursor });
      all.push(...page.runs);
      cursor = page.next_cursor;
      if (!cursor) break;
    }
    return { all, cursor };
  }

  const view = {
    el,
    async refresh() {
      const [job, preview, { all, cursor }] = await Promise.all([
        get(`/v1/jobs/${id}`), get(`/v1/jobs/${id}/preview`, { n: 5 }), loadRuns(),
      ]);
      renderHead(head, job);
      renderFacts(facts, job, lastFinished(all));
      replace(fires, h("h3", {}, "Next fire times"),
        preview.fires.length
          ? h("table", { class: "plain", "data-testid": "fires" },
              h("thead", {}, h("tr", {}, h("th", {}, `Local (${preview.timezone})`), h("th", {}, "UTC"), h("th", {}, ""))),
              h("tbody", {}, preview.fires.map((f) => h("tr", {},
                h("td", {}, local(f.local)), h("td", { class: "mono" }, utc(f.at)), h("td", { class: "sub" }, ago(f.at))))))
          : h("p", { class: "muted" }, job.status === "paused" ? "Paused: nothing fires until it is resumed." : "No fire time ahead."),
        job.status === "paused" ? h("p", { class: "note" }, "Paused: these are the times it would fire once resumed.") : null);
      replace(runs, all.length ? all.flatMap((run) => runRows(run, open)) :
        h("tr", {}, h("td", { colspan: 8, class: "empty" }, "No runs yet.")));
      replace(more, cursor ? h("button", { class: "ghost", onclick: () => { pages += 1; view.refresh(); } }, "Older runs") : "");
    },
    failed(err) {
      if (err.status === 404) replace(el, h("p", { class: "error" }, `No job ${jobId} in this team.`), h("a", { href: "#/jobs" }, "← Jobs"));
    },
  };

  function renderHead(head, job) {
    const actions = [];
    if (job.status !== "cancelled") {
      actions.push(h("button", { class: "primary", "data-testid": "run-now", onclick: (e) =>
        act(e.target, () => post(`/v1/jobs/${id}/runs`), (run) => `Triggered ${run.run_id}`) }, "Run now"));
    }
    if (job.status === "active") {
      actions.push(h("button", { "data-testid": "pause", onclick: (e) =>
        act(e.target, () => patch(`/v1/jobs/${id}`, { status: "paused" }), "Paused") }, "Pause"));
    } else if (job.status === "paused") {
      actions.push(h("button", { "data-testid": "resume", onclick: (e) =>
        act(e.target, () => patch(`/v1/jobs/${id}`, { status: "active" }), "Resumed") }, "Resume"));
    }
    if (job.status !== "cancelled") {
      actions.push(h("button", { class: "ghost", "data-testid": "edit", onclick: () => go(`#/jobs/${id}/edit`) }, "Edit"));
      actions.push(h("button", { class: "ghost danger", "data-testid": "cancel-job", onclick: async (e) => {
        if (!confirm(`Cancel job ${job.name}? Its live runs are cancelled too; its history stays.`)) return;
        await act(e.target, () => api("DELETE", `/v1/jobs/${id}`, { headers: { "If-Match": String(job.version) } }), "Job cancelled");
      } }, "Cancel job"));
    }
    replace(head,
      h("div", {},
        h("h1", {}, job.name, " ", badge(job.status)),
        h("div", { class: "sub mono" }, job.job_id, ` · version ${job.version}`)),
      h("div", { class: "spacer" }),
      actions);
  }

  return view;
}

function fact(label, value) {
  return [h("dt", {}, label), h("dd", {}, value)];
}

function renderFacts(facts, job, finished) {
  const next = job.status === "paused" ? null : job.next_run_at;
  replace(facts, h("h3", {}, "Definition"),
    h("dl", { class: "facts-list" },
      fact("When", h("span", { class: "mono" }, when(job))),
      fact("Timezone", job.timezone),
      fact("Next fire", next ? `${inZone(next, job.timezone)} · ${utc(next)} (${ago(next)})` : job.status === "paused" ? "none while paused" : "—"),
      fact("Last finished", h("div", { "data-testid": "last-finished" }, finishedCell(finished),
        finished ? h("span", { class: "sub mono" }, ` slot ${utc(finished.scheduled_for)}`) : null)),
      fact("Target", h("span", { class: "mono" }, target(job.target))),
      fact("Retries", `${job.retries} (backoff ${seconds(job.backoff.base_sec)} × ${job.backoff.factor}, at most ${seconds(job.backoff.cap_sec)})`),
      fact("Timeout", seconds(job.timeout_sec)),
      fact("Misfire", `${job.misfire_policy.replace("_", " ")} after ${seconds(job.misfire_grace_sec)}`),
      fact("Overlap", job.overlap_policy.replace("_", " ")),
      fact("Priority", String(job.priority)),
      job.critical ? fact("Critical", "never run twice automatically") : null,
      (job.tags || []).length ? fact("Tags", job.tags.join(", ")) : null,
      job.payload !== null ? fact("Payload", h("code", { class: "payload" }, JSON.stringify(job.payload))) : null));
}

function runRows(run, open) {
  const rid = encodeURIComponent(run.run_id);
  const expanded = open.has(run.run_id);
  const toggle = h("button", { class: "link", "aria-expanded": String(expanded), "data-testid": "attempts-toggle",
    onclick: () => {
      if (open.has(run.run_id)) open.delete(run.run_id); else open.add(run.run_id);
      const row = toggle.closest("tr");
      const next = row.nextElementSibling;
      if (next && next.classList.contains("attempts-row")) next.remove();
      else row.after(attemptsRow(run));
      toggle.setAttribute("aria-expanded", String(open.has(run.run_id)));
    } }, `${run.attempts.length} ▸`);
  const actions = [];
  if (LIVE.has(run.state)) {
    actions.push(h("button", { class: "small danger", "data-testid": "cancel-run", onclick: (e) =>
      act(e.target, () => post(`/v1/runs/${rid}/cancel`), `Cancelled ${run.run_id}`) }, "Cancel"));
  }
  if (run.state === "dead") {
    actions.push(h("button", { class: "small", "data-testid": "replay", onclick: (e) =>
      act(e.target, () => post(`/v1/runs/${rid}/replay`), `Replayed ${run.run_id}`) }, "Replay"));
  }
  const rows = [h("tr", { "data-run": run.run_id, class: `run run-${run.state}` },
    h("td", { class: "mono" }, utc(run.scheduled_for)),
    h("td", {}, run.trigger),
    h("td", {}, badge(run.state), run.dead_reason ? h("div", { class: "sub" }, run.dead_reason.replace("_", " ")) : null),
    h("td", {}, run.started_at ? ago(run.started_at) : "—"),
    h("td", { "data-testid": "lateness" }, ms(run.lateness_ms)),
    h("td", {}, toggle),
    h("td", { class: "error-cell" }, run.error || ""),
    h("td", { class: "actions" }, actions))];
  if (expanded) rows.push(attemptsRow(run));
  return rows;
}

function attemptsRow(run) {
  return h("tr", { class: "attempts-row" }, h("td", { colspan: 8 },
    run.attempts.length
      ? h("table", { class: "plain attempts", "data-testid": "attempts" },
          h("thead", {}, h("tr", {}, ["#", "Outcome", "Worker", "Fencing token", "Started", "Finished", "Error"].map((t) => h("th", {}, t)))),
          h("tbody", {}, run.attempts.map((a) => h("tr", {},
            h("td", {}, String(a.attempt)),
            h("td", {}, a.outcome ? badge(a.outcome) : badge("running")),
            h("td", { class: "mono" }, a.worker_id),
            h("td", { class: "mono", "data-testid": "fencing-token" }, String(a.fencing_token)),
            h("td", { class: "mono" }, utc(a.started_at)),
            h("td", { class: "mono" }, utc(a.finished_at)),
            h("td", { class: "error-cell" }, a.error)))))
      : h("p", { class: "muted" }, "No attempt has started yet."),
    (run.asks || []).length ? asksTable(run.asks) : null));
}

// A critical run whose attempt's outcome was unknown: its target asked what became of it.
function asksTable(asks) {
  return h("table", { class: "plain attempts", "data-testid": "asks" },
    h("thead", {}, h("tr", {}, ["Ask", "Answer", "Fencing token", "Asked", "Answered", "Detail"].map((t) => h("th", {}, t)))),
    h("tbody", {}, asks.map((a) => h("tr", {},
      h("td", {}, String(a.ask)),
      h("td", {}, a.answer ? badge(a.answer) : badge("asking")),
      h("td", { class: "mono" }, String(a.fencing_token)),
      h("td", { class: "mono" }, utc(a.ask_at)),
      h("td", { class: "mono" }, utc(a.answered_at)),
      h("td", { class: "error-cell" }, a.status ? `HTTP ${a.status}` : a.detail)))));
}

