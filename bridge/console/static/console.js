// The ops console's pages: one script for the three of them, no framework, no inline code (the
// Content-Security-Policy allows this file and nothing else). Text is always set with textContent:
// whatever a record carries is data, never markup.
"use strict";

const state = {
  me: null, fleet: null, event: null, pending: new Map(), filling: false, fillGeneration: 0, frontier: null, waiting: new Map(),
  openGroups: new Set(), closedGroups: new Set(),  // the groups the person opened, or closed
};
// Seconds after which a decision no approver answered is flagged as such on the page.
const NO_VERDICT_SECONDS = 5;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

async function api(path, options = {}) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw Object.assign(new Error(body.error || `HTTP ${response.status}`), { status: response.status });
  return body;
}

function ago(seconds) {
  const s = Math.round(Math.abs(seconds));
  const text = s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

function when(epochSeconds) {
  return epochSeconds ? new Date(epochSeconds * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "";
}

// Countdowns tick once a second, but only those on screen (issue 33: at 100 000 VMs the page has
// 20 000 event rows, and rewriting every one of them each second starved the page).
const onScreen = new Set();
const watcher = typeof IntersectionObserver === "undefined" ? null : new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (entry.isIntersecting) { onScreen.add(entry.target); tick(entry.target); } else onScreen.delete(entry.target);
  }
});

function countdown(node, notBefore) {
  node.dataset.notBefore = notBefore || "";
  node.classList.add("countdown");
  tick(node);
  if (watcher) watcher.observe(node); else onScreen.add(node);
}

function tickOnScreen() {
  for (const node of onScreen) {
    if (node.isConnected) tick(node);
    else { onScreen.delete(node); if (watcher) watcher.unobserve(node); }
  }
}

function tick(node) {
  const at = Date.parse(node.dataset.notBefore);
  node.textContent = Number.isNaN(at) ? "now (Started)" : `${ago((at - Date.now()) / 1000)} (${node.dataset.notBefore})`;
}

// -- who is signed in ---------------------------------------------------------------------------

async function loadMe() {
  state.me = await api("/api/me");
  const me = document.getElementById("me");
  me.textContent = `${state.me.name}${state.me.canApprove ? " (may approve)" : " (may look)"}`;
}

// -- the fleet page -----------------------------------------------------------------------------

// The fleet page's data comes in pages (issue 33: the whole fleet in one answer was 3.4 MB at
// 10 000 VMs, and its fetch and parse alone took the first frame past 300 ms): the first answer has
// the counts, the groups (VM lists only for the groups shown open) and the soonest FIRST_ROWS events;
// the next events follow by cursor once the first frame is painted, CHUNK_ROWS at a time. Rows that
// arrive live while they load are placed if they sort before what is loaded, else left to the pages.
const FIRST_ROWS = 100;  // index.html preloads the first answer's address: change both together
const CHUNK_ROWS = 200;

function fleetQuery(extra = {}) {
  const params = new URLSearchParams({ q: document.getElementById("search").value, group: document.getElementById("group").value, ...extra });
  for (const name of [...state.openGroups].slice(-20)) params.append("open", name);
  return params.toString();
}

async function loadFleet(me = null) {
  const generation = ++state.fillGeneration;
  const first = await api(`/api/fleet?${fleetQuery({ events: FIRST_ROWS })}`);
  await me;  // asked for at the same time (who may approve decides the rows' buttons)
  if (generation !== state.fillGeneration) return;  // a newer search took over
  state.fleet = { ...first, events: Object.fromEntries(first.events.map((e) => [e.eventId, e])) };
  state.frontier = first.next;  // the sort key of the last row loaded; null once every row is
  state.waiting = new Map();  // live events past the frontier, by id
  const body = document.querySelector("#events tbody");
  body.replaceChildren(...first.events.map(eventRow));
  delete body.dataset.complete;
  state.filling = first.next !== null;
  if (state.filling) requestAnimationFrame(() => setTimeout(() => moreEvents(generation)));
  else body.dataset.complete = String(Math.round(performance.now()));
  renderCounts();
  renderGroups();
}

// The next page of events after the frontier, then the next, a task each; each page is asked for
// as soon as the one before it arrives, so the fetch overlaps the drawing of the rows.
function eventsPage(after) {
  return api(`/api/fleet/events?${new URLSearchParams({ q: document.getElementById("search").value, after, limit: CHUNK_ROWS })}`);
}

