// #/new and #/jobs/<id>/edit: a job's definition, with the next fire times previewed before
// it is saved. Editing shows the times before and after the change side by side, and the
// slots the change adds (+) and drops (−), from POST /v1/jobs/<id>/preview: nothing is
// written until Save.

import { ApiError, get, patch, post } from "./api.js";
import { h, local, replace, utc } from "./dom.js";
import { errorText, go, toast } from "./ui.js";

const ZONES = typeof Intl.supportedValuesOf === "function" ? Intl.supportedValuesOf("timeZone") : ["UTC"];
const PREVIEW_N = 8;

function field(label, input, hint) {
  const id = `f-${input.getAttribute("name")}`;
  input.setAttribute("id", id);
  return h("div", { class: "field", "data-field": input.getAttribute("name") },
    h("label", { for: id }, label), input, hint ? h("div", { class: "hint" }, hint) : null,
    h("div", { class: "field-error" }));
}

function select(name, options, value) {
  return h("select", { name }, options.map(([v, label]) => h("option", { value: v, selected: v === value }, label)));
}

export function editorView(jobId) {
  const editing = jobId !== null;
  const id = editing ? encodeURIComponent(jobId) : null;
  let job = null;
  const i = {
    name: h("input", { name: "name", type: "text", required: true, autocomplete: "off" }),
    job_id: h("input", { name: "job_id", type: "text", placeholder: "chosen for you when empty", autocomplete: "off", spellcheck: "false" }),
    kind: select("kind", [["cron", "On a cron schedule"], ["every", "Every so many seconds"], ["once", "Once, at an instant"]], "cron"),
    schedule: h("input", { name: "schedule", type: "text", class: "mono", value: "*/5 * * * *", spellcheck: "false" }),
    seconds: h("input", { name: "seconds", type: "text", class: "mono", placeholder: "0", spellcheck: "false" }),
    timezone: h("input", { name: "timezone", type: "text", list: "zones", value: "UTC", spellcheck: "false" }),
    interval_sec: h("input", { name: "interval_sec", type: "number", min: "1", step: "any", value: "60" }),
    run_at: h("input", { name: "run_at", type: "datetime-local", step: "1" }),
    target: h("input", { name: "target", type: "text", class: "mono", placeholder: "https://service/hook, kafka://topic or pull://pool", spellcheck: "false" }),
    payload: h("textarea", { name: "payload", rows: "4", class: "mono", spellcheck: "false", placeholder: "JSON, e.g. {\"report\": \"daily\"}" }),
    retries: h("input", { name: "retries", type: "number", min: "0", max: "99", value: "3" }),
    timeout_sec: h("input", { name: "timeout_sec", type: "number", min: "1", step: "any", value: "60" }),
    priority: h("input", { name: "priority", type: "number", min: "0", max: "9", value: "5" }),
    misfire_policy: select("misfire_policy", [["fire_once", "fire once"], ["skip", "skip"], ["catch_up", "catch up"]], "fire_once"),
    overlap_policy: select("overlap_policy", [["allow", "allow"], ["skip", "skip"], ["buffer_one", "buffer one"], ["cancel_other", "cancel the other"]], "allow"),
    critical: h("input", { name: "critical", type: "checkbox" }),
    tags: h("input", { name: "tags", type: "text", class: "mono", placeholder: "team=payments, env:prod", spellcheck: "false", autocomplete: "off" }),
  };
  const whenFields = {
    cron: [field("Cron expression", i.schedule, "five fields: minute hour day-of-month month day-of-week; a day field starting with * (such as */2) leaves the day free, as in crontab"), field("Seconds", i.seconds, "for a schedule finer than a minute, e.g. */10 or 0,30; empty: at second 0"), field("Timezone", i.timezone, "the schedule is read on this wall clock")],
    every: [field("Every (seconds)", i.interval_sec)],
    once: [field("At (your browser's local time)", i.run_at)],
  };
  const whenBox = h("div", { class: "when" });
  const preview = h("div", { class: "card preview", "data-testid": "preview" });
  const formError = h("p", { class: "error", "data-testid": "form-error" });
  const save = h("button", { type: "submit", class: "primary", "data-testid": "save" }, editing ? "Save changes" : "Create job");
  const form = h("form", { class: "card editor", onsubmit: (e) => { e.preventDefault(); submit(); } },
    field("Name", i.name),
    editing ? null : field("Job id", i.job_id, "letters, digits, _ and -; up to 64"),
    field("Runs", i.kind),
    whenBox,
    field("Target", i.target, "an HTTP(S) URL it POSTs to, a Kafka topic, or a pull pool your workers claim from"),
    field("Payload", i.payload),
    field("Tags", i.tags, "labels to find the job by, separated by commas or spaces; up to 16"),
    h("div", { class: "row" },
      field("Retries", i.retries), field("Timeout (s)", i.timeout_sec), field("Priority (0-9)", i.priority)),
    h("div", { class: "row" },
      field("Late slots", i.misfire_policy), field("When a run is still going", i.overlap_policy)),
    h("label", { class: "check" }, i.critical, " Critical: never run twice automatically"),
    h("div", { class: "form-actions" }, save,
      h("button", { type: "button", class: "ghost", onclick: () => go(editing ? `#/jobs/${id}` : "#/jobs") }, "Discard")),
    formError);
  const zones = h("datalist", { id: "zones" }, ZONES.map((z) => h("option", { value: z })));
  const el = h("div", { class: "page" },
    h("a", { href: editing ? `#/jobs/${id}` : "#/jobs", class: "back" }, editing ? "← Job" : "← Jobs"),
    h("div", { class: "page-head" }, h("h1", {}, editing ? "Edit job" : "New job")),
    h("div", { class: "columns editor-columns" }, form, preview),
    zones);

  const showWhen = () => replace(whenBox, whenFields[i.kind.value]);
  i.kind.addEventListener("change", () => { showWhen(); schedulePreview(); });
  let pending = null;
  const schedulePreview = () => { clearTimeout(pending); pending = setTimeout(renderPreview, 300); };
  form.addEventListener("input", schedulePreview);
  showWhen();

  function clearErrors() {
    for (const box of form.querySelectorAll(".field")) {
      box.classList.remove("invalid");
      replace(box.querySelector(".field-error"));
    }
    replace(formError);
  }

  function showError(err) {
    const name = err.field ? err.field.split(/[.[]/)[0] : null;
    const box = name && form.querySelector(`.field[data-field="${CSS.escape(name === "max_attempts" ? "retries" : name)}"]`);
    if (box) {
      box.classList.add("invalid");
      replace(box.querySelector(".field-error"), err.message);
    } else {
      replace(formError, errorText(err));
    }
  }

  // The definition the form holds, in the API's terms.
  function definition() {
    const body = { name: i.name.value.trim(), target: i.target.value.trim() };
    const kind = i.kind.value;
    body.schedule = kind === "cron" ? i.schedule.value.trim() : null;
    body.seconds = kind === "cron" ? (i.seconds.value.trim() || null) : null;
    body.interval_sec = kind === "every" ? Number(i.interval_sec.value) : null;
    body.run_at = kind === "once" && i.run_at.value ? new Date(i.run_at.value).toISOString() : null;
    body.timezone = kind === "cron" ? (i.timezone.value.trim() || "UTC") : (job ? job.timezone : "UTC");
    const text = i.payload.value.trim();
    if (text) {
      try { body.payload = JSON.parse(text); } catch (e) { throw new ApiError(0, { field: "payload", message: `not JSON: ${e.message}` }); }
    } else {
      body.payload = null;
    }
    for (const n of ["retries", "priority"]) body[n] = Math.trunc(Number(i[n].value));
    body.timeout_sec = Number(i.timeout_sec.value);
    body.misfire_policy = i.misfire_policy.value;
    body.overlap_policy = i.overlap_policy.value;
    body.critical = i.critical.checked;
    body.tags = i.tags.value.split(/[\s,]+/).filter((t) => t);
    return body;
  }

  // What an edit changes: only the fields whose value differs from the job's.
  function changes(body) {
    const out = {};
    const kindOf = (j) => (j.schedule ? "cron" : j.interval_sec ? "every" : j.run_at ? "once" : "deps");
    for (const [k, v] of Object.entries(body)) {
      if (["schedule", "seconds", "interval_sec", "run_at"].includes(k)) continue;
      if (k === "target" && v === targetText(job.target)) continue;
      if (JSON.stringify(v) !== JSON.stringify(job[k])) out[k] = v;
    }
    const kind = i.kind.value;
    if (kind !== kindOf(job) || (kind === "cron" && (body.schedule !== job.schedule || body.seconds !== (job.seconds ?? null)))
        || (kind === "every" && body.interval_sec !== job.interval_sec)
        || (kind === "once" && body.run_at !== job.run_at)) {
      if (kind === "cron") { out.schedule = body.schedule; out.seconds = body.seconds; } // a schedule's seconds travel with it
      if (kind === "every") out.interval_sec = body.interval_sec;
      if (kind === "once") out.run_at = body.run_at;
    }
    return out;
  }

  // The fields an edit changes, as the person sees them: a schedule's seconds travel with it in
  // the request, but are named only when they differ.
  function changedFields(diff) {
    return Object.keys(diff).filter((k) => k !== "seconds" || (diff.seconds ?? null) !== (job.seconds ?? null));
  }

  async function renderPreview() {
    clearErrors();
    let body;
    try { body = definition(); } catch (err) { showError(err); return; }
    try {
      if (editing) {
        const diff = changes(body);
        const out = await post(`/v1/jobs/${id}/preview`, diff, { query: { n: PREVIEW_N } });
        renderChange(out, changedFields(diff));
      } else if (body.schedule) {
        const out = await post("/v1/schedules/preview", { schedule: body.schedule, seconds: body.seconds, timezone: body.timezone, n: PREVIEW_N });
        replace(preview, h("h3", {}, "It would fire at"), firesTable(out.fires, out.timezone, null));
      } else if (body.interval_sec) {
        replace(preview, h("h3", {}, "It would fire"), h("p", {}, `every ${body.interval_sec} s from the moment it is created.`));
      } else if (body.run_at) {
        replace(preview, h("h3", {}, "It would fire once"), h("p", { class: "mono" }, utc(body.run_at)));
      } else {
        replace(preview, h("h3", {}, "Preview"), h("p", { class: "muted" }, "Say when it runs to see its fire times."));
      }
    } catch (err) {
      showError(err);
      replace(preview, h("h3", {}, "Preview"), h("p", { class: "error" }, errorText(err)));
    }
  }

  function renderChange(out, changed) {
    const added = new Set(out.added.map((f) => f.at));
    const dropped = new Set(out.dropped.map((f) => f.at));
    replace(preview,
      h("h3", {}, "Next fire times"),
      h("p", { class: "muted", "data-testid": "changing" }, changed.length ? `Changing ${changed.join(", ")}.` : "No change yet."),
      h("div", { class: "diff" },
        h("div", {}, h("h4", {}, "Now"), firesTable(out.before.fires, out.before.timezone, dropped, "dropped", out.compared_until)),
        h("div", {}, h("h4", {}, "After saving"), firesTable(out.after.fires, out.after.timezone, added, "added", out.compared_until))),
      h("p", { class: "summary", "data-testid": "diff-summary" },
        out.added.length || out.dropped.length
          ? `${out.added.length} slot${out.added.length === 1 ? "" : "s"} added, ${out.dropped.length} dropped`
          : "No slot added or dropped",
        out.compared_until ? ` (compared up to ${utc(out.compared_until)})` : ""));
  }

  async function submit() {
    clearErrors();
    let body;
    try { body = definition(); } catch (err) { showError(err); return; }
    save.disabled = true;
    try {
      if (editing) {
        const diff = changes(body);
        if (!Object.keys(diff).length) { go(`#/jobs/${id}`); return; }
        await patch(`/v1/jobs/${id}`, diff, { headers: { "If-Match": String(job.version) } });
        toast("Saved");
        go(`#/jobs/${id}`);
      } else {
        const given = i.job_id.value.trim();
        if (given) body.job_id = given;
        for (const k of ["schedule", "interval_sec", "run_at"]) if (body[k] === null) delete body[k];
        const made = await post("/v1/jobs", body);
        toast(`Created ${made.name}`);
        go(`#/jobs/${encodeURIComponent(made.job_id)}`);
      }
    } catch (err) {
      if (err.status === 409) replace(formError, "The job changed since this page read it: open it again to see the new version.");
      else showError(err);
    } finally {
      save.disabled = false;
    }
  }

  function fill(j) {
    i.name.value = j.name;
    i.kind.value = j.schedule ? "cron" : j.interval_sec ? "every" : "once";
    if (j.schedule) i.schedule.value = j.schedule;
    i.seconds.value = j.seconds || "";
    i.timezone.value = j.timezone;
    if (j.interval_sec) i.interval_sec.value = String(j.interval_sec);
    if (j.run_at) i.run_at.value = new Date(new Date(j.run_at).getTime() - new Date(j.run_at).getTimezoneOffset() * 60000).toISOString().slice(0, 19);
    i.target.value = targetText(j.target);
    i.payload.value = j.payload === null ? "" : JSON.stringify(j.payload, null, 2);
    i.retries.value = String(j.retries);
    i.timeout_sec.value = String(j.timeout_sec);
    i.priority.value = String(j.priority);
    i.misfire_policy.value = j.misfire_policy;
    i.overlap_policy.value = j.overlap_policy;
    i.critical.checked = j.critical;
    i.tags.value = (j.tags || []).join(", ");
    showWhen();
  }

  return {
    el,
    poll: false, // a form being filled in is not refreshed under the person's hands
    async refresh() {
      if (editing && !job) {
        job = await get(`/v1/jobs/${id}`);
        fill(job);
      }
      await renderPreview();
    },
    failed(err) { replace(formError, errorText(err)); },
  };
}

function targetText(t) {
  if (t.type === "http" && !Object.keys(t.headers || {}).length && !t.max_calls_per_sec && !t.status_url) return t.url;
  if (t.type === "kafka") return `kafka://${t.topic}`;
  if (t.type === "pull") return `pull://${t.pool}`;
  return t.url;
}

function firesTable(fires, timezone, marked, how, until) {
  if (!fires.length) return h("p", { class: "muted" }, "Never fires.");
  const onUtc = timezone === "UTC" || timezone === "Etc/UTC"; // one column says it all
  return h("table", { class: "plain fires", "data-testid": how ? `fires-${how === "added" ? "after" : "before"}` : "fires" },
    h("thead", {}, h("tr", {}, h("th", {}, ""), onUtc ? null : h("th", {}, `Local (${timezone})`), h("th", {}, "UTC"))),
    h("tbody", {}, fires.map((f) => {
      const hit = marked && marked.has(f.at);
      const beyond = until && f.at > until; // past where the two lists can be compared
      return h("tr", { class: hit ? how : beyond ? "beyond" : null, "data-at": f.at, title: beyond ? "past the other list's last time: not compared" : null },
        h("td", { class: "mark" }, hit ? (how === "added" ? "+" : "−") : ""),
        onUtc ? null : h("td", {}, local(f.local)),
        h("td", { class: "mono" }, utc(f.at)));
    })));
}

