// The console: tabs by URL hash, figures polled every few seconds from /admin/api.
"use strict";

const REFRESH_MS = 2000;
const SESSIONS_PER_PAGE = 50;
const SEARCH_DELAY_MS = 300;
const PAGES = ["overview", "cache", "sessions", "config"];
const CHANNELS = { feishu: "Feishu", api: "API", web: "Web" };
const SHARE = { unit: "%", yMax: 1, format: (v) => (v * 100).toFixed(0) };
let openSession = null;
let sessionOffset = 0;

const $ = (selector) => document.querySelector(selector);

async function api(path, options = {}) {
  const response = await fetch(`/admin/api${path}`, options);
  if (response.status === 401) {
    location.href = "/admin/login";
    throw new Error("logged out");
  }
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.status === 204 ? null : response.json();
}

const number = (v, digits = 0) => (v ?? 0).toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: digits });
const percent = (v) => `${number((v ?? 0) * 100, 1)} %`;
const ms = (v) => `${number(v, v < 10 ? 1 : 0)} ms`;
const when = (iso) => new Date(iso).toLocaleString();

// As mail clients write it: the time today, the day this year, the date before.
function compactDate(iso) {
  const date = new Date(iso), now = new Date();
  if (date.toDateString() === now.toDateString()) return date.toLocaleTimeString([], { hour: "numeric", minute: "2-digit" });
  if (date.getFullYear() === now.getFullYear()) return date.toLocaleDateString([], { month: "short", day: "numeric" });
  return date.toLocaleDateString([], { dateStyle: "short" });
}

function cell(text, className = "", title = text) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  td.title = title;
  return td;
}

const dateCell = (iso) => cell(compactDate(iso), "when", when(iso));

function figures(container, items) {
  container.replaceChildren(...items.map(([label, value, note]) => {
    const box = document.createElement("div");
    box.className = "figure";
    box.dataset.figure = label;
    box.innerHTML = '<div class="label"></div><div class="value"></div><div class="note"></div>';
    box.querySelector(".label").textContent = label;
    box.querySelector(".value").textContent = value;
    box.querySelector(".note").textContent = note ?? "";
    return box;
  }));
}

function last(values) { return values.length ? values[values.length - 1] : 0; }

// How chat platforms' events reach the app: "Feishu: connected, last event 14:02:11".
function renderTransports(transports) {
  const box = $("#transports");
  const parts = Object.entries(transports).map(([name, transport]) => {
    const seen = transport.last_event_at ? `last event ${when(transport.last_event_at)}` : "no event yet";
    const title = name.charAt(0).toUpperCase() + name.slice(1);
    return transport.state === "off" ? `${title}: off` : `${title}: ${transport.state}, ${seen}`;
  });
  box.textContent = parts.join(" · ");
  box.classList.toggle("bad", Object.values(transports).some((transport) => !transport.ready));
}

// A session whose chat was deleted has no channel.
const channelName = (channel) => (channel === null ? "—" : CHANNELS[channel] ?? channel);

// "Feishu 12 · API 3": the sessions stored, per channel.
function channelCounts(byChannel) {
  const counts = Object.entries(byChannel).map(([channel, count]) => `${channelName(channel)} ${number(count)}`);
  return counts.length ? counts.join(" · ") : "none yet";
}

function renderOverview(stats, history) {
  const engine = stats.engine, kv = engine.kv_cache, activity = engine.activity, turns = stats.turns;
  const drafts = activity.draft_tokens;
  figures($("#overview-figures"), [
    ["Requests / s", number(last(history.requests_per_s), 2), `${number(turns.total)} turns in all`],
    ["TTFT p50", ms(turns.ttft_p50_ms), `p99 ${ms(turns.ttft_p99_ms)}, last 1,000 turns`],
    ["Tokens / s", number(activity.generation_tokens_per_s, 1), `generated, last minute; ${percent(drafts.proposed ? drafts.accepted / drafts.proposed : 0)} of draft tokens accepted`],
    ["Batch size", number(activity.batch_size.mean, 1), `max ${activity.batch_size.max}, last minute`],
    ["KV-pool use", percent(kv.usage), `${number(kv.blocks_used)} of ${number(kv.blocks_total)} blocks`],
    ["Prefix-cache hit rate", percent(kv.prefix_hit_rate), `${number(kv.prefix_hit_tokens)} tokens reused`],
    ["Requests waiting", number(engine.requests.waiting), `${engine.requests.running} running`],
    ["Sessions", number(stats.sessions.stored), channelCounts(stats.sessions.by_channel)],
  ]);
  const t = history.time;
  lineChart($("#chart-requests"), t, [{ name: "requests", color: "accent", values: history.requests_per_s }], { unit: "req/s", format: (v) => v.toFixed(2) });
  lineChart($("#chart-tokens"), t, [{ name: "generated", color: "ok", values: history.tokens_per_s }], { unit: "tokens/s" });
  lineChart($("#chart-ttft"), t, [
    { name: "p50", color: "accent", values: history.ttft_p50_ms },
    { name: "p99", color: "warn", values: history.ttft_p99_ms },
  ], { unit: "ms", format: (v) => v.toFixed(0) });
  lineChart($("#chart-kv"), t, [
    { name: "KV-pool use", color: "violet", values: history.kv_usage },
    { name: "prefix-cache hit rate", color: "ok", values: history.prefix_hit_rate },
  ], SHARE);
}

