// The cairn console: plain JavaScript against the documented JSON API
// (docs/openapi.yaml), no build step. The session is a cookie the page cannot
// read; the CSRF token the server gave at sign-in is kept in memory and sent with
// every change.
"use strict";

let csrf = null;

const $ = (id) => document.getElementById(id);

function show(id, on) {
  $(id).hidden = !on;
}

function alertText(text) {
  const a = $("alert");
  a.textContent = text || "";
  a.hidden = !text;
}

// One API call; throws an Error with the server's one-line message.
async function api(method, path, body) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && csrf) headers["X-CSRF-Token"] = csrf;
  let resp;
  try {
    resp = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
    });
  } catch (e) {
    throw new Error("the server cannot be reached (" + e.message + ")");
  }
  if (resp.status === 204) return null;
  let data = null;
  try {
    data = await resp.json();
  } catch (e) {
    data = null;
  }
  if (!resp.ok) throw answerError(resp, data);
  return data;
}

// The Error for a failed answer, with the server's one-line message.
function answerError(resp, data) {
  const err = new Error((data && data.message) || "HTTP " + resp.status);
  err.kind = data && data.error;
  err.status = resp.status;
  return err;
}

// A download link is asked first: one that fails before its first byte (the
// snapshot forgotten meanwhile, the datastore locked, the session ended) says
// why above the listing. Followed as a plain link, the server's JSON error
// replaced the page (QA). Once the answer is a download, that request is
// dropped and the browser downloads from the link itself, to disk, however large.
document.addEventListener("click", async (ev) => {
  const a = ev.target.closest && ev.target.closest("a.download");
  if (!a || ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.altKey) return;
  ev.preventDefault();
  const stop = new AbortController();
  let resp;
  try {
    resp = await fetch(a.href, { credentials: "same-origin", signal: stop.signal });
  } catch (e) {
    alertText("Download failed: the server cannot be reached (" + e.message + ")");
    return;
  }
  if (!resp.ok) {
    let data = null;
    try {
      data = await resp.json();
    } catch (e) {
      data = null;
    }
    const err = answerError(resp, data);
    err.message = "Download failed: " + err.message;
    failed(err);
    return;
  }
  stop.abort();
  alertText("");
  const go = document.createElement("a");
  go.href = a.href;
  go.download = "";
  document.body.appendChild(go);
  go.click();
  go.remove();
});

function bytes(n) {
  if (typeof n !== "number") return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return (i === 0 ? n.toString() : n.toFixed(1)) + " " + units[i];
}

function pct(x) {
  return typeof x === "number" ? x.toFixed(1) + " %" : "–";
}

function when(t) {
  // "2026-11-25T06:24:51.123Z" -> "2026-11-25 06:24:51 UTC"
  return t ? t.replace("T", " ").replace(/\.\d+/, "").replace("Z", " UTC") : "–";
}

function duration(secs) {
  if (typeof secs !== "number") return "–";
  if (secs < 60) return secs.toFixed(1) + " s";
  if (secs < 3600) return Math.floor(secs / 60) + " min " + Math.round(secs % 60) + " s";
  return Math.floor(secs / 3600) + " h " + Math.round((secs % 3600) / 60) + " min";
}

function age(hours) {
  if (hours < 1) return Math.round(hours * 60) + " min";
  if (hours < 48) return hours.toFixed(1) + " h";
  return (hours / 24).toFixed(1) + " days";
}

// A table cell; `field` names it for tests and scripts (data-field).
// Table text comes from clients (host names, paths, tags): see `shown`.
function cell(row, text, cls, field) {
  const td = document.createElement("td");
  td.textContent = shown(text);
  if (cls) td.className = cls;
  if (field) td.dataset.field = field;
  row.appendChild(td);
  return td;
}

