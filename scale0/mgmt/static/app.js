// The Scale0 management page: log in, then poll the family-wide status and draw it.
// Everything goes through the JSON API (docs/management.md); data is put into the page with
// textContent only, never as HTML.
"use strict";

const REFRESH_MS = 2000;
const CLIENTS_REFRESH_MS = 5000;
// The trend summary changes only when scale0-trend runs again: once a minute is plenty.
const TRENDS_REFRESH_MS = 60000;
// The task coordinator's numbers (GET /api/tasks): one request to it per refresh.
const TASKS_REFRESH_MS = 5000;
const TASK_ROWS = 20;
// Rows shown per trend table; the rest are counted in a last row.
const TREND_ROWS = 200;
const FAMILY_TIMEOUT_MS = 1500;
const CHART_WINDOW_S = 300;
const MIN_CHART_WINDOW_S = 30;
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563"];

let session = null;
let timers = [];
let lastStatus = null;

function $(id) { return document.getElementById(id); }

async function api(method, path, body) {
  const headers = {};
  const init = { method, headers, credentials: "same-origin" };
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    if (session) headers["X-CSRF-Token"] = session.csrf_token;
    init.body = JSON.stringify(body || {});
  }
  const response = await fetch(path, init);
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  return { status: response.status, data };
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function clear(tbody) { while (tbody.firstChild) tbody.removeChild(tbody.firstChild); }

