// The outbox sweeper's console: a view of GET /status, refreshed every few
// seconds, and buttons for the admin API's actions. Everything from the
// sweeper (topics, errors, correlation ids) is put in the page as text, never
// as HTML. The token lives in sessionStorage and travels in the Authorization
// header only.
"use strict";

const refreshEvery = 3000;
let cursor = null;

const $ = (id) => document.getElementById(id);

function token() { return sessionStorage.getItem("outbox-admin-token") || ""; }

async function api(method, path, body) {
  const headers = {};
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = {};
  try { data = await resp.json(); } catch (e) { /* not JSON: keep {} */ }
  if (resp.status === 401) { showSignin(data.error || "the token is missing or wrong"); throw new Error("unauthorized"); }
  if (!resp.ok) throw new Error(data.error || resp.status + " " + resp.statusText);
  return data;
}

function say(text, isError) {
  const m = $("message");
  m.textContent = text;
  m.className = isError ? "error" : "ok";
}

function showSignin(why) {
  $("console").hidden = true;
  $("signin").hidden = false;
  $("signout").hidden = true;
  $("signin-error").textContent = token() ? why : "";
}

function showConsole() {
  $("signin").hidden = true;
  $("console").hidden = false;
  $("signout").hidden = !token();
}

// age writes seconds as a short relative time.
function age(s) {
  if (s < 60) return Math.round(s) + " s";
  if (s < 3600) return Math.round(s / 60) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function button(label, onClick) {
  const b = document.createElement("button");
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}

function renderStatus(st) {
  const bb = st.broker_breaker;
  $("broker-state").textContent = bb.state;
  $("broker-state").className = "state " + bb.state;
  const counts = bb.counts || {};
  $("broker-detail").textContent = (bb.tripped_by_hand ? "tripped by hand: " + bb.tripped_by_hand + "; " : "") +
    (counts.consecutive_failures || 0) + " failures in a row";

  const body = $("topics");
  body.replaceChildren();
  for (const t of st.topics) {
    const tr = document.createElement("tr");
    cell(tr, t.topic, "topic");
    cell(tr, t.state + (t.backoff_seconds ? " (backing off " + age(t.backoff_seconds) + ")" : ""), "state " + t.state);
    cell(tr, String(t.outstanding));
    const oldest = cell(tr, t.outstanding ? age(t.oldest_age_seconds) : "");
    if (t.outstanding) oldest.title = new Date(Date.parse(st.backlog_read_at) - t.oldest_age_seconds * 1000).toISOString();
    cell(tr, t.cooldown_ticks_left ? String(t.cooldown_ticks_left) : "");
    const err = cell(tr, (t.last_error || "").slice(0, 160), "error-text");
    err.title = t.last_error || "";
    const actions = document.createElement("td");
    if (t.state === "closed") {
      actions.appendChild(button("Trip", () => tripTopic(t.topic)));
    } else {
      actions.appendChild(button("Reset", () => resetTopic(t.topic)));
    }
    tr.appendChild(actions);
    body.appendChild(tr);
  }
  $("no-topics").hidden = st.topics.length > 0;

  const groups = $("dead-groups");
  groups.replaceChildren();
  for (const g of st.dead_letters.groups) {
    const tr = document.createElement("tr");
    cell(tr, g.topic, "topic");
    cell(tr, g.reason);
    cell(tr, String(g.count));
    cell(tr, age(g.oldest_age_seconds));
    groups.appendChild(tr);
  }
  $("updated").textContent = "updated " + new Date(st.time).toLocaleTimeString();
  $("updated").title = st.time;
}

async function refresh() {
  try {
    renderStatus(await api("GET", "/status"));
    showConsole();
  } catch (e) {
    if (e.message !== "unauthorized") say("Could not read the status: " + e.message, true);
  }
}

async function act(what, method, path, body) {
  try {
    const r = await api(method, path, body);
    say(what + ": " + describe(r));
    await refresh();
    return r;
  } catch (e) {
    if (e.message !== "unauthorized") say(what + " failed: " + e.message, true);
  }
}

function describe(r) {
  if (r.topic !== undefined) return "topic " + r.topic + " is " + r.state;
  if (r.replayed !== undefined) return r.replayed + " dead letters replayed";
  if (r.purged !== undefined) return r.purged + " dead letters " + (r.dry_run ? "would be purged" : "purged");
  if (r.state !== undefined) return "broker breaker is " + r.state;
  return "done";
}

function tripTopic(topic) {
  const reason = prompt("Trip " + topic + ": why?");
  if (reason === null) return;
  act("Trip", "POST", "/topics/" + encodeURIComponent(topic) + "/trip", { reason });
}

function resetTopic(topic) {
  act("Reset", "POST", "/topics/" + encodeURIComponent(topic) + "/reset");
}

function filterQuery() {
  const q = new URLSearchParams({ limit: "50" });
  for (const [k, id] of [["topic", "f-topic"], ["reason", "f-reason"], ["since", "f-since"]]) {
    const v = $(id).value.trim();
    if (v) q.set(k, v);
  }
  return q;
}

async function listDeadLetters(more) {
  const q = filterQuery();
  if (more && cursor) q.set("cursor", cursor);
  try {
    const r = await api("GET", "/dlq?" + q.toString());
    const body = $("dead-letters");
    if (!more) body.replaceChildren();
    for (const d of r.dead_letters) {
      const tr = document.createElement("tr");
      const pick = document.createElement("td");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.value = String(d.id);
      box.className = "pick";
      box.setAttribute("aria-label", "select dead letter " + d.id);
      pick.appendChild(box);
      tr.appendChild(pick);
      cell(tr, String(d.id));
      cell(tr, d.topic, "topic");
      cell(tr, d.reason);
      const at = cell(tr, new Date(d.dead_lettered_at).toLocaleString());
      at.title = d.dead_lettered_at;
      cell(tr, d.correlation_id || "");
      const err = cell(tr, (d.error || "").slice(0, 160), "error-text");
      err.title = d.error || "";
      body.appendChild(tr);
    }
    cursor = r.next_cursor || null;
    $("dlq-more").hidden = !cursor;
  } catch (e) {
    if (e.message !== "unauthorized") say("Could not list the dead letters: " + e.message, true);
  }
}

function selected() {
  return Array.from(document.querySelectorAll("input.pick:checked")).map((b) => Number(b.value));
}

async function replaySelected() {
  const ids = selected();
  if (ids.length === 0) { say("Select dead letters first.", true); return; }
  if (await act("Replay", "POST", "/dlq/replay", { ids })) listDeadLetters(false);
}

async function purgeSelected() {
  const ids = selected();
  if (ids.length === 0) { say("Select dead letters first.", true); return; }
  let count;
  try {
    count = (await api("POST", "/dlq/purge", { ids, dry_run: true })).purged;
  } catch (e) {
    if (e.message !== "unauthorized") say("Purge failed: " + e.message, true);
    return;
  }
  if (!confirm("Delete " + count + " dead letters for good?")) return;
  if (await act("Purge", "POST", "/dlq/purge", { ids })) listDeadLetters(false);
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem("outbox-admin-token", $("token").value);
    $("token").value = "";
    refresh().then(() => listDeadLetters(false));
  });
  $("signout").addEventListener("click", () => { sessionStorage.removeItem("outbox-admin-token"); showSignin(""); });
  $("broker-trip").addEventListener("click", () => {
    const reason = prompt("Trip the broker breaker: why?");
    if (reason !== null) act("Broker trip", "POST", "/breaker/trip", { reason });
  });
  $("broker-reset").addEventListener("click", () => act("Broker reset", "POST", "/breaker/reset"));
  $("dlq-filter").addEventListener("submit", (ev) => { ev.preventDefault(); listDeadLetters(false); });
  $("dlq-more").addEventListener("click", () => listDeadLetters(true));
  $("dlq-replay").addEventListener("click", replaySelected);
  $("dlq-purge").addEventListener("click", purgeSelected);
  refresh().then(() => listDeadLetters(false));
  setInterval(refresh, refreshEvery);
});