// A table row whose first cell is its header (`th scope=row`), holding `text`.
function row(text) {
  const tr = document.createElement("tr");
  const th = document.createElement("th");
  th.scope = "row";
  th.textContent = shown(text);
  tr.appendChild(th);
  return tr;
}

function button(text, onClick, label) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  if (label) b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}

let who = null;
// The datastore the page shows: the grant's own, or the one picked from the
// table when the grant opens every datastore (`*`).
let current = null;
// Every datastore the grant opens (from the table).
let datastoreNames = [];

function dsPath(name) {
  return "/v1/datastores/" + encodeURIComponent(name);
}

function base() {
  return dsPath(current);
}

// A link within the page: `#ds=NAME&snap=ID&path=/a`.
function hashFor(snap, path) {
  const h = new URLSearchParams();
  h.set("ds", current);
  if (snap) h.set("snap", snap);
  if (path) h.set("path", path);
  return "#" + h.toString();
}

async function loadDatastores() {
  const list = await api("GET", "/v1/datastores");
  datastoreNames = list.map((d) => d.name);
  if (!list.some((d) => d.name === current)) {
    current = list.length ? list[0].name : who.datastore;
  }
  const body = $("datastore-rows");
  body.replaceChildren();
  for (const d of list) {
    const tr = row(d.name);
    tr.dataset.datastore = d.name;
    if (list.length > 1) {
      // Several datastores: the name picks the one the page below shows.
      const a = document.createElement("a");
      a.textContent = d.name;
      a.href = "#ds=" + encodeURIComponent(d.name);
      if (d.name === current) a.setAttribute("aria-current", "true");
      tr.firstChild.replaceChildren(a);
    }
    const c = d.config || {};
    const figures = {};
    for (const f of ["stored", "dedup", "compression", "reduction"]) {
      figures[f] = cell(tr, "–", "num", f);
    }
    cell(tr, d.reachable ? bytes(d.occupied_bytes) : "unreachable", "num", "occupied");
    figures.chunks = cell(tr, "–", "num", "chunks");
    figures.index = cell(tr, d.reachable ? bytes(d.index_bytes) + " on disk" : "–", "num", "index");
    cell(tr, d.snapshots === undefined ? "–" : String(d.snapshots), "num", "snapshots");
    cell(tr, c.block_size ? bytes(c.block_size) : "–", "num", "block_size");
    cell(tr, c.compression || "–", null, "compression_level");
    cell(tr, c.encryption || "–", null, "encryption");
    cell(tr, d.jobs_running + " running, " + d.jobs_queued + " queued (max " + d.max_concurrent_jobs + ")", null, "jobs");
    const key = cell(tr, "", "note", "key");
    if (!d.reachable) {
      key.textContent = d.error;
    } else if (d.locked) {
      key.textContent = "locked: " + d.locked_reason;
      if (who.role === "admin") {
        key.appendChild(document.createTextNode(" "));
        key.appendChild(button("Unlock", () => askUnlock(d.name), "Unlock datastore " + d.name));
      }
    } else {
      key.textContent = d.unlocked.how ? "unlocked (" + d.unlocked.how + ")" : "unlocked";
      if (who.role === "admin") {
        key.appendChild(document.createTextNode(" "));
        key.appendChild(button("Lock", () => relock(d.name), "Lock datastore " + d.name));
      }
    }
    body.appendChild(tr);
    if (!d.locked && (who.role === "admin" || (who.role === "restore" && !who.host))) {
      loadFigures(d, figures);
    }
  }
  return list;
}

// The content figures: exactly what `cairn stats --json` prints.
async function loadFigures(d, f) {
  try {
    const s = await api("GET", dsPath(d.name) + "/stats");
    f.stored.textContent = bytes(s.stored_bytes);
    f.dedup.textContent = pct(s.dedup_percent);
    f.compression.textContent = pct(s.compression_percent);
    f.reduction.textContent = pct(s.reduction_percent);
    f.chunks.textContent = String(s.unique_chunks);
    const placement = (d.config && d.config.index_placement) || "ram";
    f.index.textContent = bytes(s.index.bytes) + " (" + bytes(s.index.ram_bytes) + " " +
      (placement === "ssd" ? "if in RAM; on SSD" : "in RAM") + ")";
    $("datastore-rows").dataset.figures = "loaded";
  } catch (e) {
    f.stored.textContent = "error";
    f.stored.title = e.message;
  }
}