function duration(seconds) {
  if (typeof seconds !== "number") return "";
  if (seconds < 60) return seconds.toFixed(0) + " s";
  if (seconds < 3600) return (seconds / 60).toFixed(0) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

// Quantiles come from histogram buckets: the value is the bucket's upper bound.
function ms(seconds) {
  return typeof seconds === "number" ? "≤ " + (seconds * 1000).toFixed(1) + " ms" : "–";
}

function showMessage(text) { $("message").textContent = text || ""; }

// ---- login ---------------------------------------------------------------------------------

function showLogin() {
  session = null;
  timers.forEach(clearInterval);
  timers = [];
  $("dashboard").hidden = true;
  $("who").hidden = true;
  $("login").hidden = false;
}

function showDashboard(s) {
  session = s;
  $("login").hidden = true;
  $("dashboard").hidden = false;
  $("who").hidden = false;
  $("who-text").textContent = s.auth_id + " (" + s.role + ") on " + s.broker;
  $("family-name").textContent = s.family;
  document.body.classList.toggle("read-only", s.role !== "admin");
  document.querySelectorAll(".admin-only").forEach((el) => { el.hidden = s.role !== "admin"; });
  refresh();
  refreshClients();
  refreshTrends();
  refreshTasks();
  timers.push(setInterval(refresh, REFRESH_MS));
  timers.push(setInterval(refreshClients, CLIENTS_REFRESH_MS));
  timers.push(setInterval(refreshTrends, TRENDS_REFRESH_MS));
  timers.push(setInterval(refreshTasks, TASKS_REFRESH_MS));
}

async function login(event) {
  event.preventDefault();
  $("login-error").textContent = "";
  const r = await api("POST", "/api/login", {
    auth_id: $("auth-id").value,
    password: $("password").value,
  });
  $("password").value = "";
  if (r.status === 200) {
    showDashboard(r.data);
  } else {
    $("login-error").textContent = (r.data && r.data.message) || ("login failed (" + r.status + ")");
  }
}

async function logout() {
  await api("POST", "/api/logout", {});
  showLogin();
}

// ---- the family at a glance ----------------------------------------------------------------

function stateOf(entry) {
  if (entry.code === null) return "not answering";
  if (entry.result && entry.result.state) return entry.result.state;
  return "error " + entry.code;
}

function renderConfig(entries) {
  const versions = new Map();
  entries.forEach((e) => {
    if (e.code === 200 && e.result) {
      const key = e.result.config_version + " " + e.result.sha256;
      if (!versions.has(key)) versions.set(key, []);
      versions.get(key).push(e.broker);
    }
  });
  const summary = $("config-summary");
  summary.className = versions.size > 1 ? "conflict" : "";
  if (versions.size === 0) { summary.textContent = "no broker answered"; return; }
  const parts = [];
  versions.forEach((brokers, key) => {
    const [version, sha] = key.split(" ");
    parts.push("config v" + version + " (" + sha.slice(0, 12) + ") on " + brokers.join(", "));
  });
  const conflicts = [];
  entries.forEach((e) => {
    ((e.result && e.result.config_conflicts) || []).forEach((c) => {
      conflicts.push(e.broker + " kept " + c.kept.slice(0, 12) + " over " + c.dropped.slice(0, 12) +
                     " (v" + c.version + " from " + c.origin + ")");
    });
  });
  summary.textContent = (versions.size > 1 ? "CONFLICT: " : "") + parts.join("; ") +
    (conflicts.length ? ". Settled conflicts: " + conflicts.join("; ") : "");
}

function renderBrokers(entries) {
  const tbody = $("brokers").querySelector("tbody");
  clear(tbody);
  entries.forEach((e) => {
    const row = document.createElement("tr");
    row.dataset.broker = e.broker;
    const s = e.result || {};
    cell(row, e.broker);
    const state = stateOf(e);
    const stateCell = cell(row, "");
    const badge = document.createElement("span");
    badge.className = "state state-" + state.replace(/ /g, "-");
    badge.textContent = state;
    stateCell.appendChild(badge);
    cell(row, s.config_version !== undefined ? "v" + s.config_version : "");
    cell(row, duration(s.uptime_s), "num");
    cell(row, s.clients, "num");
    cell(row, s.workers, "num");
    cell(row, s.requests, "num");
    cell(row, s.replies, "num");
    cell(row, s.banned_senders, "num");
    const actions = cell(row, "", "admin-only");
    if (session && session.role === "admin" && e.code !== null) {
      const button = document.createElement("button");
      const disabled = state === "disabled";
      button.type = "button";
      button.className = disabled ? "enable" : "disable";
      button.textContent = disabled ? "Enable" : "Disable";
      button.dataset.broker = e.broker;
      button.addEventListener("click", () => changeState(disabled ? "enable" : "disable", e.broker));
      actions.appendChild(button);
      if (s.config_source) {
        const reload = document.createElement("button");
        reload.type = "button";
        reload.className = "reload";
        reload.textContent = "Reload config";
        reload.dataset.broker = e.broker;
        reload.addEventListener("click", () => reloadConfig(e.broker));
        actions.appendChild(reload);
      }
    } else {
      actions.hidden = !(session && session.role === "admin");
    }
    tbody.appendChild(row);
  });
}

function renderServices(entries) {
  const tbody = $("services").querySelector("tbody");
  clear(tbody);
  const rows = [];
  entries.forEach((e) => {
    ((e.result && e.result.services) || []).forEach((s) => rows.push([s, e.broker]));
  });
  rows.sort((a, b) => (a[0].service + a[1]).localeCompare(b[0].service + b[1]));
  rows.forEach(([s, broker]) => {
    const row = document.createElement("tr");
    row.dataset.service = s.service;
    cell(row, s.service);
    cell(row, broker);
    cell(row, s.workers, "num");
    cell(row, s.ready, "num");
    cell(row, s.busy, "num");
    cell(row, s.queued, "num");
    cell(row, s.latency_count, "num");
    cell(row, ms(s.latency_p50_s), "num");
    cell(row, ms(s.latency_p95_s), "num");
    tbody.appendChild(row);
  });
}

function series(history, pick) {
  const points = [];
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i];
    const dt = b.time - a.time;
    if (dt <= 0) continue;
    const value = pick(a, b, dt);
    if (value !== null) points.push([b.time, value]);
  }
  return points;
}