async function moreEvents(generation, asked = eventsPage(state.frontier)) {
  let page;
  try {
    page = await asked;
  } catch {
    setTimeout(() => moreEvents(generation), 2000);  // the console restarting: the same page again
    return;
  }
  if (generation !== state.fillGeneration) return;
  const next = page.next !== null ? eventsPage(page.next) : null;
  next?.catch(() => {});  // handled when awaited
  const body = document.querySelector("#events tbody");
  for (const event of page.events) document.getElementById(`event-${event.eventId}`)?.remove();  // placed live meanwhile
  // Before the live rows shown at the end while they wait for their page (appended after them, a
  // page's rows were out of order, and a waiting row then placed itself before a later page's).
  const tail = waitingTail(body);
  for (const event of page.events) {
    if (state.fleet.events[event.eventId] === null) continue;  // ended meanwhile
    state.fleet.events[event.eventId] = event;
    body.insertBefore(eventRow(event), tail);
  }
  state.frontier = page.next;
  // Live events past the old frontier that this page did not bring (they came after the server
  // answered it): their place is loaded now.
  for (const [id, event] of state.waiting) if (loaded(event)) { state.waiting.delete(id); placeEventRow(event); }
  if (next) setTimeout(() => moreEvents(generation, next));
  else {
    state.filling = false;
    for (const [id, event] of Object.entries(state.fleet.events)) if (event === null) delete state.fleet.events[id];
    body.dataset.complete = String(Math.round(performance.now()));
  }
}

// The first of the rows at the end of the table that wait for their page (state.waiting), or null:
// they are always the last rows, so the rows loaded before them stay in order.
function waitingTail(body) {
  let tail = null;
  for (let row = body.lastElementChild; row && state.waiting.has(row.id.slice("event-".length)); row = row.previousElementSibling) tail = row;
  return tail;
}

// An event's place in the table: NotBefore (none, i.e. Started: first), then its id; the server's
// order (fleet_pages.sort_key) and its cursor "<epoch>~<id>".
function sortKey(event) {
  const at = Date.parse(event.notBefore || "");
  return [Number.isNaN(at) ? 0 : at / 1000, event.eventId];
}

function before(a, b) {
  return a[0] < b[0] || (a[0] === b[0] && a[1] <= b[1]);
}

function loaded(event) {
  if (state.frontier === null) return true;
  const cut = state.frontier.indexOf("~");
  return before(sortKey(event), [Number(state.frontier.slice(0, cut)), state.frontier.slice(cut + 1)]);
}

function renderCounts() {
  const counts = state.fleet.counts;
  document.getElementById("counts").textContent = `${counts.vms} VMs · ${counts.openEvents} open events · ${counts.silent} silent`;
  document.getElementById("no-events").hidden = counts.openEvents > 0 || document.querySelector("#events tbody").children.length > 0;
}

// One event changed: its row alone is replaced, added (in NotBefore order) or removed. Redrawing
// the whole table for each record took seconds in a 10 000-VM wave (bench/console_bench.py).
function placeEventRow(event) {
  const body = document.querySelector("#events tbody");
  const old = document.getElementById(`event-${event.eventId}`);
  if (event.outcome || !matchesSearch(event)) {
    if (old) old.remove();
    state.waiting.delete(event.eventId);
    // Ended while the pages load: a later page must not bring it back.
    if (state.filling) state.fleet.events[event.eventId] = null; else delete state.fleet.events[event.eventId];
  } else {
    state.fleet.events[event.eventId] = event;
    if (old) old.remove();
    state.waiting.delete(event.eventId);
    if (!loaded(event)) {
      // Shown now, at the end of what is loaded (a person must not wait for the table to fill: 20 000
      // rows take seconds); put in its place when its page is loaded (or brought by that page).
      state.waiting.set(event.eventId, event);
      body.append(eventRow(event));  // with the other waiting rows, at the end
    } else {
      const key = sortKey(event);
      const next = [...body.children].find((row) => !before(JSON.parse(row.dataset.key), key));
      body.insertBefore(eventRow(event), next || null);
    }
  }
  renderCounts();
}