let unlocking = null;

function askUnlock(name) {
  unlocking = name;
  $("unlock-name").textContent = name;
  show("unlock-form", true);
  $("unlock-password").focus();
}

$("unlock-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const password = $("unlock-password").value;
  try {
    await api("POST", dsPath(unlocking) + "/unlock", { password });
    $("unlock-password").value = "";
    show("unlock-form", false);
    alertText("");
    await overview();
  } catch (e) {
    $("unlock-password").value = "";
    failed(e);
  }
});

$("unlock-cancel").addEventListener("click", () => show("unlock-form", false));

async function relock(name) {
  try {
    await api("DELETE", dsPath(name) + "/unlock");
    await overview();
  } catch (e) {
    failed(e);
  }
}

// A line chart as an SVG picture: points [{x: seconds, y}], y formatted by fmt.
function chart(el, points, fmt, label) {
  el.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const W = 480, H = 160, L = 70, B = 24, T = 10, R = 10;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  const last = points.length ? points[points.length - 1].y : 0;
  svg.setAttribute("aria-label", label + ": " + points.length + " backups, now " + fmt(last));
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  };
  if (points.length === 0) {
    add("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no snapshots");
    el.appendChild(svg);
    return;
  }
  const xs = points.map((p) => p.x), ys = points.map((p) => p.y);
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  const y0 = Math.min(0, ...ys), y1 = Math.max(...ys) || 1;
  const px = (x) => L + (x1 === x0 ? (W - L - R) / 2 : ((x - x0) / (x1 - x0)) * (W - L - R));
  const py = (y) => H - B - ((y - y0) / (y1 - y0 || 1)) * (H - B - T);
  add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" });
  add("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" });
  add("text", { x: L - 4, y: T + 8, "text-anchor": "end", class: "tick" }, fmt(y1));
  add("text", { x: L - 4, y: H - B, "text-anchor": "end", class: "tick" }, fmt(y0));
  const day = (s) => new Date(s * 1000).toISOString().slice(0, 10);
  add("text", { x: L, y: H - 6, class: "tick" }, day(x0));
  add("text", { x: W - R, y: H - 6, "text-anchor": "end", class: "tick" }, day(x1));
  add("polyline", {
    points: points.map((p) => px(p.x).toFixed(1) + "," + py(p.y).toFixed(1)).join(" "),
    class: "line",
  });
  for (const p of points) add("circle", { cx: px(p.x), cy: py(p.y), r: 2.5, class: "dot" });
  el.appendChild(svg);
}