function drawChart(canvas, lines, unit) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 48, bottom = 22, top = 8, right = 8;
  ctx.clearRect(0, 0, w, h);
  const now = Date.now() / 1000;
  // Up to CHART_WINDOW_S back, but no further than the oldest point (a young family shows
  // its first minute across the whole width rather than as a sliver at the right edge).
  let oldest = now;
  lines.forEach((l) => l.points.forEach(([t]) => { oldest = Math.min(oldest, t); }));
  const span = Math.min(CHART_WINDOW_S, Math.max(MIN_CHART_WINDOW_S, now - oldest));
  const t0 = now - span;
  let max = 0;
  lines.forEach((l) => l.points.forEach(([t, v]) => { if (t >= t0) max = Math.max(max, v); }));
  max = max > 0 ? max * 1.15 : 1;
  ctx.strokeStyle = "#9ca3af";
  ctx.fillStyle = "#4b5563";
  ctx.font = "11px system-ui, sans-serif";
  ctx.beginPath();
  ctx.moveTo(left, top); ctx.lineTo(left, h - bottom); ctx.lineTo(w - right, h - bottom);
  ctx.stroke();
  ctx.fillText(max.toFixed(max < 10 ? 1 : 0) + unit, 2, top + 10);
  ctx.fillText("0", left - 12, h - bottom);
  ctx.fillText(span >= 120 ? "-" + Math.round(span / 60) + " min" : "-" + Math.round(span) + " s",
               left, h - 6);
  ctx.fillText("now", w - right - 22, h - 6);
  const x = (t) => left + ((t - t0) / span) * (w - left - right);
  const y = (v) => h - bottom - (v / max) * (h - bottom - top);
  lines.forEach((l) => {
    ctx.strokeStyle = l.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let started = false;
    l.points.forEach(([t, v]) => {
      if (t < t0) return;
      if (started) ctx.lineTo(x(t), y(v)); else { ctx.moveTo(x(t), y(v)); started = true; }
    });
    ctx.stroke();
    ctx.fillStyle = l.color;
    l.points.forEach(([t, v]) => {  // dots too: one point is no line but still a reading
      if (t < t0) return;
      ctx.beginPath();
      ctx.arc(x(t), y(v), 2.5, 0, 2 * Math.PI);
      ctx.fill();
    });
  });
}

function renderCharts(entries) {
  const rate = [], latency = [];
  const legend = $("legend");
  clear(legend);
  entries.forEach((e, i) => {
    const color = COLORS[i % COLORS.length];
    const s = e.result || {};
    // The broker samples every 5 s; its counters now make the last point, so lines move live.
    const history = (s.history || []).concat(
      s.time ? [{ time: s.time, requests: s.requests, latency_sum_s: s.latency_sum_s,
                  latency_count: s.latency_count }] : []);
    rate.push({ color, points: series(history, (a, b, dt) => (b.requests - a.requests) / dt) });
    latency.push({
      color,
      points: series(history, (a, b) => {
        const n = b.latency_count - a.latency_count;
        return n > 0 ? ((b.latency_sum_s - a.latency_sum_s) / n) * 1000 : null;
      }),
    });
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = color;
    legend.appendChild(swatch);
    legend.appendChild(document.createTextNode(e.broker));
  });
  drawChart($("rate-chart"), rate, "/s");
  drawChart($("latency-chart"), latency, " ms");
}

async function refresh() {
  const r = await api("GET", "/api/status?family=true&timeout_ms=" + FAMILY_TIMEOUT_MS);
  if (r.status === 401) { showLogin(); return; }
  if (r.status !== 200 || !r.data || !r.data.result) {
    showMessage("status failed: " + ((r.data && r.data.message) || r.status));
    return;
  }
  lastStatus = r.data.result;
  const entries = lastStatus.brokers;
  renderBrokers(entries);
  renderConfig(entries);
  renderServices(entries);
  renderCharts(entries);
  $("updated").textContent = new Date().toLocaleTimeString();
  $("asked-by").textContent = lastStatus.asked_by;
}

async function refreshClients() {
  const r = await api("GET", "/api/list_clients?family=true&timeout_ms=" + FAMILY_TIMEOUT_MS);
  if (r.status !== 200 || !r.data || !r.data.result) return;
  const tbody = $("clients").querySelector("tbody");
  clear(tbody);
  r.data.result.brokers.forEach((e) => {
    ((e.result && e.result.clients) || []).forEach((c) => {
      const row = document.createElement("tr");
      cell(row, e.broker);
      cell(row, c.client_id);
      cell(row, duration(c.idle_s), "num");
      cell(row, c.requests, "num");
      tbody.appendChild(row);
    });
  });
}

// ---- trends: the summary scale0-trend wrote (GET /api/trends, docs/management.md) -----------

// Shares as percentages; null is "unknown" (a broker or worker with requests but no
// lifecycle record has no availability, docs/trend.md).
function percent(share) {
  return typeof share === "number" ? (share * 100).toFixed(2) + " %" : "unknown";
}

function latencyMs(value) {
  return typeof value === "number" ? value.toFixed(2) + " ms" : "–";
}

function utcMinute(ms) {
  return new Date(ms).toISOString().slice(0, 16).replace("T", " ") + " UTC";
}

// The job writes times as "2026-11-18T04:00:00Z".
function utcTime(text) {
  return typeof text === "string" ? text.replace("T", " ").replace(/Z$/, "") : "";
}