// The search box filters the open events too (issue 33): by id, type, status, source or a VM named.
function matchesSearch(event) {
  const wanted = document.getElementById("search").value.trim().toLowerCase();
  if (!wanted) return true;
  return [event.eventId, event.eventType, event.eventStatus, event.eventSource || "", ...event.resources]
    .some((text) => String(text).toLowerCase().includes(wanted));
}

// DurationInSeconds as IMDS gives it: -1 or absent when the platform does not say.
function duration(seconds) {
  if (seconds == null || seconds < 0) return "not given";
  if (seconds < 120) return `${seconds} s`;
  return seconds < 7200 ? `${Math.round(seconds / 60)} min` : `${(seconds / 3600).toFixed(1)} h`;
}

function eventRow(event) {
  const starts = el("td");
  if (event.eventStatus === "Scheduled") countdown(starts, event.notBefore);
  else starts.textContent = event.eventStatus;
  const prepared = Object.values(event.preparations).filter((r) => r === "prepared").length;
  const action = el("td");
  // Not once it is approved: the Approved column said "approved" while the button stayed for ~5 s.
  if (event.eventStatus === "Scheduled" && !event.approved && state.me && state.me.canApprove) {
    const button = el("button", { type: "button", class: "danger", "data-event": event.eventId, text: "Approve…" });
    button.addEventListener("click", () => openApprove(event, "approve"));
    action.append(button);
  }
  const pending = state.pending.get(event.eventId);
  const approved = el("td", { class: "approved", text: event.approved ? `approved${event.approvedBy ? " by " + event.approvedBy : ""}` : pending || "" });
  return el("tr", { id: `event-${event.eventId}`, "data-status": event.eventStatus, "data-key": JSON.stringify(sortKey(event)) },
    el("td", {}, el("a", { href: `/events/${event.eventId}`, text: event.eventId.slice(0, 8) })),
    el("td", { text: event.eventType }), el("td", { text: event.eventSource || "" }),
    el("td", { class: "status", text: event.eventStatus }), starts,
    el("td", { class: "duration", text: duration(event.durationInSeconds) }),
    el("td", { class: "names" }, ...event.resources.flatMap((name, i) => [...(i ? [", "] : []), el("span", { class: "name", text: name })])),
    el("td", { text: `${prepared}/${event.resources.length}` }), approved, action);
}

// The VM groups as the server counted them; a group's list is there when it is shown open (the
// person opened it, or few VMs need a look in all); opening another asks the server for its list.
function renderGroups() {
  const now = Date.now() / 1000;
  const sections = state.fleet.groups.map((group) => {
    const open = group.listed && !state.closedGroups.has(group.name);
    const details = el("details", open ? { open: "" } : {},
      el("summary", { text: `${group.name} · ${group.vms} VMs${group.toLook ? ` · ${group.toLook} to look at` : ""}` }));
    if (group.listed) {
      const list = el("ul", { class: "vms" });
      for (const vm of group.listed) list.append(vmItem(vm, now));
      details.append(list);
    }
    details.addEventListener("toggle", () => {
      if (details.open) {
        state.closedGroups.delete(group.name);
        if (!group.listed) { state.openGroups.add(group.name); refreshFleet(); }
      } else {
        state.openGroups.delete(group.name);
        state.closedGroups.add(group.name);
      }
    });
    return details;
  });
  if (state.fleet.groupsOmitted) sections.push(el("p", { class: "quiet", text: `${state.fleet.groupsOmitted} more groups: search to narrow` }));
  document.getElementById("groups").replaceChildren(...sections);
}

// The counts and groups again (not the events: those are live): every 2 s, since silence is an
// absence no message announces.
let refreshing = false;
async function refreshFleet() {
  if (refreshing || !state.fleet) return;
  refreshing = true;
  try {
    const fresh = await api(`/api/fleet?${fleetQuery({ events: 0 })}`);
    state.fleet.groups = fresh.groups;
    state.fleet.groupsOmitted = fresh.groupsOmitted;
    state.fleet.silentAfter = fresh.silentAfter;
    state.fleet.counts = { ...fresh.counts };
    renderCounts();
    renderGroups();
  } finally {
    refreshing = false;
  }
}