async function loadHosts(summary) {
  show("hosts", true);
  $("hosts-ds").textContent = current;
  const note = $("hosts-note");
  for (const id of ["host-rows", "snapshot-rows"]) $(id).replaceChildren();
  if (summary && summary.locked) {
    note.textContent = "Snapshots need the datastore's key: " + summary.locked_reason;
    chart($("chart-occupied"), [], bytes, "Occupied space");
    chart($("chart-reduction"), [], pct, "Reduction");
    return;
  }
  let data;
  try {
    data = await api("GET", base() + "/snapshots");
  } catch (e) {
    note.textContent = e.message;
    return;
  }
  note.textContent = "A host is flagged when its last backup is older than " +
    data.stale_after_hours + " hours." +
    (data.errors.length ? " " + data.errors.length + " snapshots could not be read: " + data.errors[0] : "");
  for (const h of data.hosts) {
    const tr = row(h.host);
    cell(tr, String(h.snapshots), "num");
    cell(tr, when(h.last));
    cell(tr, age(h.age_hours), "num");
    const st = cell(tr, hostStatus(h), h.stale ? "stale" : "fresh", "status");
    if (h.stale) tr.classList.add("stale");
    $("host-rows").appendChild(tr);
  }
  let added = 0, stored = 0;
  const occ = [], red = [];
  for (const s of data.snapshots) {
    const x = Date.parse(s.time) / 1000;
    added += s.data_added_packed;
    stored += s.size;
    // A time that is not one (the server lists such snapshots as errors) is
    // no point on a chart: one of them must not keep the table from showing.
    if (!Number.isFinite(x)) continue;
    occ.push({ x, y: added });
    red.push({ x, y: stored ? 100 * (1 - added / stored) : 0 });
  }
  try {
    chart($("chart-occupied"), occ, bytes, "Occupied space");
    chart($("chart-reduction"), red, pct, "Overall reduction");
  } catch (e) {
    failed(e);
  }
  for (const s of [...data.snapshots].reverse()) {
    const tr = document.createElement("tr");
    tr.dataset.snapshot = s.id;
    cell(tr, when(s.time));
    cell(tr, s.hostname);
    cell(
      tr,
      s.image
        ? "image " + s.paths.join(", ") + " (" + s.image.blocks_changed + " of " +
          s.image.blocks + " blocks changed)"
        : s.paths.join(", "),
      "path",
    );
    cell(tr, (s.tags || []).join(", "));
    cell(tr, bytes(s.size), "num");
    cell(tr, String(s.files), "num");
    cell(tr, bytes(s.data_added), "num");
    cell(tr, duration(s.duration_secs), "num");
    const td = cell(tr, "");
    const a = document.createElement("a");
    a.href = hashFor(s.id, "/");
    a.textContent = "Browse " + s.id.slice(0, 8);
    td.appendChild(a);
    $("snapshot-rows").appendChild(tr);
  }
}

// ---- Jobs (admin): what runs, with live progress, and the last runs.

let jobTimer = null;

function progressText(p) {
  if (!p) return "";
  let t = (p.phase || "starting").replace(/_/g, " ") + ": " + bytes(p.bytes_done);
  if (typeof p.bytes_total === "number") {
    t += " of " + bytes(p.bytes_total);
    if (p.bytes_total > 0) t += " (" + (100 * p.bytes_done / p.bytes_total).toFixed(0) + " %)";
  }
  if (p.files_done) t += ", " + p.files_done + " files";
  t += ", " + bytes(Math.round(p.bytes_per_sec)) + "/s";
  if (typeof p.eta_secs === "number") t += ", ETA " + duration(p.eta_secs);
  return t;
}

async function loadJobs() {
  if (who.role !== "admin") {
    show("jobs", false);
    return;
  }
  show("jobs", true);
  $("jobs-ds").textContent = current;
  $("schedule-ds").textContent = current;
  let list;
  try {
    list = await api("GET", "/v1/jobs");
  } catch (e) {
    failed(e);
    return;
  }
  const body = $("job-rows");
  body.replaceChildren();
  let running = false;
  for (const j of list) {
    const tr = row(j.name);
    tr.dataset.job = j.name;
    cell(tr, j.datastore, null, "datastore");
    cell(tr, j.kind + (j.read_data ? " (read " + j.read_data + ")" : ""));
    cell(tr, j.adhoc ? "once" : "every " + j.every + (j.source === "console" ? " (console)" : ""), null, "schedule");
    cell(tr, j.running ? progressText(j.progress) : "", null, "progress");
    const last = j.runs[0];
    cell(tr, last ? when(last.ended) + " (" + duration(last.secs) + ")" : "never", null, "last");
    const o = cell(tr, last ? last.outcome : "", last ? "outcome-" + last.outcome : null, "outcome");
    o.setAttribute("aria-live", "polite");
    cell(tr, last ? last.summary : "", "note", "summary");
    const actions = cell(tr, "", null, "actions");
    if (!j.adhoc) {
      actions.appendChild(button("Run now", () => runNow(j.name), "Run " + j.name + " now"));
    }
    if (j.source === "console") {
      actions.appendChild(button("Edit", () => editSchedule(j), "Edit schedule " + j.name));
      actions.appendChild(button("Remove", () => removeSchedule(j.name), "Remove schedule " + j.name));
    }
    running = running || j.running;
    body.appendChild(tr);
  }
  running = (await loadClientJobs()) || running;
  clearTimeout(jobTimer);
  // Live while something runs; every 15 s otherwise (a schedule may start one).
  jobTimer = setTimeout(() => {
    if (who && !$("jobs").hidden) loadJobs();
  }, running ? 1000 : 15000);
}

