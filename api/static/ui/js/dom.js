// Building the page without markup strings: every element is made with createElement and
// every value goes in as text (textContent) or as an attribute through setAttribute, so a job
// named "<img onerror=...>" is shown as those characters and never parsed as HTML. There is no
// innerHTML anywhere in the UI; the Content-Security-Policy forbids inline script besides.

const SAFE_URL = /^(#|\/(?!\/))/; // links stay inside this UI or this origin

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (name === "class") {
      el.className = value;
    } else if (name === "href" || name === "src") {
      if (!SAFE_URL.test(String(value))) throw new Error(`refusing the URL ${value}`);
      el.setAttribute(name, value);
    } else if (name === "value") {
      el.value = value;
    } else if (name === "checked" || name === "disabled" || name === "selected") {
      el[name] = Boolean(value);
    } else if (/^(data-[a-z-]+|aria-[a-z]+|role|title|type|name|id|for|placeholder|min|max|step|list|rows|autocomplete|colspan|scope|inputmode|spellcheck|required|lang|tabindex)$/.test(name)) {
      el.setAttribute(name, value === true ? "" : String(value));
    } else {
      throw new Error(`attribute ${name} is not one the UI sets`);
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// -- formats -------------------------------------------------------------------------------------
// Times always carry their seconds, ":00" included, so a column of them lines up.

export function utc(iso) {
  // "2026-11-29T10:00:00.000Z" -> "2026-11-29 10:00:00Z"
  return iso ? iso.replace("T", " ").replace(/\.\d{3}Z$/, "Z") : "—";
}

export function local(isoWithOffset) {
  // "2026-11-29T10:00:00+01:00" -> "2026-11-29 10:00:00 +01:00"
  if (!isoWithOffset) return "—";
  const m = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})(:\d{2})?(?:\.\d+)?(.*)$/.exec(isoWithOffset);
  return m ? `${m[1]} ${m[2]}${m[3] || ":00"} ${m[4] || ""}`.trim() : isoWithOffset;
}

// An instant as the wall clock of ``timeZone`` reads it, with the offset: "2026-11-29 10:00:00 GMT+1".
export function inZone(iso, timeZone) {
  if (!iso) return "—";
  try {
    const parts = new Intl.DateTimeFormat("en-GB", {
      timeZone, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit",
      minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "shortOffset",
    }).formatToParts(new Date(iso));
    const p = Object.fromEntries(parts.map((x) => [x.type, x.value]));
    return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second} ${p.timeZoneName}`;
  } catch {
    return utc(iso);
  }
}

export function ago(iso, now = Date.now()) {
  if (!iso) return "";
  const s = Math.round((new Date(iso).getTime() - now) / 1000);
  const a = Math.abs(s);
  const text = a < 60 ? `${a}s` : a < 3600 ? `${Math.round(a / 60)}m` : a < 86400
    ? `${Math.round(a / 3600)}h` : `${Math.round(a / 86400)}d`;
  return s >= 0 ? `in ${text}` : `${text} ago`;
}

export function ms(value) {
  if (value === null || value === undefined) return "—";
  if (value < 1000) return `${Math.round(value)} ms`;
  if (value < 60000) return `${(value / 1000).toFixed(value < 10000 ? 2 : 1)} s`;
  return `${(value / 60000).toFixed(1)} min`;
}

export function when(job) {
  // A per-second schedule fires at its seconds of each minute the expression names.
  if (job.schedule && job.seconds) return `${job.schedule} at seconds ${job.seconds}`;
  if (job.schedule) return job.schedule;
  if (job.interval_sec) return `every ${seconds(job.interval_sec)}`;
  if (job.run_at) return `once at ${utc(job.run_at)}`;
  if (job.depends_on && job.depends_on.length) return `after ${job.depends_on.join(", ")}`;
  return "—";
}

// The names of jobs by id, for the pages that list runs (a run carries its job's id only).
// Each id is asked once (GET /v1/jobs/<id>) and kept for the tab's life; an id that cannot be
// read (a forgotten job) is shown as the id.
const jobNames = new Map();

export async function namesOf(getJob, jobIds) {
  const missing = [...new Set(jobIds)].filter((id) => !jobNames.has(id));
  await Promise.all(missing.map(async (id) => {
    try {
      jobNames.set(id, (await getJob(id)).name);
    } catch {
      jobNames.set(id, null);
    }
  }));
  return (id) => jobNames.get(id) || null;
}

// A job's name linked to its page, its id beneath: how a run list names the run's job.
export function jobCell(run, nameOf) {
  const name = nameOf(run.job_id);
  return [
    h("a", { href: `#/jobs/${encodeURIComponent(run.job_id)}`, class: "job-name", "data-testid": "job-name" }, name || run.job_id),
    h("div", { class: "sub mono" }, run.run_id),
  ];
}

// A run is finished once nothing more happens to it; "failed" waits for its next attempt.
export const FINISHED = new Set(["succeeded", "dead", "cancelled"]);

// The newest finished run among ``runs`` (newest first), or null.
export function lastFinished(runs) {
  return runs.find((r) => FINISHED.has(r.state)) || null;
}

// A finished run in a cell: its state, when it finished and how late it started.
export function finishedCell(run) {
  if (!run) return h("span", { class: "sub" }, "none finished yet");
  return [badge(run.state), h("div", { class: "sub" }, ago(run.finished_at || run.started_at || run.scheduled_for),
    run.lateness_ms !== null && run.lateness_ms !== undefined ? ` · ${ms(run.lateness_ms)} late` : "")];
}

export function seconds(s) {
  if (s % 86400 === 0) return `${s / 86400}d`;
  if (s % 3600 === 0) return `${s / 3600}h`;
  if (s % 60 === 0) return `${s / 60}m`;
  return `${s}s`;
}

export function target(t) {
  if (!t) return "—";
  if (t.type === "http") return t.url;
  if (t.type === "kafka") return `kafka://${t.topic}`;
  if (t.type === "pull") return `pull://${t.pool}`;
  return JSON.stringify(t);
}

export function badge(state) {
  return h("span", { class: `badge badge-${state}`, "data-state": state }, state.replace("_", " "));
}