function vmItem(vm, now) {
  const silent = now - vm.lastSeen > state.fleet.silentAfter;
  const item = el("li", { id: `vm-${vm.name}`, class: silent ? "silent" : "" }, el("strong", {}, vmLink(vm.name)));
  if (vm.unwatched && vm.unwatched.length) {
    item.classList.add("silent");
    item.append(el("span", { class: "flag", text: " no agent reported its maintenance (Azure's channel)" }));
  } else if (silent) item.append(el("span", { class: "flag", text: ` agent silent (last heard ${ago(vm.lastSeen - now)})` }));
  for (const id of vm.events) {
    const event = state.fleet.events[id];
    item.append(" ", el("a", { href: `/events/${id}`, class: "chip", text: event ? `${event.eventType} ${event.eventStatus}` : id.slice(0, 8) }));
  }
  return item;
}

// -- the event page -----------------------------------------------------------------------------

function eventId() {
  return decodeURIComponent(location.pathname.split("/").pop());
}

async function loadEvent() {
  try {
    state.event = await api(`/api/events/${encodeURIComponent(eventId())}`);
  } catch (error) {
    if (error.status !== 404) throw error;
    // A link followed before the console read the event (an alert is often faster than the records):
    // said so, and drawn when the event's first record arrives (onEventMessage), not a dead page.
    state.event = null;
    document.getElementById("summary").replaceChildren(el("p", { class: "status", id: "event-status", text: "Not known to the console yet: this page fills in as soon as an agent or Azure reports the event." }));
    document.getElementById("decision").hidden = true;
    return;
  }
  renderEvent();
}

function renderEvent() {
  const e = state.event;
  const starts = el("span");
  if (e.eventStatus === "Scheduled" && e.open) countdown(starts, e.notBefore);
  document.getElementById("summary").replaceChildren(
    el("h2", { text: `${e.eventType} ${e.eventId}` }),
    el("p", { class: "status", id: "event-status", text: e.open ? e.eventStatus : `${e.outcome} (${e.eventStatus} when last seen)` }),
    el("p", { text: `${e.eventSource || ""} · VMs: ${e.resources.join(", ")} · duration ${duration(e.durationInSeconds)} · ${e.description || ""}` }),
    e.eventStatus === "Scheduled" ? el("p", {}, "Starts ", starts) : el("p", { text: `Started at ${when(e.startedAt)}` }),
    el("p", { id: "event-approved", text: e.approved ? `approved by ${e.approvedBy || "?"} at ${when(e.approvedAt)}` : "not approved" }));
  const decision = document.getElementById("decision");
  decision.hidden = !(e.open && e.eventStatus === "Scheduled" && state.me && state.me.canApprove);
  const last = (e.sent || []).at(-1);
  if (last) {
    const audit = e.audits.find((a) => a.decisionId === last.decisionId && a.component !== "agent");
    const text = audit
      ? `${last.action} by ${last.issuedBy || "?"}: ${audit.outcome} by the approvers${audit.reason ? " (" + audit.reason + ")" : ""}`
      : sentState(last, Date.now() / 1000);
    document.getElementById("decision-state").textContent = text;
  }
  fill("#timeline tbody", e.timeline, (t) => [when(t.at), vmLink(t.vm), t.change, t.eventStatus || "(gone)", String(t.incarnation ?? "")]);
  fill("#preparations tbody", e.preparationRecords, (p) => [when(p.at), vmLink(p.vm), p.result, p.hook ? `${p.hook.result} (exit ${p.hook.exitCode})` : "no hook"]);
  fill("#audits tbody", e.audits, (a) => [when(a.at), a.issuedBy || "", a.component, a.path || "", a.outcome, [a.decisionReason, a.reason].filter(Boolean).join(" · "), a.detail || ""]);
}

function fill(selector, rows, cells) {
  const body = document.querySelector(selector);
  if (!rows.length) {  // an empty table says so (issue 33)
    const columns = body.closest("table").querySelectorAll("thead th").length || 1;
    body.replaceChildren(el("tr", { class: "none" }, el("td", { colspan: String(columns), text: "none yet" })));
    return;
  }
  body.replaceChildren(...rows.map((row) => el("tr", {}, ...cells(row).map((cell) => cell instanceof Node ? el("td", {}, cell) : el("td", { text: cell })))));
}

// A VM's name as a link to the fleet page searched for it: its events and its state (issue 33).
function vmLink(name) {
  return name ? el("a", { href: `/?q=${encodeURIComponent(name)}`, text: name }) : "";
}

