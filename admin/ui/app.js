// The outbox sweeper's console: a view of GET /status, refreshed every few
// seconds, and buttons for the admin API's actions. Everything from the
// sweeper (topics, errors, correlation ids, payloads) is put in the page as
// text, never as HTML. The token lives in sessionStorage and travels in the
// Authorization header only. Every change is a POST in JSON, an empty one
// too: the API refuses others, which a page of another site could send. Questions are asked in the page, not in browser
// dialogs: a phone may suppress those, and an operator should see the count
// and the question side by side.
"use strict";

const refreshEvery = 3000;
let cursor = null;
// The dead-letter listing last asked for. Listings can be in flight side by
// side (the one the page starts on load, and a group's List clicked at once),
// and their answers come back in any order: an answer to an earlier one is
// stale, and shown it would list what the filter above no longer says.
let listing = 0;

const $ = (id) => document.getElementById(id);

function token() { return sessionStorage.getItem("outbox-admin-token") || ""; }

// The API's root: "" when the console is served at /, "/outboxes/tenant_1"
// for one outbox of a relay of many (sweeper run --schemas).
const base = location.pathname.replace(/\/+$/, "");

// The outbox this console acts on, in a relay of many ("" at /): named in
// the title and in every question before an action, so that an operator
// with several tenants' consoles open acts on the one meant.
const outboxName = base.startsWith("/outboxes/") ? decodeURIComponent(base.slice("/outboxes/".length)) : "";
function ofOutbox() { return outboxName ? " of outbox " + outboxName : ""; }

