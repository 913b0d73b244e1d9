// The console of a relay of many outboxes (sweeper run --schemas): the list
// of GET /outboxes, each linking to that outbox's own console. Everything
// from the API is shown as text, never as HTML. The token lives in
// sessionStorage, as on an outbox's console, under the same key.
"use strict";

const refreshEvery = 5000;
const $ = (id) => document.getElementById(id);

function token() { return sessionStorage.getItem("outbox-admin-token") || ""; }

function showSignin(why) {
  $("console").hidden = true;
  $("signin").hidden = false;
  $("signout").hidden = true;
  $("signin-error").textContent = token() ? why : "";
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 60) return seconds.toFixed(1) + " s";
  if (seconds < 3600) return (seconds / 60).toFixed(1) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

async function refresh() {
  const headers = {};
  if (token()) headers["Authorization"] = "Bearer " + token();
  let resp, data = {};
  try {
    resp = await fetch("outboxes?limit=1000", { headers });
    data = await resp.json();
  } catch (e) {
    $("message").textContent = "The relay does not answer: " + e.message;
    return;
  }
  if (resp.status === 401) { showSignin(data.error || "the token is missing or wrong"); return; }
  if (!resp.ok) { $("message").textContent = data.error || resp.status + " " + resp.statusText; return; }
  $("signin").hidden = true;
  $("console").hidden = false;
  $("signout").hidden = !token();
  $("message").textContent = "";
  const body = $("outboxes");
  body.replaceChildren();
  for (const o of data.outboxes) {
    const tr = document.createElement("tr");
    const name = document.createElement("a");
    name.href = o.path.replace(/^\//, "");
    name.textContent = o.name;
    cell(tr, "").appendChild(name);
    const trouble = o.database_unreachable || o.tripped_topics.length > 0 || o.sweeps_failing > 0;
    const state = o.database_unreachable ? "database unreachable" : trouble ? "in trouble" : o.parked ? "idle" : "sweeping";
    cell(tr, state, trouble ? "state degraded" : "state ok");
    cell(tr, String(o.backlog));
    cell(tr, age(o.oldest_age_seconds));
    cell(tr, String(o.dead_letters_estimate));
    cell(tr, o.tripped_topics.join(", "));
    cell(tr, o.sweeps_failing ? String(o.sweeps_failing) : "");
    body.appendChild(tr);
  }
  $("more").hidden = data.omitted === 0;
  $("more").textContent = data.omitted + " more not listed.";
  $("updated").textContent = data.total + " outboxes, updated " + new Date().toLocaleTimeString();
}

$("signin-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("outbox-admin-token", $("token").value);
  refresh();
});
$("signout").addEventListener("click", () => {
  sessionStorage.removeItem("outbox-admin-token");
  showSignin("");
});
refresh();
setInterval(refresh, refreshEvery);