// -- approving ----------------------------------------------------------------------------------

let approving = null;

function openApprove(event, action) {
  approving = { event, action };
  const dialog = document.getElementById("approve");
  document.getElementById("approve-title").textContent = action === "approve" ? "Approve" : "Decline";
  document.getElementById("approve-event").textContent = `${event.eventType} ${event.eventId} (${event.eventStatus})`;
  document.getElementById("approve-reason").value = "";
  document.getElementById("approve-error").textContent = "";
  document.getElementById("approve-step1").hidden = false;
  document.getElementById("approve-step2").hidden = true;
  // The VMs as the target's own agent reported the event: what approving through it releases.
  document.getElementById("approve-vms").replaceChildren(...event.releases.map((name) => el("li", { text: name })));
  document.getElementById("approve-confirm").textContent = action === "approve" ? `Approve now: release ${event.releases.length} VM(s)` : "Decline: let the platform decide";
  // Issue 33: the Decline confirmation said what Approve does. A decline releases nothing: it records
  // the person's no, and the platform starts the event at its NotBefore.
  const what = document.getElementById("approve-what");
  if (action === "approve") {
    what.replaceChildren("This releases the maintenance on ", el("strong", { text: "every" }), " one of these VMs, now:");
  } else {
    what.replaceChildren("This releases nothing. It records that you said no; the platform still starts the event on these VMs at its NotBefore:");
  }
  dialog.showModal();
}

function wireDialog() {
  const dialog = document.getElementById("approve");
  if (!dialog) return;
  document.getElementById("approve-cancel").addEventListener("click", () => dialog.close());
  document.getElementById("approve-back").addEventListener("click", () => {
    document.getElementById("approve-step1").hidden = false;
    document.getElementById("approve-step2").hidden = true;
  });
  document.getElementById("approve-next").addEventListener("click", () => {
    if (!document.getElementById("approve-reason").value.trim()) {
      document.getElementById("approve-error").textContent = "A reason is required.";
      return;
    }
    document.getElementById("approve-error").textContent = "";
    document.getElementById("approve-step1").hidden = true;
    document.getElementById("approve-step2").hidden = false;
  });
  document.getElementById("approve-confirm").addEventListener("click", submitDecision);
}

async function submitDecision() {
  const { event, action } = approving;
  const target = event.target;
  try {
    const answer = await api("/api/decisions", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": state.me.csrf },
      body: JSON.stringify({ eventId: event.eventId, target, action, reason: document.getElementById("approve-reason").value, confirm: event.releases }),
    });
    const waiting = sentState(answer, Date.now() / 1000);
    state.pending.set(event.eventId, waiting);
    document.getElementById("approve").close();
    showDecisionState(event.eventId, waiting);
    // Issue 33: a decision no approver answers must not look like "waiting" for ever.
    setTimeout(() => {
      if (state.pending.get(event.eventId) !== waiting) return;
      const silent = `${action} sent, but no approver has answered in ${NO_VERDICT_SECONDS} s: are the approvers running, and do they hold this console's key?`;
      state.pending.set(event.eventId, silent);
      showDecisionState(event.eventId, silent);
    }, NO_VERDICT_SECONDS * 1000);
  } catch (error) {
    document.getElementById("approve-error").textContent = error.message;
  }
}

// What one of this console's decisions waits for, or its verdict (issue 33: an approval nobody can
// carry out looked like "waiting" for ever). `sent` is what the console answered on publishing and
// lists on the event page: answered or not, and whether any agent of the event is reporting.
function sentState(sent, now) {
  const what = `${sent.action} sent at ${when(sent.at)}`;
  if (sent.answered) return "";  // the verdict: the audit line (live) or the audit table (page)
  if (!sent.anyAgentReporting) {
    const silent = sent.agentsSilent.length ? ` (silent: ${sent.agentsSilent.join(", ")})` : "";
    return `${what}: waiting for an agent. No agent of this event is reporting${silent}; the approvers retry until the decision expires at ${when(sent.expires)}, or acknowledge it through Azure if they run with --arm. Otherwise the event starts at its NotBefore.`;
  }
  if (now - sent.at >= NO_VERDICT_SECONDS) {
    return `${what}, but no approver has answered in ${Math.round(now - sent.at)} s: are the approvers running, and do they hold this console's key?`;
  }
  return `${what} (decision ${sent.decisionId.slice(8, 16)}), waiting for the approver`;
}