function unixTime(secs) {
  return when(new Date(secs * 1000).toISOString());
}

// Clients' jobs on each datastore: running (with the progress each client reports
// at its heartbeat), queued for a slot, and the last ones that ended. True if one
// runs.
async function loadClientJobs() {
  const body = $("client-job-rows");
  const rows = [];
  let running = false;
  for (const ds of datastoreNames) {
    let s;
    try {
      s = await api("GET", dsPath(ds) + "/slots");
    } catch (e) {
      continue;
    }
    for (const j of s.running) rows.push({ ds, j, state: "running" });
    for (const j of s.ahead) rows.push({ ds, j, state: "queued" });
    for (const j of s.recent.slice(0, 10)) rows.push({ ds, j, state: j.outcome });
    running = running || s.running.length > 0 || s.ahead.length > 0;
  }
  body.replaceChildren();
  for (const { ds, j, state } of rows) {
    const tr = row(j.host);
    tr.dataset.state = state;
    cell(tr, ds, null, "datastore");
    cell(tr, j.operation || "–", null, "operation");
    const st = cell(tr, state, "outcome-" + (state === "lost" ? "failed" : state), "state");
    st.setAttribute("aria-live", "polite");
    cell(tr, j.ended ? unixTime(j.since) + " – " + unixTime(j.ended) : unixTime(j.since));
    cell(tr, j.ended ? j.summary : progressText(j.progress), "note", "progress");
    body.appendChild(tr);
  }
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell(tr, "No client jobs since the server started.", "note");
    td.colSpan = 6;
    body.appendChild(tr);
  }
  return running;
}

async function runNow(name) {
  try {
    await api("POST", "/v1/jobs/" + encodeURIComponent(name) + "/run");
    alertText("");
  } catch (e) {
    failed(e);
  }
  await loadJobs();
}

// Every rule a console schedule can hold (PUT /v1/schedules takes no others): a
// rule the form did not show would be dropped by saving an edit.
const keepFields = ["last", "hourly", "daily", "weekly", "monthly", "yearly"];

function editSchedule(j) {
  $("schedule-name").value = j.name;
  $("schedule-kind").value = j.kind;
  $("schedule-every").value = j.every;
  $("schedule-read").value = j.read_data || "";
  for (const k of keepFields) {
    const v = j["keep_" + k];
    $("schedule-keep-" + k).value = v === null || v === undefined ? "" : String(v);
  }
  $("schedule-keep-within").value = j.keep_within || "";
  $("schedule-name").focus();
}

async function removeSchedule(name) {
  try {
    await api("DELETE", "/v1/schedules/" + encodeURIComponent(name));
    alertText("Schedule " + name + " removed.");
  } catch (e) {
    failed(e);
  }
  await loadJobs();
}