async function api(method, path, body) {
  const headers = {};
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (method === "POST") headers["Content-Type"] = "application/json";
  const resp = await fetch(base + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
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

// ask shows question in the page and resolves with the reason typed (or ""
// without one) when confirmed, null when cancelled. A newer question
// cancels the one still open.
let pending = null;
function ask(question, wantReason) {
  if (pending) pending(null);
  $("ask-text").textContent = question;
  $("ask-reason-label").hidden = !wantReason;
  $("ask-reason").value = "";
  $("ask").hidden = false;
  (wantReason ? $("ask-reason") : $("ask-ok")).focus();
  return new Promise((resolve) => {
    pending = (v) => { pending = null; $("ask").hidden = true; resolve(v); };
  });
}

// ago writes seconds as a short relative time.
function ago(s) {
  s = Math.max(0, s);
  if (s < 60) return Math.round(s) + " s";
  if (s < 3600) return Math.round(s / 60) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

// at writes a time as the operator's local clock reads it: the time alone
// today, with the date otherwise.
function at(d) {
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}

// cell adds a cell of text; label names it where a narrow screen shows rows
// as cards.
function cell(tr, label, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  td.dataset.label = label;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

// timeCell shows a time both ways: how long ago, and when (ISO on hover).
function timeCell(tr, label, d) {
  const td = cell(tr, label, ago((Date.now() - d.getTime()) / 1000) + " ago");
  const abs = document.createElement("small");
  abs.className = "abs";
  abs.textContent = at(d);
  td.appendChild(abs);
  td.title = d.toISOString();
  return td;
}

function button(label, onClick, cls) {
  const b = document.createElement("button");
  b.textContent = label;
  b.addEventListener("click", onClick);
  if (cls) b.className = cls;
  return b;
}

// held writes why a topic does not send now, and until when, as the
// sweeper's gate answers it (the answer its log lines give too): the
// topic's own, else what the broker breaker holds of every topic. An API
// without the gate leaves only the backoff's figure to show.
function held(t, brokerGate) {
  const g = t.gate;
  if (!g) {
    if (brokerGate === "broker_open") return "broker breaker open: nothing sends";
    if (brokerGate === "broker_trial") return "broker breaker half-open: one trial batch";
    return t.backoff_seconds ? "backing off, " + ago(t.backoff_seconds) + " left" : "";
  }
  switch (g.reason) {
    case "tripped": return "tripped" + (g.cooldown_ticks ? ", " + g.cooldown_ticks + " ticks left" : "");
    case "trial": return "trial: one batch";
    case "backoff": {
      const until = new Date(g.until);
      return "backoff until " + at(until) + " (in " + ago((until.getTime() - Date.now()) / 1000) + ")";
    }
    case "halted": return "halted until the next sweep";
  }
  return g.reason;
}

function renderStatus(st) {
  const h = st.health;
  $("health-state").textContent = h.status;
  $("health-state").className = "state " + h.status;
  $("health-reasons").replaceChildren(...h.reasons.map((r) => {
    const li = document.createElement("li");
    li.textContent = r;
    return li;
  }));

  const bb = st.broker_breaker;
  $("broker-state").textContent = bb.state;
  $("broker-state").className = "state " + bb.state;
  const c = bb.counts || {};
  $("broker-detail").textContent = bb.state === "none" ? "this sweeper has no broker breaker" :
    (bb.gate === "broker_open" ? "no topic sends; " : bb.gate === "broker_trial" ? "one trial batch is sent alone; " : "") +
    (bb.tripped_by_hand ? "tripped by hand: " + bb.tripped_by_hand + "; " : "") +
    (c.consecutive_failures || 0) + " failures in a row; " + (c.total_failures || 0) + " failed and " +
    (c.total_successes || 0) + " succeeded of " + (c.requests || 0) + " sends this period";
  $("broker-trip").hidden = $("broker-reset").hidden = bb.state === "none";

  const now = Date.parse(st.backlog_read_at);
  const body = $("topics");
  body.replaceChildren();
  // What needs a look first: tripped, then half-open, then by backlog.
  const rank = { tripped: 0, "half-open": 1 };
  const topics = st.topics.slice().sort((a, b) => (rank[a.state] ?? 2) - (rank[b.state] ?? 2) ||
    b.outstanding - a.outstanding || (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : 0));
  for (const t of topics) {
    const tr = document.createElement("tr");
    cell(tr, "Topic", t.topic, "topic");
    cell(tr, "State", t.state, "state " + t.state);
    cell(tr, "Held", held(t, bb.gate), t.gate || bb.gate ? "warn" : "");
    cell(tr, "Outstanding", String(t.outstanding));
    if (t.outstanding) timeCell(tr, "Oldest", new Date(now - t.oldest_age_seconds * 1000));
    else cell(tr, "Oldest", "");
    cell(tr, "Sent, last min", String(t.dispatched_last_minute));
    cell(tr, "Failed, last min", t.failed_batches_last_minute + " batches" +
      (t.dead_lettered_last_minute ? ", " + t.dead_lettered_last_minute + " dead-lettered" : ""),
      t.failed_batches_last_minute ? "warn" : "");
    cell(tr, "Cooldown ticks", t.cooldown_ticks_left ? String(t.cooldown_ticks_left) : "");
    const err = cell(tr, "Last error", (t.last_error || "").slice(0, 160), "error-text");
    err.title = t.last_error || "";
    const actions = document.createElement("td");
    actions.appendChild(t.state === "closed" ? button("Trip…", () => tripTopic(t.topic)) : button("Reset", () => resetTopic(t.topic)));
    tr.appendChild(actions);
    body.appendChild(tr);
  }
  $("no-topics").hidden = st.topics.length > 0 || st.topics_omitted > 0;
  // The API lists the topics that most need a look; a topic per row (an
  // application writing an id as the topic) leaves the rest to this count.
  $("more-topics").hidden = !st.topics_omitted;
  $("more-topics").textContent = st.topics_omitted ? st.topics_omitted + " more topics not shown: the quiet ones, with the fewest rows " +
    "(thousands of topics are almost always an application writing an id as the topic)" : "";

  const groups = $("dead-groups");
  groups.replaceChildren();
  for (const g of st.dead_letters.groups) {
    const tr = document.createElement("tr");
    cell(tr, "Topic", g.topic, "topic");
    cell(tr, "Reason", g.reason);
    cell(tr, "Count", String(g.count));
    timeCell(tr, "Oldest", new Date(now - g.oldest_age_seconds * 1000));
    const actions = document.createElement("td");
    actions.appendChild(button("List", () => {
      $("f-topic").value = g.topic;
      $("f-reason").value = g.reason;
      $("f-since").value = "";
      listDeadLetters(false);
    }));
    tr.appendChild(actions);
    groups.appendChild(tr);
  }
  $("no-dead").hidden = st.dead_letters.groups.length > 0;
  if (st.dead_letters.groups_omitted) {
    const tr = document.createElement("tr");
    cell(tr, "Topic", "and " + st.dead_letters.groups_omitted + " smaller groups not shown", "muted");
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
  if (r.topic !== undefined) return "topic " + shown(r.topic) + " was " + r.previous_state + ", is " + r.state;
  if (r.replayed !== undefined) return r.replayed + " dead letters replayed";
  if (r.purged !== undefined) return r.purged + " dead letters purged";
  if (r.state !== undefined) return "broker breaker was " + r.previous_state + ", is " + r.state;
  return "done";
}

// Topics travel in the body: a URL's path cannot carry the topics "." and
// "..", which the browser resolves as folders however they are escaped.
async function tripTopic(topic) {
  const reason = await ask("Trip topic " + shown(topic) + ofOutbox() + "? Nothing of it is sent until it is reset or its cooldown ends.", true);
  if (reason === null) return;
  act("Trip", "POST", "/topics/trip", { topic, reason });
}

// resetTopic asks first, naming the topic: the rows re-sort as the backlog
// moves, and a click meant for one row's Reset could land on another's, a
// topic held on purpose for a downstream migration.
async function resetTopic(topic) {
  const ok = await ask("Reset topic " + shown(topic) + ofOutbox() + "? It sends again at once.", false);
  if (ok === null) return;
  act("Reset", "POST", "/topics/reset", { topic });
}

// shown writes a topic or filter value for a message: as it is when plain,
// quoted when spaces around it (or nothing but spaces) would go unseen.
function shown(v) {
  return v === "" || v.trim() !== v ? JSON.stringify(v) : v;
}

// filter reads the filter form: the dead-letter list's query, and the body
// that selects the same dead letters for a replay or purge. Topic and reason
// are taken as they are, spaces and all: a topic may be " x " or "   ", and
// trimmed it would select (and purge) the dead letters of another topic, or
// of every topic. Since is a duration, trimmed.
function filter() {
  const f = {};
  for (const k of ["topic", "reason"]) {
    const v = $("f-" + k).value;
    if (v !== "") f[k] = v;
  }
  const since = $("f-since").value.trim();
  if (since) f.since = since;
  return f;
}

async function listDeadLetters(more) {
  // A page more continues the listing it was asked of; a new listing
  // replaces whatever is in flight.
  const mine = more ? listing : ++listing;
  const q = new URLSearchParams({ limit: "50", ...filter() });
  if (more && cursor) q.set("cursor", cursor);
  if (!more) {
    // The last listing's cursor is not this one's: no page more of it.
    cursor = null;
    $("dlq-more").hidden = true;
  }
  try {
    const r = await api("GET", "/dlq?" + q.toString());
    if (mine !== listing) return;
    const body = $("dead-letters");
    if (!more) body.replaceChildren();
    for (const d of r.dead_letters) body.appendChild(deadLetterRow(d));
    cursor = r.next_cursor || null;
    $("dlq-more").hidden = !cursor;
    $("no-letters").hidden = body.children.length > 0;
  } catch (e) {
    if (mine === listing && e.message !== "unauthorized") say("Could not list the dead letters: " + e.message, true);
  }
}

function deadLetterRow(d) {
  const tr = document.createElement("tr");
  tr.dataset.id = String(d.id);
  const pick = document.createElement("td");
  const box = document.createElement("input");
  box.type = "checkbox";
  box.value = String(d.id);
  box.className = "pick";
  box.setAttribute("aria-label", "select dead letter " + d.id);
  pick.appendChild(box);
  tr.appendChild(pick);
  cell(tr, "Id", String(d.id));
  cell(tr, "Topic", d.topic, "topic");
  cell(tr, "Reason", d.reason);
  timeCell(tr, "Dead-lettered", new Date(d.dead_lettered_at));
  cell(tr, "Correlation id", d.correlation_id || "");
  const err = cell(tr, "Error", (d.error || "").slice(0, 160), "error-text");
  err.title = d.error || "";
  const actions = document.createElement("td");
  actions.appendChild(button("Payload", (ev) => showPayload(d.id, ev.target)));
  tr.appendChild(actions);
  return tr;
}

// showPayload fetches one dead letter with its payload, only when asked (it
// may hold personal data), and shows it under its row as text: UTF-8 when it
// decodes as such, base64 otherwise.
async function showPayload(id, btn) {
  const row = document.querySelector('#dead-letters tr[data-id="' + id + '"]');
  const next = row && row.nextElementSibling;
  if (next && next.classList.contains("payload-row")) { next.remove(); btn.textContent = "Payload"; return; }
  try {
    const r = await api("GET", "/dlq?show_payload=true&limit=1&id=" + id);
    if (r.dead_letters.length === 0) { say("Dead letter " + id + " is gone (replayed or purged).", true); return; }
    const d = r.dead_letters[0];
    const tr = document.createElement("tr");
    tr.className = "payload-row";
    const td = document.createElement("td");
    td.colSpan = 8;
    const pre = document.createElement("pre");
    pre.className = "payload";
    pre.textContent = describePayload(d);
    td.appendChild(pre);
    tr.appendChild(td);
    row.after(tr);
    btn.textContent = "Hide";
  } catch (e) {
    if (e.message !== "unauthorized") say("Could not read dead letter " + id + ": " + e.message, true);
  }
}

function describePayload(d) {
  const b64 = d.payload || "";
  const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
  let payload;
  try {
    payload = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch (e) {
    payload = "(not UTF-8; base64) " + b64;
  }
  const lines = [
    "message id:   " + d.message_id,
    "content type: " + (d.content_type || ""),
    "created:      " + d.created_at + ", " + d.attempts + " attempts",
    "headers:      " + (d.headers ? JSON.stringify(d.headers) : "{}"),
    "error:        " + (d.error || ""),
    "payload (" + bytes.length + " bytes):",
    payload,
  ];
  return lines.join("\n");
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
  await purge({ ids }, ids.length + " selected");
}

// matching is the selection of every dead letter the filter form matches:
// all of them when the form is empty.
function matching() {
  const f = filter();
  const what = Object.keys(f).length === 0 ? "every dead letter" :
    "the dead letters matching " + Object.entries(f).map(([k, v]) => k + " " + shown(v)).join(", ");
  return { sel: Object.keys(f).length === 0 ? { all: true } : f, what };
}

async function replayMatching() {
  const { sel, what } = matching();
  const n = await count("/dlq/replay", sel, "replayed", "Replay");
  if (n === null) return;
  if (n === 0) { say("Nothing to replay: no dead letter matches.", true); return; }
  if (await ask("Replay " + n + " dead letters (" + what + ") to the outbox" + (outboxName ? " " + outboxName : "") + "?", false) === null) return;
  if (await act("Replay", "POST", "/dlq/replay", sel)) listDeadLetters(false);
}

async function purgeMatching() {
  const { sel, what } = matching();
  if (sel.since) {
    say("Purge selects by topic and reason here, not by Since (that would purge the newest): clear Since, " +
      "or purge by age with `sweeper dlq purge --older-than`.", true);
    return;
  }
  await purge(sel, what);
}

// purge asks the API how many dead letters sel holds (a dry run), asks the
// operator with that number, and purges.
async function purge(sel, what) {
  const n = await count("/dlq/purge", { ...sel }, "purged", "Purge");
  if (n === null) return;
  if (n === 0) { say("Nothing to purge: no dead letter matches.", true); return; }
  if (await ask("Delete " + n + " dead letters (" + what + ")" + ofOutbox() + " for good? They cannot be replayed after.", false) === null) return;
  if (await act("Purge", "POST", "/dlq/purge", sel)) listDeadLetters(false);
}

async function count(path, sel, field, what) {
  try {
    return (await api("POST", path, { ...sel, dry_run: true }))[field];
  } catch (e) {
    if (e.message !== "unauthorized") say(what + " failed: " + e.message, true);
    return null;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  if (outboxName) {
    document.title = "outbox sweeper: " + outboxName;
    document.querySelector("h1").textContent = "outbox sweeper: " + outboxName;
  }
  $("signin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem("outbox-admin-token", $("token").value);
    $("token").value = "";
    refresh().then(() => listDeadLetters(false));
  });
  $("signout").addEventListener("click", () => { sessionStorage.removeItem("outbox-admin-token"); showSignin(""); });
  $("ask-ok").addEventListener("click", () => pending && pending($("ask-reason").value));
  $("ask-cancel").addEventListener("click", () => pending && pending(null));
  $("broker-trip").addEventListener("click", async () => {
    const reason = await ask("Trip the broker breaker? Nothing is sent, and nothing charged, until it is reset" +
      (outboxName ? ", by any outbox of this relay: the broker's breaker is shared." : "."), true);
    if (reason !== null) act("Broker trip", "POST", "/breaker/trip", { reason });
  });
  $("broker-reset").addEventListener("click", () => act("Broker reset", "POST", "/breaker/reset"));
  $("trip-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    // As typed: a topic may start or end with a space.
    const topic = $("trip-topic").value;
    if (topic !== "") tripTopic(topic);
  });
  $("dlq-filter").addEventListener("submit", (ev) => { ev.preventDefault(); listDeadLetters(false); });
  $("dlq-more").addEventListener("click", () => listDeadLetters(true));
  $("dlq-replay").addEventListener("click", replaySelected);
  $("dlq-purge").addEventListener("click", purgeSelected);
  $("dlq-replay-matching").addEventListener("click", replayMatching);
  $("dlq-purge-matching").addEventListener("click", purgeMatching);
  refresh().then(() => listDeadLetters(false));
  setInterval(refresh, refreshEvery);
});
