// The local chat page: streamed replies with badges; the session lives in a cookie.
"use strict";

const log = document.getElementById("log");
const form = document.getElementById("composer");
const input = document.getElementById("text");
const send = document.getElementById("send");
const stop = document.getElementById("stop");
const BADGES_KEY = "clawdbot-chat-badges";
const QUESTION_MARGIN_PX = 12;
let answering = null; // the AbortController of the answer streaming now

function bubble(role, text = "") {
  const element = document.createElement("div");
  element.className = `msg ${role}`;
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  element.append(body);
  log.append(element);
  log.scrollTop = log.scrollHeight;
  return element;
}

function badgeRow(element, items) {
  const row = document.createElement("div");
  row.className = "badges";
  for (const [text, extra] of items) {
    const badge = document.createElement("span");
    badge.className = `badge ${extra}`;
    badge.textContent = text;
    row.append(badge);
  }
  element.append(row);
}

function addBadges(element, badges) {
  const items = [
    [`cache: ${badges.cache_level}`, `level-${badges.cache_level}`],
    [`TTFT ${badges.ttft_ms < 10 ? badges.ttft_ms.toFixed(1) : Math.round(badges.ttft_ms)} ms`, ""],
    [`${badges.prompt_tokens} prompt tokens (${badges.cached_tokens} cached)`, ""],
    [`${badges.completion_tokens} reply tokens`, ""],
  ];
  if (badges.compressed) items.push(["history compressed", ""]);
  badgeRow(element, items);
}

// The server keeps no badges with its history: this browser keeps them, each with its reply, in the
// conversation's order. A reload pairs them with the history's replies again and forgets the rest
// (their session was reset or closed meanwhile).
const savedBadges = () => JSON.parse(localStorage.getItem(BADGES_KEY) ?? "[]");
const saveBadges = (entries) => localStorage.setItem(BADGES_KEY, JSON.stringify(entries));

// A long answer scrolls the log only until its question reaches the top: the question stays in
// view while the answer streams on below it (the browser caps scrollTop at the bottom).
function follow(question) {
  log.scrollTop = question.offsetTop - QUESTION_MARGIN_PX;
}

async function errorMessage(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `HTTP ${response.status}`;
  }
}

// Server-sent events from a POST (EventSource only does GET): "event: NAME\ndata: JSON\n\n".
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const name = block.match(/^event: (.*)$/m)?.[1];
      const data = block.match(/^data: (.*)$/m)?.[1];
      if (name && data) yield [name, JSON.parse(data)];
    }
  }
}

async function ask(text, signal) {
  const question = bubble("user", text);
  const reply = bubble("assistant");
  const body = reply.querySelector(".body");
  follow(question);
  try {
    const response = await fetch("/chat/api/messages", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text }),
      signal,
    });
    if (!response.ok) {
      reply.remove();
      bubble("error", await errorMessage(response));
      return;
    }
    for await (const [name, data] of events(response)) {
      if (name === "delta") body.textContent += data.text;
      if (name === "done") {
        addBadges(reply, data);
        saveBadges([...savedBadges(), { reply: body.textContent, badges: data }]);
      }
      if (name === "error") { reply.remove(); bubble("error", data.message); }
      follow(question);
    }
  } catch (error) {
    if (!signal.aborted) throw error;
    // Leaving ends the turn on the server before it is stored: neither message is in the history.
    question.classList.add("stopped");
    reply.classList.add("stopped");
    badgeRow(reply, [["stopped: not kept", "stopped"]]);
  }
}

function showAnswering(streaming) {
  send.hidden = streaming;
  stop.hidden = !streaming;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = input.value.trim();
  if (!text || input.disabled || answering) return;
  input.value = "";
  answering = new AbortController();
  showAnswering(true);
  try {
    await ask(text, answering.signal);
  } catch (error) {
    bubble("error", `The connection failed: ${error.message}`);
  } finally {
    answering = null;
    showAnswering(false);
    input.focus();
  }
});

stop.addEventListener("click", () => answering.abort());

input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    form.requestSubmit();
  }
});

// While the session is being loaded or replaced, the composer waits: a message sent meanwhile
// would be shown before the history it follows, or cleared along with the old conversation.
// Those works take turns, and the composer stays locked until the last one ends: "New session"
// pressed while the history loads is not unlocked by the history's end, or a message sent then
// would be answered in the old session and wiped from view by the reset.
let composerWork = Promise.resolve();
let composerWaiting = 0;
function withComposerLocked(work) {
  composerWaiting += 1;
  input.disabled = true;
  composerWork = composerWork
    .then(work)
    .finally(() => {
      composerWaiting -= 1;
      if (composerWaiting > 0) return;
      input.disabled = false;
      input.focus();
    })
    .catch((error) => bubble("error", `The connection failed: ${error.message}`));
}

document.getElementById("new-session").addEventListener("click", () => withComposerLocked(async () => {
  answering?.abort();
  const response = await fetch("/chat/api/reset", { method: "POST" });
  if (!response.ok) { bubble("error", await errorMessage(response)); return; }
  log.replaceChildren();
  saveBadges([]);
}));

withComposerLocked(async () => {
  const response = await fetch("/chat/api/history");
  if (!response.ok) return;
  const saved = savedBadges(), kept = [];
  for (const message of (await response.json()).messages) {
    const element = bubble(message.role, message.text);
    const at = message.role === "assistant" ? saved.findIndex((entry) => entry.reply === message.text) : -1;
    if (at >= 0) {
      addBadges(element, saved[at].badges);
      kept.push(saved[at]);
      saved.splice(0, at + 1); // later replies pair with later entries only
    }
  }
  saveBadges(kept);
  log.scrollTop = log.scrollHeight; // down to the last reply's badges
});