function renderCacheFigures(stats, history) {
  const cache = stats.cache, turns = stats.turns, levels = turns.by_level;
  const share = (n) => (turns.total ? n / turns.total : 0);
  figures($("#cache-figures"), [
    ["Hit rate", percent(cache.hit_rate), `${number(cache.hits_exact + cache.hits_semantic)} of ${number(cache.hits_exact + cache.hits_semantic + cache.misses)} lookups`],
    ["Exact hits", number(cache.hits_exact), `${percent(share(levels.exact))} of turns`],
    ["Semantic hits", number(cache.hits_semantic), `${percent(share(levels.semantic))} of turns`],
    ["Merged", number(levels.merged), `${percent(share(levels.merged))} of turns`],
    ["Entries", number(cache.entries), `capacity ${number(cache.capacity)}`],
    ["Evictions", number(cache.evictions), `${number(cache.expired)} expired`],
    ["Skipped (PII)", number(cache.skipped_pii), "never cached"],
    ["Lookup p50", ms(cache.lookup_ms_p50), `p99 ${ms(cache.lookup_ms_p99)}, ${number(cache.over_budget)} over budget, ${number(cache.outrun)} outrun by the model`],
  ]);
  lineChart($("#chart-hits"), history.time, [
    { name: "exact", color: "ok", values: history.hit_rate_exact },
    { name: "semantic", color: "accent", values: history.hit_rate_semantic },
    { name: "merged", color: "violet", values: history.hit_rate_merged },
  ], SHARE);
  lineChart($("#chart-entries"), history.time, [{ name: "entries", color: "accent", values: history.cache_entries }], { unit: "entries", format: (v) => v.toFixed(0) });
}

async function renderCacheTables() {
  const query = encodeURIComponent($("#cache-query").value);
  const [top, entries] = await Promise.all([api("/cache/entries?order=hits&limit=10"), api(`/cache/entries?q=${query}&limit=100`)]);
  $("#top-entries tbody").replaceChildren(...top.filter((e) => e.hits > 0).map((entry) => {
    const row = document.createElement("tr");
    row.append(cell(entry.question), cell(number(entry.hits), "num"));
    return row;
  }));
  $("#cache-entries tbody").replaceChildren(...entries.map((entry) => {
    const row = document.createElement("tr");
    const remove = document.createElement("button");
    remove.className = "link";
    remove.textContent = "Delete";
    remove.onclick = async () => { await api(`/cache/entries/${entry.id}`, { method: "DELETE" }); refresh(); };
    const actions = document.createElement("td");
    actions.append(remove);
    row.append(cell(entry.question), cell(entry.answer), cell(number(entry.hits), "num"), dateCell(entry.last_used_at), actions);
    return row;
  }));
}

// Rows are rebuilt only when they change, so a refresh never pulls a row from under the pointer.
let shownSessions = "";
// Listings are numbered: one that answers after a later one (the filter changed meanwhile) is dropped.
let sessionListings = 0;

function sessionQuery() {
  const query = new URLSearchParams({ limit: SESSIONS_PER_PAGE, offset: sessionOffset });
  const filters = { q: $("#session-query").value.trim(), channel: $("#session-channel").value, state: $("#session-state").value };
  for (const [name, value] of Object.entries(filters)) if (value) query.set(name, value);
  return query;
}

async function renderSessions(kept) {
  const listing = ++sessionListings;
  const list = await api(`/sessions?${sessionQuery()}`);
  if (listing !== sessionListings) return;
  $("#sessions-title").textContent = `Sessions (${number(list.active)} active, ${number(list.total)} in all)`;
  $("#assistant-counts").textContent = `Assistant: ${number(kept.memories)} memories of ${number(kept.owners)} people · `
    + `${number(kept.reminders)} reminders · ${number(kept.prompts)} scheduled prompts`;
  const shown = list.sessions.length;
  $("#sessions-range").textContent = shown
    ? `${number(sessionOffset + 1)}–${number(sessionOffset + shown)} of ${number(list.matching)}`
    : `none of ${number(list.matching)}`;
  $("#sessions-previous").disabled = sessionOffset === 0;
  $("#sessions-next").disabled = sessionOffset + shown >= list.matching;
  const signature = JSON.stringify([list.sessions, openSession]);
  if (signature !== shownSessions) renderSessionRows(list.sessions);
  shownSessions = signature;
  if (openSession !== null) renderSession(await api(`/sessions/${openSession}`));
}