$("schedule-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const name = $("schedule-name").value.trim();
  const body = {
    kind: $("schedule-kind").value,
    datastore: current,
    every: $("schedule-every").value.trim(),
  };
  const read = $("schedule-read").value.trim();
  if (read) body.read_data = read;
  for (const k of keepFields) {
    const v = $("schedule-keep-" + k).value.trim();
    if (v === "") continue;
    // A count as the server takes one, said here in words (QA: a number too
    // large came back as the JSON parser's "invalid type: floating point").
    const n = Number(v);
    if (!Number.isSafeInteger(n) || n < -1) {
      alertText("keep-" + k + " " + v + " is not a count: use 0 or more, or -1 for unlimited");
      return;
    }
    body["keep_" + k] = n;
  }
  // A span the server checks (as forget --keep-within reads it).
  const within = $("schedule-keep-within").value.trim();
  if (within) body.keep_within = within;
  try {
    await api("PUT", "/v1/schedules/" + encodeURIComponent(name), body);
    alertText("Schedule " + name + " saved: " + body.kind + " every " + body.every + ".");
  } catch (e) {
    failed(e);
  }
  await loadJobs();
});

async function startJob(kind) {
  try {
    await api("POST", base() + "/jobs", { kind });
    alertText("");
  } catch (e) {
    failed(e);
  }
  await loadJobs();
}

for (const kind of ["check", "scrub", "prune"]) {
  $("start-" + kind).addEventListener("click", () => startJob(kind));
}

// ---- The fleet: every host of every datastore (for a grant of all datastores).

async function loadFleet() {
  if (who.datastore !== "*") {
    show("fleet", false);
    return;
  }
  show("fleet", true);
  const body = $("fleet-rows");
  let data;
  try {
    data = await api("GET", "/v1/fleet");
  } catch (e) {
    $("fleet-note").textContent = e.message;
    body.replaceChildren();
    return;
  }
  body.replaceChildren();
  let note = "A host is flagged when its last backup is older than " +
    data.stale_after_hours + " hours.";
  for (const n of data.not_shown) note += " Not shown: " + n.datastore + " (" + n.reason + ").";
  $("fleet-note").textContent = note;
  for (const h of data.hosts) {
    const tr = row(h.host);
    tr.dataset.host = h.host;
    const td = cell(tr, "", null, "datastore");
    const a = document.createElement("a");
    a.href = "#ds=" + encodeURIComponent(h.datastore);
    a.textContent = h.datastore;
    td.appendChild(a);
    cell(tr, String(h.snapshots), "num");
    cell(tr, when(h.last));
    cell(tr, age(h.age_hours), "num");
    cell(tr, hostStatus(h), h.stale ? "stale" : "fresh", "status");
    if (h.stale) tr.classList.add("stale");
    body.appendChild(tr);
  }
}

// The overview: datastores, the fleet, jobs, and the current datastore's hosts
// and snapshots.
// A host's state, and the snapshots it stored dated in the future (a clock
// ahead, or `--time`): not its last backup, but worth a look (QA: not shown).
function hostStatus(h) {
  let t = h.stale ? "no recent backup" : "ok";
  if (h.future_dated) t += ", " + h.future_dated + " dated in the future";
  return t;
}

async function overview() {
  // A failure of the view left is not this one's (QA: "no snapshot deadbeef"
  // stayed above the datastores).
  alertText("");
  show("browse", false);
  show("datastores", true);
  const list = await loadDatastores();
  await loadFleet();
  await loadJobs();
  await loadHosts(list.find((d) => d.name === current));
}

// ---- Browsing a snapshot: #snap=ID&path=/a/b

let browsing = null;

function downloadUrl(id, path, format) {
  return base() + "/snapshots/" + encodeURIComponent(id) + "/download?path=" +
    encodeURIComponent(path) + "&format=" + format;
}