function downFor(row) {
  if (typeof row.observed_ms !== "number" || typeof row.up_ms !== "number") return "";
  return duration((row.observed_ms - row.up_ms) / 1000);
}

function fillRows(tableId, rows, columns, mark) {
  const tbody = $(tableId).querySelector("tbody");
  clear(tbody);
  rows.slice(0, TREND_ROWS).forEach((r) => {
    const row = document.createElement("tr");
    mark(row, r);
    columns.forEach(([pick, cls]) => cell(row, pick(r), cls));
    tbody.appendChild(row);
  });
  if (rows.length > TREND_ROWS) {
    const row = document.createElement("tr");
    const td = cell(row, "… and " + (rows.length - TREND_ROWS) + " more in the summary file");
    td.colSpan = columns.length;
    td.className = "muted";
    tbody.appendChild(row);
  }
}

function trendsNote(text, isError, command) {
  const note = $("trends-note");
  clear(note);
  note.className = isError ? "error" : "";
  note.appendChild(document.createTextNode(text || ""));
  if (command) {
    note.appendChild(document.createTextNode(" "));
    const code = document.createElement("code");
    code.id = "trends-command";
    code.textContent = command;
    note.appendChild(code);
  }
}

function renderTrends(result) {
  const s = result.summary;
  $("trends-from").textContent = utcMinute(s.window.start_ms);
  $("trends-to").textContent = utcMinute(s.window.end_ms);
  $("trends-requests").textContent = String(s.totals.requests);
  $("trends-error-rate").textContent = percent(s.totals.error_rate);
  $("trends-made").textContent = s.generated_at;
  $("trends-source").textContent = s.source;
  $("trends-file").textContent = result.file;
  fillRows("trend-services", s.services, [
    [(r) => r.service],
    [(r) => r.requests, "num"],
    [(r) => r.errors, "num"],
    [(r) => percent(r.error_rate), "num"],
    [(r) => latencyMs(r.p50_ms), "num"],
    [(r) => latencyMs(r.p95_ms), "num"],
    [(r) => latencyMs(r.p99_ms), "num"],
  ], (row, r) => { row.dataset.service = r.service; });
  const share = [(r) => percent(r.load_share), "num"];
  fillRows("trend-brokers", s.brokers, [
    [(r) => r.broker],
    [(r) => percent(r.availability), "num"],
    [downFor, "num"],
    [(r) => r.requests, "num"],
    share,
  ], (row, r) => { row.dataset.broker = r.broker; });
  fillRows("trend-workers", s.workers, [
    [(r) => r.broker],
    [(r) => r.worker],
    [(r) => percent(r.availability), "num"],
    [downFor, "num"],
    [(r) => r.requests, "num"],
    share,
  ], (row, r) => { row.dataset.broker = r.broker; row.dataset.worker = r.worker; });
  fillRows("trend-config", s.config_changes, [
    [(r) => utcTime(r.at)],
    [(r) => r.broker],
    [(r) => r.outcome],
    [(r) => (r.config_version === null ? "" : "v" + r.config_version)],
    [(r) => (r.sha256 || "").slice(0, 12)],
    [(r) => r.reason || ""],
  ], (row, r) => { if (r.outcome === "refused") row.className = "refused"; });
}

async function refreshTrends() {
  const r = await api("GET", "/api/trends");
  if (r.status === 401) return;  // the status poll takes the page back to the login form
  const result = (r.data && r.data.result) || {};
  if (r.status === 200 && result.summary) {
    trendsNote("", false);
    renderTrends(result);
    $("trends-body").hidden = false;
    return;
  }
  $("trends-body").hidden = true;
  const message = (r.data && r.data.message) || ("the trend summary failed (" + r.status + ")");
  if (r.status === 404 && result.configured === false) {
    trendsNote(message.charAt(0).toUpperCase() + message.slice(1) + ".", false);
  } else if (r.status === 404 && result.command) {
    trendsNote("No trend summary yet: " + result.file + " does not exist. Make it with",
               false, result.command);
  } else {
    trendsNote("The trend summary cannot be shown: " + message, true);
  }
}

// ---- tasks: the task coordinator's numbers, through the family (GET /api/tasks) ------------

function utcSeconds(seconds) {
  if (typeof seconds !== "number") return "";
  return new Date(seconds * 1000).toISOString().slice(0, 19).replace("T", " ");
}

function counted(map) {
  return Object.entries(map || {}).map(([key, n]) => key + " " + n).join(", ");
}

