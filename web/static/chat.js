// The local chat page: streamed replies with badges; the session lives in a cookie.
"use strict";

const log = document.getElementById("log");
const form = document.getElementById("composer");
const input = document.getElementById("text");
const send = document.getElementById("send");

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

function addBadges(element, badges) {
  const row = document.createElement("div");
  row.className = "badges";
  const items = [
    [`cache: ${badges.cache_level}`, `level-${badges.cache_level}`],
    [`TTFT ${badges.ttft_ms < 10 ? badges.ttft_ms.toFixed(1) : Math.round(badges.ttft_ms)} ms`, ""],
    [`${badges.prompt_tokens} prompt tokens (${badges.cached_tokens} cached)`, ""],
    [`${badges.completion_tokens} reply tokens`, ""],
  ];
  if (badges.compressed) items.push(["history compressed", ""]);
  for (const [text, extra] of items) {
    const badge = document.createElement("span");
    badge.className = `badge ${extra}`;
    badge.textContent = text;
    row.append(badge);
  }
  element.append(row);
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

async function ask(text) {
  bubble("user", text);
  const reply = bubble("assistant");
  const body = reply.querySelector(".body");
  const response = await fetch("/chat/api/messages", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ text }),
  });
  if (!response.ok) {
    reply.remove();
    bubble("error", await errorMessage(response));
    return;
  }
  for await (const [name, data] of events(response)) {
    if (name === "delta") body.textContent += data.text;
    if (name === "done") addBadges(reply, data);
    if (name === "error") { reply.remove(); bubble("error", data.message); }
    log.scrollTop = log.scrollHeight;
  }
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = input.value.trim();
  if (!text || input.disabled) return;
  input.value = "";
  send.disabled = true;
  try {
    await ask(text);
  } catch (error) {
    bubble("error", `The connection failed: ${error.message}`);
  } finally {
    send.disabled = false;
    input.focus();
  }
});

input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    form.requestSubmit();
  }
});

// While the session is being loaded or replaced, the composer waits: a message sent meanwhile
// would be shown before the history it follows, or cleared along with the old conversation.
async function withComposerLocked(work) {
  input.disabled = true;
  try {
    await work();
  } finally {
    input.disabled = false;
    input.focus();
  }
}

document.getElementById("new-session").addEventListener("click", () => withComposerLocked(async () => {
  const response = await fetch("/chat/api/reset", { method: "POST" });
  if (!response.ok) { bubble("error", await errorMessage(response)); return; }
  log.replaceChildren();
}));

withComposerLocked(async () => {
  const response = await fetch("/chat/api/history");
  if (!response.ok) return;
  for (const message of (await response.json()).messages) bubble(message.role, message.text);
});
