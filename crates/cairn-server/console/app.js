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
  if (!resp.ok) {
    const err = new Error((data && data.message) || "HTTP " + resp.status);
    err.kind = data && data.error;
    err.status = resp.status;
    throw err;
  }
  return data;
}

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

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
}

async function loadDatastores() {
  const list = await api("GET", "/v1/datastores");
  const body = $("datastore-rows");
  body.replaceChildren();
  for (const d of list) {
    const tr = document.createElement("tr");
    tr.dataset.datastore = d.name;
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = d.name;
    tr.appendChild(th);
    const c = d.config || {};
    cell(tr, d.reachable ? bytes(d.occupied_bytes) : "unreachable", "num");
    cell(tr, d.reachable ? bytes(d.index_bytes) : "–", "num");
    cell(tr, d.snapshots === undefined ? "–" : String(d.snapshots), "num");
    cell(tr, c.block_size ? bytes(c.block_size) : "–", "num");
    cell(tr, c.compression || "–");
    cell(tr, c.encryption || "–");
    cell(tr, d.jobs_running + " running, " + d.jobs_queued + " queued (max " + d.max_concurrent_jobs + ")");
    cell(tr, d.reachable ? (d.locked ? "locked: the key is needed" : "") : d.error, "note");
    if (d.locked) tr.lastChild.title = d.locked_reason;
    body.appendChild(tr);
  }
}

async function signedIn(who) {
  csrf = who.csrf;
  $("who-text").textContent = who.name + " (" + who.role + ", " + who.datastore + ")";
  show("who", true);
  show("sign-in", false);
  show("datastores", true);
  alertText("");
  try {
    await loadDatastores();
  } catch (e) {
    failed(e);
  }
}

function signedOut(message) {
  csrf = null;
  show("who", false);
  show("datastores", false);
  show("sign-in", true);
  alertText(message || "");
  $("token").focus();
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
    signedOut("");
  }
})();
