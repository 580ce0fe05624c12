// The tickwheel console: reads the service's own API (same origin, nothing from
// elsewhere) every few seconds. Every value is written as text, never as markup.
"use strict";

const REFRESH_MS = 5000;
const PAGE = 50;
let cursors = [null]; // the cursor of each page shown so far: back to the first, on
let nextCursor = null;

function $(id) { return document.getElementById(id); }

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (className) td.className = className;
  return td;
}

function formatTime(ms, zone) {
  if (ms === null || ms === undefined) return "–";
  const tz = zone || "UTC";
  try {
    const parts = new Intl.DateTimeFormat("en-CA", {
      timeZone: tz, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit",
      minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short",
    }).formatToParts(new Date(ms));
    const get = (type) => (parts.find((p) => p.type === type) || {}).value || "";
    return `${get("year")}-${get("month")}-${get("day")} ${get("hour")}:${get("minute")}:` +
      `${get("second")} ${tz === "UTC" ? "UTC" : get("timeZoneName")}`;
  } catch (e) {
    return `${ms} ms`;
  }
}

async function api(method, path) {
  const response = await fetch(path, { method, headers: { Accept: "application/json" },
                                       credentials: "same-origin" });
  if (response.status === 401) { window.location.reload(); throw new Error("401"); }
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok && response.status !== 404) {
    throw new Error(`${method} ${path}: ${response.status} ${body && body.error ? body.error : ""}`);
  }
  return { status: response.status, body };
}

function pathPart(text) { return encodeURIComponent(text); }

async function act(scheduleId, action) {
  const path = `/v1/schedules/${pathPart(scheduleId)}` + (action === "delete" ? "" : `/${action}`);
  const note = $("action-note");
  try {
    const { body } = await api(action === "delete" ? "DELETE" : "POST", path);
    note.textContent = `${action} ${scheduleId}: taken at ${formatTime(body.ts_ms)}; ` +
      "shown once the engine has applied it";
  } catch (e) {
    note.textContent = String(e.message || e);
  }
}

function button(label, scheduleId, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = action;
  b.addEventListener("click", () => act(scheduleId, action));
  return b;
}

async function loadSchedules() {
  const params = new URLSearchParams({ limit: String(PAGE) });
  const prefix = $("prefix").value;
  const state = $("state").value;
  if (prefix) params.set("prefix", prefix);
  if (state) params.set("state", state);
  const cursor = cursors[cursors.length - 1];
  if (cursor) params.set("cursor", cursor);
  const { body } = await api("GET", `/v1/schedules?${params}`);
  const tbody = $("schedules").querySelector("tbody");
  tbody.replaceChildren();
  for (const s of body.schedules) {
    const zone = s.spec.tz || "UTC";
    const tr = document.createElement("tr");
    tr.dataset.scheduleId = s.schedule_id;
    const next = cell(formatTime(s.next_fire_ms, zone), "next-fire");
    if (zone !== "UTC" && s.next_fire_ms !== null) {
      const utc = document.createElement("div");
      utc.className = "muted";
      utc.textContent = formatTime(s.next_fire_ms);
      next.append(utc);
    }
    tr.append(cell(s.schedule_id), cell(s.summary, "summary"), cell(zone), next,
              cell(s.runs, "num"), cell(s.skipped, "num"), cell(formatTime(s.last_fired_ms)),
              cell(s.state, `state state-${s.state}`));
    const actions = document.createElement("td");
    actions.append(s.state === "paused" ? button("Resume", s.schedule_id, "resume")
                                        : button("Pause", s.schedule_id, "pause"),
                   " ", button("Delete", s.schedule_id, "delete"));
    tr.append(actions);
    tbody.append(tr);
  }
  nextCursor = body.next_cursor;
  $("next-page").disabled = !nextCursor;
  $("page-note").textContent = `page ${cursors.length}, ${body.schedules.length} shown`;
}

async function loadStatus() {
  const badge = $("engine");
  let status;
  try {
    status = (await api("GET", "/v1/status")).body;
  } catch (e) {
    badge.textContent = "unreachable";
    badge.className = "badge down";
    return;
  }
  badge.textContent = status.ready ? "engine running" : "engine starting";
  badge.className = `badge ${status.ready ? "ready" : "starting"}`;
  const state = status.state || {};
  $("as-of").textContent = state.as_of_ms !== undefined ? `as of ${formatTime(state.as_of_ms)}` : "";
  $("totals").textContent = state.schedules !== undefined
    ? `${state.schedules} schedules (${state.paused} paused), ${state.pending} pending` : "";
  $("pending-count").textContent = state.pending !== undefined ? String(state.pending) : "–";
  const list = $("next-deadlines");
  list.replaceChildren();
  for (const d of state.next_deadlines || []) {
    const li = document.createElement("li");
    li.textContent = `${formatTime(d.deadline_ms)}  ${d.op_id}`;
    list.append(li);
  }
  const targets = $("targets").querySelector("tbody");
  targets.replaceChildren();
  const delivery = (status.delivery && status.delivery.targets) || {};
  for (const [name, t] of Object.entries(delivery)) {
    const tr = document.createElement("tr");
    tr.append(cell(name), cell(t.delivered, "num"), cell(t.retried || 0, "num"),
              cell(t.dead_letters, "num"), cell(t.dead_letter_dir));
    targets.append(tr);
  }
  if (!Object.keys(delivery).length) {
    const tr = document.createElement("tr");
    const td = cell("outcomes go to the output files only (no --targets or --deliver-to)");
    td.colSpan = 5;
    tr.append(td);
    targets.append(tr);
  }
}