// A name byte that is not UTF-8 arrives as a stand-in code point (U+10FF00 plus
// the byte): shown as \xNN, as the command line prints it, not as a private-use
// glyph. Control characters, and those that are invisible or reorder the text
// after them (a host "web01" plus a zero-width space or a word joiner; U+202E
// showing "gpj.exe" as "exe.jpg": Unicode's default-ignorable characters, a
// joiner only where it joins no script or emoji), are written out as the
// command line writes them. Links keep
// the name as it is, which the server takes back. Shown twice, a name stays the
// same.
function shown(name) {
  if (name === null || name === undefined) return "";
  const hex = (n) => n.toString(16).padStart(2, "0");
  const str = String(name);
  // Beside a character of ASCII (or at an end), a joiner or variation
  // selector joins nothing a script or an emoji needs: it only hides.
  const ascii = (i) => i < 0 || i >= str.length || str.charCodeAt(i) < 0x80;
  return str.replace(
    /[\u{10FF00}-\u{10FFFF}\u0000-\u001f\u007f-\u009f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\u{1bca0}-\u{1bca3}\u{1d173}-\u{1d17a}\u{e0000}-\u{e0fff}]/gu,
    (c, at) => {
      const n = c.codePointAt(0);
      const joiner = n === 0x200c || n === 0x200d || (n >= 0xfe00 && n <= 0xfe0f);
      if (joiner && !ascii(at - 1) && !ascii(at + c.length)) return c;
      if (n >= 0x10ff00) return "\\x" + hex(n - 0x10ff00);
      if (c === "\n") return "\\n";
      if (c === "\t") return "\\t";
      if (c === "\r") return "\\r";
      return n < 0x80 ? "\\x" + hex(n) : "\\u{" + n.toString(16) + "}";
    },
  );
}

function join(dir, name) {
  return (dir === "/" ? "" : dir) + "/" + name;
}

async function browse(id, path) {
  for (const id of ["datastores", "fleet", "hosts", "jobs"]) show(id, false);
  show("browse", true);
  show("search-results", false);
  $("browse-id").textContent = id.slice(0, 8);
  const crumbs = $("crumbs");
  crumbs.replaceChildren();
  const back = document.createElement("a");
  back.href = hashFor();
  back.textContent = "All snapshots";
  crumbs.appendChild(back);
  const parts = path.split("/").filter((p) => p);
  let acc = "";
  const root = document.createElement("a");
  root.href = hashFor(id, "/");
  root.textContent = " / ";
  crumbs.appendChild(root);
  for (const p of parts) {
    acc += "/" + p;
    const a = document.createElement("a");
    a.href = hashFor(id, acc);
    a.textContent = shown(p) + " /";
    crumbs.appendChild(a);
  }
  $("browse-archive").href = downloadUrl(id, path, "tar.zst");
  $("browse-zip").href = downloadUrl(id, path, "zip");
  $("entry-rows").replaceChildren();
  browsing = { id, path, next: null };
  await morePage();
}

async function morePage() {
  const b = browsing;
  let q = base() + "/snapshots/" + encodeURIComponent(b.id) + "/entries?path=" +
    encodeURIComponent(b.path) + "&limit=200";
  if (b.next) q += "&after=" + encodeURIComponent(b.next);
  let page;
  try {
    page = await api("GET", q);
  } catch (e) {
    $("browse-total").textContent = "";
    failed(e);
    return;
  }
  alertText("");
  $("browse-total").textContent = page.total + " entries.";
  for (const e of page.entries) {
    const full = join(b.path, e.name);
    const tr = row(shown(e.type === "symlink" ? e.name + " → " + e.link_target : e.name));
    tr.dataset.name = e.name;
    if (e.type === "dir") {
      const a = document.createElement("a");
      a.href = hashFor(b.id, full);
      a.textContent = shown(e.name) + "/";
      tr.firstChild.replaceChildren(a);
    }
    cell(tr, e.type);
    cell(tr, e.type === "file" ? bytes(e.size) : "", "num");
    cell(tr, when(e.mtime));
    cell(tr, e.user + ":" + e.group);
    const td = cell(tr, "");
    if (e.type === "file" || e.type === "dir") {
      const a = document.createElement("a");
      a.href = downloadUrl(b.id, full, e.type === "file" ? "file" : "tar.zst");
      a.textContent = e.type === "file" ? "Download" : "Download .tar.zst";
      a.setAttribute("aria-label", "Download " + shown(e.name));
      a.className = "download";
      td.appendChild(a);
    }
    $("entry-rows").appendChild(tr);
  }
  b.next = page.next || null;
  show("browse-more", !!b.next);
}

