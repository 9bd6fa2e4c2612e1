// #/stats: the team's own figures from GET /v1/stats: the scheduling delay of scheduled runs
// (p50 and p99 of first start minus slot) over time, and runs by outcome. Drawn with uPlot
// (vendored, MIT), which draws on a canvas and touches no markup.

import uPlot from "/static/uplot-1.6.32/uPlot.esm.js";
import { get } from "./api.js";
import { h, ms, replace } from "./dom.js";

// The time axis reads UTC, as every other time in the UI does (with its offset), not the
// browser's zone: the ticks through tzDate, the legend through utcAt.
// (Fresh objects for each chart: uPlot keeps the ones it is given.)
const UTC = {
  tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
  x: () => ({ value: (u, ts) => utcAt(ts) }),
  axis: () => ({ label: "UTC" }),
};

function utcAt(ts) {
  return ts === null || ts === undefined ? "—" : `${new Date(ts * 1000).toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

const WINDOWS = [[60, "1 hour"], [360, "6 hours"], [1440, "24 hours"], [10080, "7 days"]];
const OUTCOMES = [
  ["succeeded", "#2da44e"], ["failed", "#d4a72c"], ["dead", "#cf222e"], ["cancelled", "#8c959f"], ["skipped", "#8250df"],
];

export function statsView() {
  let window_min = 60;
  let charts = [];
  const tiles = h("section", { class: "tiles" });
  const delayBox = h("div", { class: "chart", "data-testid": "delay-chart" });
  const outcomeBox = h("div", { class: "chart", "data-testid": "outcome-chart" });
  const states = h("div", { class: "states", "data-testid": "states" });
  const picker = h("div", { class: "tabs" });
  const el = h("div", { class: "page" },
    h("div", { class: "page-head" }, h("h1", {}, "Figures"), h("div", { class: "spacer" }), picker),
    tiles,
    h("div", { class: "card" }, h("h3", {}, "Scheduling delay"), h("p", { class: "muted small" },
      "First start of each scheduled run minus its slot; manual triggers and backfills are left out."), delayBox),
    h("div", { class: "card" }, h("h3", {}, "Runs by outcome"), outcomeBox),
    h("div", { class: "card" }, h("h3", {}, "Runs by state now"), states));

  const observer = new ResizeObserver(() => { for (const c of charts) c.setSize({ width: width(c.root.parentElement), height: 220 }); });
  observer.observe(el);

  function renderPicker() {
    replace(picker, WINDOWS.map(([m, label]) => h("a", {
      href: "#/stats", class: m === window_min ? "active" : null,
      onclick: (e) => { e.preventDefault(); window_min = m; renderPicker(); view.refresh(); },
    }, label)));
  }
  renderPicker();

  const view = {
    el,
    async refresh() {
      const stats = await get("/v1/stats", { window_min });
      const t = stats.total;
      replace(tiles,
        tile("Scheduled starts", t.started.toLocaleString()),
        tile("Delay p50", ms(t.delay_p50_ms)),
        tile("Delay p99", ms(t.delay_p99_ms), t.delay_p99_ms > 1000 ? "warn" : null),
        tile("Worst delay", ms(t.delay_max_ms)),
        tile("Succeeded", t.succeeded.toLocaleString()),
        tile("Failed attempts", t.failed.toLocaleString(), t.failed ? "warn" : null),
        tile("Dead", t.dead.toLocaleString(), t.dead ? "bad" : null));
      const xs = stats.points.map((p) => Date.parse(p.at) / 1000);
      for (const c of charts) c.destroy();
      charts = [delayChart(delayBox, xs, stats.points), outcomeChart(outcomeBox, xs, stats.points)];
      const total = Object.values(stats.runs_by_state).reduce((a, b) => a + b, 0) || 1;
      replace(states, Object.entries(stats.runs_by_state).map(([state, n]) => {
        const fill = h("div", { class: `bar-fill bar-${state}` });
        fill.style.width = `${(100 * n) / total}%`; // CSSOM, which the style policy allows
        return h("div", { class: "state-row", "data-state": state },
          h("span", { class: `badge badge-${state}` }, state),
          h("div", { class: "bar" }, fill),
          h("span", { class: "mono" }, n.toLocaleString()));
      }));
    },
    stop() { observer.disconnect(); for (const c of charts) c.destroy(); },
  };
  return view;
}

function tile(label, value, kind) {
  return h("div", { class: `tile ${kind || ""}` }, h("div", { class: "tile-label" }, label), h("div", { class: "tile-value" }, value));
}

function width(box) {
  return Math.max(320, (box && box.clientWidth) || 800);
}

function delayChart(box, xs, points) {
  replace(box);
  const p50 = points.map((p) => p.delay_p50_ms);
  const p99 = points.map((p) => p.delay_p99_ms);
  return new uPlot({
    width: width(box), height: 220, tzDate: UTC.tzDate,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(10, max * 1.15)] } },
    axes: [UTC.axis(), { label: "ms", values: (u, ticks) => ticks.map((v) => (v >= 1000 ? `${v / 1000}s` : `${v}`)) }],
    series: [
      UTC.x(),
      { label: "p50", stroke: "#1f6feb", width: 2, spanGaps: false, value: (u, v) => ms(v), points: { size: 5 } },
      { label: "p99", stroke: "#cf222e", width: 2, spanGaps: false, value: (u, v) => ms(v), points: { size: 5 } },
    ],
  }, [xs, p50, p99], box);
}

function outcomeChart(box, xs, points) {
  replace(box);
  // Stacked bars: each series is drawn as the running total up to it, tallest first, so every
  // outcome shows as its own band; the legend shows each outcome's own count.
  const raw = OUTCOMES.map(([name]) => points.map((p) => p[name]));
  const stacked = raw.map((_, i) => points.map((_, j) => raw.slice(i).reduce((a, s) => a + s[j], 0)));
  const bars = uPlot.paths.bars({ size: [0.8, 40] });
  return new uPlot({
    width: width(box), height: 220, tzDate: UTC.tzDate,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
    axes: [UTC.axis(), { label: "runs" }],
    series: [
      UTC.x(),
      ...OUTCOMES.map(([name, color], i) => ({
        label: name, fill: color, stroke: color, width: 0, paths: bars, points: { show: false },
        value: (u, v, si, idx) => (idx === null || idx === undefined ? "—" : String(raw[i][idx])),
      })),
    ],
  }, [xs, ...stacked], box);
}