function renderSessionRows(sessions) {
  $("#session-list tbody").replaceChildren(...sessions.map((session) => {
    const row = document.createElement("tr");
    row.className = "clickable" + (session.id === openSession ? " selected" : "");
    row.onclick = async () => {
      openSession = session.id;
      await refresh();
      $("#session-detail").scrollIntoView({ block: "nearest" });  // below the list on a phone
    };
    row.append(
      cell(session.key),
      cell(channelName(session.channel)),
      cell(session.state),
      cell(number(session.turns), "num"),
      cell(number(session.compressions), "num"),
      dateCell(session.last_active_at),
    );
    return row;
  }));
}

function renderSession(detail) {
  const box = $("#session-detail"), session = detail.summary;
  const title = document.createElement("h2");
  title.textContent = session.key;
  const facts = document.createElement("p");
  facts.className = "muted";
  facts.textContent = `${session.turns} turns · ${session.messages} messages · ${number(detail.context_tokens)} tokens in context · ${session.compressions} compressions · ${session.state}`;
  const turns = detail.messages.map((message) => {
    const item = document.createElement("div");
    item.className = `turn ${message.role}${message.in_context ? "" : " out"}`;
    const meta = document.createElement("div");
    meta.className = "meta";
    meta.textContent = `#${message.seq} · turn ${message.turn_index} · ${message.role} · ${message.tokens} tokens${message.in_context ? "" : " · compressed away"}`;
    const text = document.createElement("div");
    text.className = "text";
    text.textContent = message.text;
    item.append(meta, text);
    return item;
  });
  box.replaceChildren(title, facts, ...turns);
}

async function renderConfig() {
  const config = await api("/config");
  $("#config-body").replaceChildren(...Object.entries(config).map(([section, values]) => {
    const box = document.createElement("div");
    box.className = "config-section";
    const heading = document.createElement("h3");
    heading.textContent = section;
    const table = document.createElement("table");
    for (const [key, value] of Object.entries(values)) {
      const row = table.insertRow();
      row.append(cell(key), cell(typeof value === "object" ? JSON.stringify(value) : String(value)));
    }
    box.append(heading, table);
    return box;
  }));
}

function currentPage() {
  const page = location.hash.slice(1);
  return PAGES.includes(page) ? page : "overview";
}

async function refresh() {
  const page = currentPage();
  for (const name of PAGES) document.getElementById(name).classList.toggle("active", name === page);
  for (const link of document.querySelectorAll("#tabs a")) link.classList.toggle("active", link.hash === `#${page}`);
  try {
    const [stats, history] = await Promise.all([api("/stats"), api("/history")]);
    const size = stats.engine.num_parameters ? ` (${number(stats.engine.num_parameters / 1e6, 0)}M parameters)` : "";
    $("#model").textContent = `${stats.engine.model}${size} on ${stats.engine.device}`;
    $("#demo-warning").hidden = !stats.engine.is_demo_model;
    renderTransports(stats.transports);
    if (page === "overview") renderOverview(stats, history);
    if (page === "cache") { renderCacheFigures(stats, history); await renderCacheTables(); }
    if (page === "sessions") await renderSessions(stats.assistant);
    if (page === "config") await renderConfig();
    $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("#updated").textContent = `update failed: ${error.message}`;
  }
}

function showSessionsFrom(offset) {
  sessionOffset = offset;
  refresh();
}

let searchTimer;
$("#session-query").addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => showSessionsFrom(0), SEARCH_DELAY_MS);
});
$("#session-filters").addEventListener("submit", (event) => {
  event.preventDefault();
  clearTimeout(searchTimer);
  showSessionsFrom(0);
});
for (const select of ["#session-channel", "#session-state"]) $(select).addEventListener("change", () => showSessionsFrom(0));
$("#sessions-previous").addEventListener("click", () => showSessionsFrom(Math.max(0, sessionOffset - SESSIONS_PER_PAGE)));
$("#sessions-next").addEventListener("click", () => showSessionsFrom(sessionOffset + SESSIONS_PER_PAGE));
$("#cache-search").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
$("#cache-flush").addEventListener("click", async () => {
  if (!confirm("Delete every cache entry?")) return;
  await api("/cache/flush", { method: "POST" });
  refresh();
});
window.addEventListener("hashchange", refresh);
refresh();
setInterval(() => { if (currentPage() !== "config") refresh(); }, REFRESH_MS);