function tasksNote(text, isError) {
  const note = $("tasks-note");
  note.className = isError ? "error" : "";
  note.textContent = text || "";
}

function renderTasks(result) {
  const states = result.states || {};
  $("tasks-queue-depth").textContent = String(result.queue_depth);
  $("tasks-queue-by-protocol").textContent = counted(result.queue);
  $("tasks-waiting").textContent = String(states.waiting);
  $("tasks-running").textContent = String(states.running);
  $("tasks-complete").textContent = String(states.complete);
  $("tasks-by-success").textContent = counted(result.completed);
  $("tasks-failed").textContent = String(result.failed);
  $("tasks-created").textContent = String(result.created);
  $("tasks-reruns").textContent = String(result.reruns);
  $("tasks-refused").textContent = String(result.refused);
  $("tasks-nodes-connected").textContent = String(result.nodes_connected);
  $("tasks-service").textContent = result.service;
  $("tasks-time").textContent = utcSeconds(result.time);
  $("tasks-asked-by").textContent = result.asked_by;
  const nodes = $("task-nodes").querySelector("tbody");
  clear(nodes);
  (result.nodes || []).forEach((n) => {
    const row = document.createElement("tr");
    row.dataset.node = n.node;
    cell(row, n.node);
    cell(row, n.connected ? "yes" : "no");
    cell(row, n.running, "num");
    cell(row, n.memory_reserved + " / " + n.memory, "num");
    cell(row, n.cores_reserved + " / " + n.cores, "num");
    nodes.appendChild(row);
  });
  if (!(result.nodes || []).length) {
    const row = document.createElement("tr");
    cell(row, "no node has connected", "muted").colSpan = 5;
    nodes.appendChild(row);
  }
  const recent = $("task-recent").querySelector("tbody");
  clear(recent);
  (result.recent || []).forEach((t) => {
    const row = document.createElement("tr");
    row.dataset.task = t.name;
    if (["error", "fatal", "terminated"].includes(t.success)) row.className = "failed";
    cell(row, t.name);
    cell(row, t.protocol);
    cell(row, t.state);
    cell(row, t.success);
    cell(row, t.node);
    cell(row, t.attempt, "num");
    cell(row, utcSeconds(t["time-create"]));
    cell(row, utcSeconds(t["time-finish"]));
    recent.appendChild(row);
  });
}

async function refreshTasks() {
  const r = await api("GET", "/api/tasks?recent=" + TASK_ROWS);
  if (r.status === 401) return;  // the status poll takes the page back to the login form
  const result = (r.data && r.data.result) || {};
  if (r.status === 200 && result.coordinator) {
    tasksNote("", false);
    renderTasks(result);
    $("tasks-body").hidden = false;
    return;
  }
  // No numbers rather than old ones: the note says why, plainly when no coordinator answers.
  $("tasks-body").hidden = true;
  const message = (r.data && r.data.message) || ("the task numbers failed (" + r.status + ")");
  const plain = ["not-served", "no-answer", "busy"].includes(result.reason);
  tasksNote(message.charAt(0).toUpperCase() + message.slice(1) + ".", !plain);
}

async function changeState(command, broker) {
  showMessage(command + " " + broker + "…");
  const r = await api("POST", "/api/" + command, { broker });
  if (r.status === 200) {
    showMessage(broker + " is now " + r.data.result.state);
  } else {
    showMessage(command + " " + broker + " failed: " + ((r.data && r.data.message) || r.status));
  }
  refresh();
}

async function reloadConfig(broker) {
  showMessage("reload config on " + broker + "…");
  const r = await api("POST", "/api/reload_config", { broker });
  const result = (r.data && r.data.result) || {};
  if (r.status === 200 && result.applied) {
    const restart = (result.restart_needed || []).length
      ? "; needs a restart: " + result.restart_needed.join(", ") : "";
    showMessage(broker + " applied config v" + result.config_version + " (changed: " +
                (result.changed || []).join(", ") + restart + ")");
  } else if (r.status === 200) {
    showMessage(broker + ": nothing to apply (" + (result.reason || result.note || "") + ")");
  } else {
    showMessage("reload on " + broker + " refused: " + ((r.data && r.data.message) || r.status));
  }
  refresh();
}

async function start() {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  const r = await api("GET", "/api/session");
  if (r.status === 200) showDashboard(r.data); else showLogin();
}

document.addEventListener("DOMContentLoaded", start);