$("browse-more").addEventListener("click", () => morePage());

$("search-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const b = browsing;
  const text = $("search-text").value.trim();
  if (!b || !text) return;
  try {
    const r = await api("GET", base() + "/snapshots/" + encodeURIComponent(b.id) +
      "/search?q=" + encodeURIComponent(text) + "&path=" + encodeURIComponent(b.path));
    const list = $("search-list");
    list.replaceChildren();
    for (const e of r.entries) {
      const li = document.createElement("li");
      const a = document.createElement("a");
      if (e.type === "dir") {
        a.href = hashFor(b.id, e.path);
      } else {
        a.href = downloadUrl(b.id, e.path, "file");
        a.className = "download";
      }
      a.textContent = shown(e.path);
      li.appendChild(a);
      li.appendChild(document.createTextNode(" (" + e.type + (e.type === "file" ? ", " + bytes(e.size) : "") + ")"));
      list.appendChild(li);
    }
    $("search-count").textContent = r.entries.length + (r.truncated ? "+ (the first ones; narrow the search)" : "") +
      " of " + r.scanned + " entries looked at";
    show("search-results", true);
  } catch (e) {
    failed(e);
  }
});

async function route() {
  if (!who) return;
  const h = new URLSearchParams(location.hash.slice(1));
  if (h.get("ds")) current = h.get("ds");
  try {
    if (h.get("snap")) {
      await browse(h.get("snap"), h.get("path") || "/");
    } else {
      await overview();
    }
  } catch (e) {
    failed(e);
  }
}

window.addEventListener("hashchange", route);

async function signedIn(w) {
  who = w;
  csrf = w.csrf;
  current = w.datastore === "*" ? null : w.datastore;
  $("who-text").textContent = w.name + " (" + w.role + ", " +
    (w.datastore === "*" ? "all datastores" : w.datastore) + ")";
  show("who", true);
  show("sign-in", false);
  alertText("");
  await route();
}

function signedOut(message) {
  csrf = null;
  who = null;
  for (const id of ["who", "datastores", "fleet", "jobs", "hosts", "browse", "unlock-form"]) {
    show(id, false);
  }
  show("sign-in", true);
  alertText(message || "");
  $("user-name").focus();
}

function failed(e) {
  if (e.kind === "session_expired" || e.status === 401) {
    signedOut("Signed out: " + e.message);
  } else {
    alertText(e.message);
  }
}

$("sign-in-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const token = $("token").value.trim();
  try {
    const who = await api("POST", "/v1/session", { token });
    $("token").value = "";
    await signedIn(who);
  } catch (e) {
    alertText("Sign-in failed: " + e.message);
  }
});

$("user-sign-in-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const user = $("user-name").value.trim();
  const password = $("user-password").value;
  $("user-password").value = "";
  try {
    await signedIn(await api("POST", "/v1/session", { user, password }));
  } catch (e) {
    alertText("Sign-in failed: " + e.message);
  }
});

$("sign-out").addEventListener("click", async () => {
  try {
    await api("DELETE", "/v1/session");
  } catch (e) {
    // Signed out either way.
  }
  signedOut("Signed out.");
});

(async () => {
  try {
    await signedIn(await api("GET", "/v1/session"));
  } catch (e) {
    // A session the server ended for a reason it knows (its token removed or
    // expired) says so; one that is merely gone shows the form alone.
    signedOut(
      e.kind === "session_expired" && e.message.includes("this session signed in") ? e.message : "",
    );
  }
})();