function showDecisionState(id, text) {
  const row = document.querySelector(`#event-${CSS.escape(id)} .approved`);
  if (row) row.textContent = text;
  const stateNode = document.getElementById("decision-state");
  if (stateNode && state.event && state.event.eventId === id) stateNode.textContent = text;
}

// -- the history page ---------------------------------------------------------------------------

async function loadHistory() {
  const days = document.getElementById("days").value;
  const group = document.getElementById("hgroup").value;
  const history = await api(`/api/history?days=${days}&group=${encodeURIComponent(group)}`);
  const max = Math.max(1, ...history.days.map(([, types]) => Object.values(types).reduce((a, b) => a + b, 0)));
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${Math.max(1, history.days.length) * 24} 120`);
  history.days.forEach(([day, types], i) => {
    const total = Object.values(types).reduce((a, b) => a + b, 0);
    const bar = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const height = (total / max) * 100;
    for (const [k, v] of Object.entries({ x: i * 24 + 4, y: 110 - height, width: 16, height })) bar.setAttribute(k, v);
    const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
    title.textContent = `${day}: ${Object.entries(types).map(([t, n]) => `${n} ${t}`).join(", ")}`;
    bar.append(title);
    svg.append(bar);
  });
  // Axes (issue 33: bars without values): the scale at the left, the first and last day below.
  const label = (x, y, text, anchor = "start") => {
    const t = document.createElementNS("http://www.w3.org/2000/svg", "text");
    for (const [k, v] of Object.entries({ x, y, "text-anchor": anchor, class: "axis" })) t.setAttribute(k, v);
    t.textContent = text;
    svg.append(t);
  };
  const width = Math.max(1, history.days.length) * 24;
  svg.setAttribute("viewBox", `-28 -4 ${width + 32} 136`);
  label(-4, 12, String(max), "end");
  label(-4, 110, "0", "end");
  if (history.days.length) {
    label(0, 128, history.days[0][0]);
    if (history.days.length > 1) label(width, 128, history.days.at(-1)[0], "end");
  }
  document.getElementById("chart").replaceChildren(svg);
  const n = history.noticeSeconds, l = history.approvalLeadSeconds;
  document.getElementById("spread").textContent =
    `Notice given (Scheduled → Started): median ${n.p50 ?? "–"} s over ${n.n} events · approved ahead of NotBefore: median ${l.p50 ?? "–"} s over ${l.n}`;
  fill("#closed tbody", history.events.slice().reverse(), (h) => [when(h.endedAt), el("a", { href: `/events/${encodeURIComponent(h.eventId)}`, text: h.eventId.slice(0, 8) }), h.eventType, h.outcome || "", h.noticeSeconds == null ? "" : `${h.noticeSeconds} s`, h.approvalLeadSeconds == null ? "" : `${h.approvalLeadSeconds} s`, h.approvedBy || ""]);
}

// -- live ---------------------------------------------------------------------------------------

// The live stream, opened while the page asks for its data (issue 33: a record read between the
// page's first answer and the stream's opening was never shown; waiting for the stream before asking
// cost the first frame 50-80 ms). The stream's first message, hello, says how many messages the
// console had announced when it opened; an answer says how many it holds (`changes`). Hello above
// the answer's count: something fell between the two, and the data is loaded again (onReopen). So
// is everything after a break (the console restarted, or dropped a page that could not keep up).
// Messages wait until the data is loaded (start()). A page whose data carries no count (the event
// and history pages) waits for the stream to open before asking (`open`).
function follow(onMessage, onReopen) {
  const live = document.getElementById("live");
  const source = new EventSource("/api/stream");
  const held = [];
  let loaded = null;  // the loaded data's count, once loaded (-1: the data carries none)
  let opened = null;  // the first connection's hello count
  source.onmessage = (message) => {
    const data = JSON.parse(message.data);
    if (data.type === "hello") {
      if (opened === null) {
        opened = data.changes;
        if (loaded !== null && loaded >= 0 && opened > loaded) onReopen();
        else if (loaded === -1) onReopen();  // the stream came after the 3 s wait
      } else if (loaded !== null) {
        onReopen();  // opened again after a break
      }
      return;
    }
    if (loaded !== null) onMessage(data); else held.push(data);
  };
  source.onerror = () => live.classList.remove("on");
  const open = new Promise((resolve) => {
    source.onopen = () => { live.classList.add("on"); resolve(); };
    setTimeout(resolve, 3000);  // no stream: the page loads anyway, its live dot off
  });
  return {
    open,
    start(changes) {
      loaded = changes === undefined ? -1 : changes;
      if (opened !== null && loaded >= 0 && opened > loaded) onReopen();
      for (const data of held.splice(0)) onMessage(data);
    },
  };
}

function onFleetMessage(message) {
  const fleet = state.fleet;
  if (!fleet) return;
  // A heartbeat or a record ("vm"): the groups and counts follow at the next refresh (every 2 s).
  if (message.type === "event") {
    placeEventRow(message.event);
  } else if (message.type === "audit") {
    for (const id of message.eventIds) {
      if (message.audit.component === "approver" || message.audit.component === "coordinator") {
        // The approvers' verdict, whatever it is (approved, refused and why, failed, expired).
        const verdict = `${message.audit.outcome} by the approvers${message.audit.reason ? " (" + message.audit.reason + ")" : ""}`;
        state.pending.set(id, verdict);
        showDecisionState(id, verdict);
        // Approved: the row loses its Approve… button now, not when the event's next record comes.
        if (message.audit.outcome === "approved" && fleet.events[id]) {
          fleet.events[id] = { ...fleet.events[id], approved: true, approvedBy: fleet.events[id].approvedBy || message.audit.issuedBy };
        }
      }
      if (fleet.events[id]) placeEventRow(fleet.events[id]);
    }
  }
}

function onEventMessage(message) {
  const id = (state.event ? state.event.eventId : eventId()).toUpperCase();  // not known yet: the address's
  const mine = (message.type === "event" && message.event.eventId.toUpperCase() === id) || (message.type === "audit" && message.eventIds.some((e) => e.toUpperCase() === id));
  if (mine) scheduleRender(loadEvent);
}

let renderQueued = null;
function scheduleRender(render) {
  if (renderQueued) return;
  renderQueued = setTimeout(() => { renderQueued = null; render(); }, 100);  // a burst of records: one render
}

// -- start ----------------------------------------------------------------------------------------

async function start() {
  const me = loadMe();
  wireDialog();
  const page = document.body.dataset.page;
  if (page !== "fleet") await me;
  if (page === "fleet") {
    const asked = new URLSearchParams(location.search).get("q");
    if (asked) document.getElementById("search").value = asked;  // a VM link from another page
    document.getElementById("search").addEventListener("input", () => scheduleRender(loadFleet));
    document.getElementById("group").addEventListener("change", () => {
      state.openGroups.clear();
      state.closedGroups.clear();
      refreshFleet();
    });
    const live = follow(onFleetMessage, () => loadFleet());
    await loadFleet(me);
    performance.mark("se:data-drawn");  // bench/console_bench.py reads it
    live.start(state.fleet.changes);
    setInterval(tickOnScreen, 1000);
    setInterval(refreshFleet, 2000);
  } else if (page === "event") {
    document.getElementById("event-approve").addEventListener("click", () => openApprove(state.event, "approve"));
    document.getElementById("event-decline").addEventListener("click", () => openApprove(state.event, "decline"));
    const live = follow(onEventMessage, () => scheduleRender(loadEvent));
    await live.open;
    await loadEvent();
    live.start();
    setInterval(tickOnScreen, 1000);
  } else if (page === "history") {
    document.getElementById("days").addEventListener("change", loadHistory);
    document.getElementById("hgroup").addEventListener("change", loadHistory);
    const live = follow(() => scheduleRender(loadHistory), () => scheduleRender(loadHistory));
    await live.open;
    await loadHistory();
    live.start();
  }
  document.body.dataset.ready = "true";
  // When the first frame with the data was painted (bench/console_bench.py reads it): a frame, then
  // a task after it; an upper bound, since the first chunk of later rows may run before it.
  requestAnimationFrame(() => setTimeout(() => { document.body.dataset.painted = String(Math.round(performance.now())); }));
}

start().catch((error) => {
  document.body.replaceChildren(el("p", { class: "error", text: `The console cannot load: ${error.message}` }));
});