async function loadOutcomes() {
  const { body } = await api("GET", "/v1/outcomes/recent");
  const tbody = $("outcomes").querySelector("tbody");
  tbody.replaceChildren();
  for (const o of body.outcomes || []) {
    const tr = document.createElement("tr");
    tr.append(cell(o.op_id), cell(o.outcome), cell(formatTime(o.resolved_ms)),
              cell(`${o.latency_ms} ms`, "num"));
    tbody.append(tr);
  }
}

const SVG = "http://www.w3.org/2000/svg";

function chart(svg, series, classes, unit) {
  const width = 600, height = 140, pad = 28;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren();
  const points = series.flat().filter((p) => p[1] !== null);
  if (!points.length) {
    const t = document.createElementNS(SVG, "text");
    t.setAttribute("x", pad); t.setAttribute("y", height / 2);
    t.textContent = "no samples yet";
    svg.append(t);
    return;
  }
  const t0 = Math.min(...points.map((p) => p[0])), t1 = Math.max(...points.map((p) => p[0]));
  const top = Math.max(1, ...points.map((p) => p[1]));
  const x = (t) => pad + (t1 === t0 ? 0 : (t - t0) / (t1 - t0)) * (width - 2 * pad);
  const y = (v) => height - pad + 10 - (v / top) * (height - pad - 10);
  series.forEach((line, i) => {
    const shown = line.filter((p) => p[1] !== null);
    const path = document.createElementNS(SVG, "polyline");
    path.setAttribute("class", classes[i]);
    path.setAttribute("points", shown.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`)
      .join(" "));
    svg.append(path);
    for (const p of shown.length < 40 ? shown : []) { // a lone sample shows as a dot
      const dot = document.createElementNS(SVG, "circle");
      dot.setAttribute("class", `dot ${classes[i]}`);
      dot.setAttribute("cx", x(p[0]).toFixed(1)); dot.setAttribute("cy", y(p[1]).toFixed(1));
      dot.setAttribute("r", "2");
      svg.append(dot);
    }
  });
  const text = (tx, ty, words, anchor) => {
    const t = document.createElementNS(SVG, "text");
    t.setAttribute("x", tx); t.setAttribute("y", ty);
    if (anchor) t.setAttribute("text-anchor", anchor);
    t.textContent = words;
    svg.append(t);
  };
  text(2, 12, `max ${top.toLocaleString("en")} ${unit}`);
  text(pad, height - 4, formatTime(t0).slice(11));
  text(width - pad, height - 4, formatTime(t1).slice(11), "end");
}

async function loadHistory() {
  const { body } = await api("GET", "/v1/history");
  const samples = body.samples || [];
  chart($("chart-acked"), [samples.map((s) => [s.t_ms, s.acked_per_s])], ["line-a"], "/s");
  chart($("chart-fired"), [samples.map((s) => [s.t_ms, s.fired_per_s]),
                           samples.map((s) => [s.t_ms, s.resolved_per_s])],
        ["line-a", "line-b"], "/s");
  chart($("chart-latency"), [samples.map((s) => [s.t_ms, s.ack_p50_ms]),
                             samples.map((s) => [s.t_ms, s.ack_p99_ms])],
        ["line-a", "line-b"], "ms");
}

async function lookUp(event) {
  event.preventDefault();
  const opId = $("op-id").value;
  const dl = $("operation");
  dl.replaceChildren();
  const { status, body } = await api("GET", `/v1/operations/${pathPart(opId)}`);
  const rows = status === 404 ? [["op_id", opId], ["state", "unknown (never seen, or forgotten)"]]
    : Object.entries(body).map(([k, v]) =>
        [k, k.endsWith("_ms") && v !== null ? `${formatTime(v)} (${v})` : JSON.stringify(v)]);
  for (const [k, v] of rows) {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    dl.append(dt, dd);
  }
}

async function refresh() {
  const work = [loadStatus(), loadSchedules(), loadOutcomes(), loadHistory()];
  for (const result of await Promise.allSettled(work)) {
    if (result.status === "rejected") $("action-note").textContent = String(result.reason);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("filter").addEventListener("submit", (event) => {
    event.preventDefault();
    cursors = [null];
    loadSchedules();
  });
  $("next-page").addEventListener("click", () => {
    if (nextCursor) { cursors.push(nextCursor); loadSchedules(); }
  });
  $("first-page").addEventListener("click", () => { cursors = [null]; loadSchedules(); });
  $("lookup").addEventListener("submit", lookUp);
  refresh();
  setInterval(refresh, REFRESH_MS);
});
