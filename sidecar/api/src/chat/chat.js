// Bindery's chat page: pick an agent, fill its open parameters, chat in a
// session and watch the run stream. Plain browser JavaScript, served as is
// by the sidecar (no build step, no third-party code). Tokens live in this
// tab only: the owner token in sessionStorage, a session token or a share
// link's token in the URL fragment (never sent to the server by the
// browser); no cookies. Text is
// only ever set with textContent, never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

const state = {
  owner: "", // the owner token, once accepted
  sessionToken: "", // from a shared link (a session token or a share's): this session only
  readOnly: false, // a read-only share link: no composer
  agents: [],
  session: null, // the open session's id
  agent: null, // its agent's slug
  stream: null, // AbortController of the open event stream
  lastEventId: 0,
  delta: "", // streamed text of the model turn in progress
  refreshing: false,
  dirty: false,
  pendingKey: "", // which pending calls the cards show
  lastRun: null, // what the last run of the open session used (its run_finished event)
};

const OWNER_KEY = "bindery.owner-token";

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === false || v === null || v === undefined) continue;
    if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  e.append(...children);
  return e;
}

const short = (id) => (id || "").slice(0, 8);

// ---------------------------------------------------------------------------
// The API.

function bearer() {
  return state.sessionToken || state.owner;
}

function apiError(status, json, text) {
  const e = new Error(
    json && json.message ? json.message : `HTTP ${status} ${String(text || "").slice(0, 200)}`,
  );
  e.status = status;
  e.code = (json && json.error) || "";
  e.params = (json && json.params) || [];
  return e;
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${bearer()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
  });
  const text = await r.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch (_) {
    json = null;
  }
  if (!r.ok) throw apiError(r.status, json, text);
  return json;
}

function showError(e) {
  const box = $("error");
  let text = e.code ? `${e.code}: ${e.message}` : e.message;
  if (e.params && e.params.length && !e.params.every((p) => e.message.includes(p))) {
    text += ` (${e.params.join(", ")})`;
  }
  box.textContent = text;
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

/// Runs `f`, showing what went wrong instead of throwing.
async function guarded(f) {
  clearError();
  try {
    await f();
  } catch (e) {
    showError(e);
  }
}

// ---------------------------------------------------------------------------
// Parameters: unbound, unpinned ones get a field; secret ones a password
// input, whose value is sent and never shown.

function openParams(agent, scope) {
  return (agent ? agent.parameters : []).filter(
    (p) => p.scope === scope && !p.bound && !p.pinned,
  );
}

function paramFields(container, params, prefix) {
  container.replaceChildren();
  for (const p of params) {
    const id = `${prefix}-${p.name}`;
    const label = el("label", { for: id }, p.name);
    if (p.required) label.append(el("span", { class: "req" }, " (required)"));
    if (p.secret) label.append(el("span", { class: "secret" }, " secret"));
    const input = el("input", {
      id,
      name: p.name,
      type: p.secret ? "password" : "text",
      autocomplete: p.secret ? "new-password" : "off",
      spellcheck: "false",
      required: p.required,
    });
    const field = el("div", { class: "field" }, label, input);
    if (p.description) {
      input.setAttribute("aria-describedby", `${id}-hint`);
      field.append(el("p", { id: `${id}-hint`, class: "hint" }, p.description));
    }
    container.append(field);
  }
  container.parentElement.hidden = params.length === 0;
}

function paramValues(container) {
  const out = {};
  for (const input of container.querySelectorAll("input")) {
    if (input.value !== "") out[input.name] = input.value;
  }
  return out;
}

// ---------------------------------------------------------------------------
// Connecting, agents and the session list.

async function connect(token) {
  state.owner = token;
  state.sessionToken = "";
  state.readOnly = false;
  let agents;
  try {
    agents = (await api("GET", "/v1/agents")).agents;
  } catch (e) {
    state.owner = "";
    sessionStorage.removeItem(OWNER_KEY);
    throw e;
  }
  sessionStorage.setItem(OWNER_KEY, token);
  state.agents = agents;
  $("owner-token").value = "";
  $("who").textContent = "Connected with the owner token.";
  $("disconnect").hidden = false;
  $("connect").hidden = true;
  const select = $("agent");
  select.replaceChildren(
    ...agents.map((a) => el("option", { value: a.slug }, a.slug)),
  );
  $("new-session").hidden = false;
  $("sessions").hidden = false;
  showAgent();
  await refreshSessions();
}

function disconnect() {
  closeStream();
  sessionStorage.removeItem(OWNER_KEY);
  state.owner = "";
  state.sessionToken = "";
  state.readOnly = false;
  state.session = null;
  $("who").textContent = "Not connected.";
  $("disconnect").hidden = true;
  for (const id of ["new-session", "sessions", "chat"]) $(id).hidden = true;
  $("connect").hidden = false;
  $("side").hidden = false;
  document.querySelector("main").classList.remove("single");
  history.replaceState(null, "", location.pathname);
}

function agentNamed(slug) {
  return state.agents.find((a) => a.slug === slug) || null;
}

function showAgent() {
  const agent = agentNamed($("agent").value);
  $("agent-about").textContent = agent && agent.announce ? agent.announce : "";
  const open = openParams(agent, "session");
  paramFields($("session-param-fields"), open, "session-param");
  $("no-params").hidden = open.length > 0;
}

async function refreshSessions() {
  const { sessions } = await api("GET", "/v1/sessions");
  sessions.sort((a, b) => (a.created_at < b.created_at ? 1 : -1));
  $("session-list").replaceChildren(
    ...sessions.map((s) => {
      let text = `${short(s.session_id)} · ${s.agent} · ${s.status}`;
      if (s.forked_from) text += ` · fork of ${short(s.forked_from)}`;
      const button = el("button", { type: "button", class: "session", "data-session": s.session_id }, text);
      if (s.session_id === state.session) button.setAttribute("aria-current", "true");
      button.addEventListener("click", () =>
        guarded(async () => openSession(await api("GET", `/v1/sessions/${s.session_id}`), "")),
      );
      return el("li", {}, button);
    }),
  );
}

// ---------------------------------------------------------------------------
// A session: its transcript (from the session's turns), the streamed text
// of the turn in progress (from `delta` events), and the event stream that
// says when to read the turns again.

function openSession(view, shareToken) {
  closeStream();
  state.session = view.session_id;
  state.agent = view.agent;
  state.lastEventId = 0;
  state.delta = "";
  state.lastRun = null;
  state.pendingKey = null;
  $("chat").hidden = false;
  let title = `Session ${short(view.session_id)} · ${view.agent}`;
  if (view.forked_from) title += ` (fork of ${short(view.forked_from)})`;
  $("chat-title").textContent = title;
  if (shareToken) {
    const link = `${location.origin}${location.pathname}#session=${encodeURIComponent(
      view.session_id,
    )}&token=${encodeURIComponent(shareToken)}`;
    $("share-link").value = link;
    $("share").hidden = false;
  } else {
    $("share").hidden = true;
  }
  paramFields(
    $("message-param-fields"),
    openParams(agentNamed(view.agent), "message"),
    "message-param",
  );
  $("fork").hidden = !state.owner;
  // A read-only share may not post: the server refuses it anyway.
  $("send").hidden = state.readOnly;
  render(view);
  for (const b of document.querySelectorAll("#session-list button")) {
    if (b.dataset.session === view.session_id) b.setAttribute("aria-current", "true");
    else b.removeAttribute("aria-current");
  }
  openStream(view.session_id);
  $("prompt").focus();
}

function toolCallItem(call) {
  let args = call.function.arguments || "";
  if (args.length > 160) args = `${args.slice(0, 160)}…`;
  const summary = el(
    "summary",
    {},
    el("span", { class: "tool-name" }, call.function.name),
    el("code", { class: "tool-args" }, args),
    el("span", { class: "tool-state" }, "running"),
  );
  const result = el("pre", { class: "tool-result" }, "");
  const item = el(
    "li",
    { class: "turn tool", "data-call": call.id },
    el("details", {}, summary, result),
  );
  return item;
}

function render(view) {
  if (view.session_id !== state.session) return;
  const list = $("transcript");
  // Tool calls the person unfolded stay unfolded.
  const unfolded = new Set(
    [...list.querySelectorAll("li.tool details[open]")].map((d) => d.parentElement.dataset.call),
  );
  const items = [];
  const calls = new Map();
  for (const t of view.session.turns) {
    if (t.role === "user") {
      items.push(el("li", { class: "turn user" }, el("span", { class: "who" }, "You"), t.content || ""));
    } else if (t.role === "assistant") {
      if (t.content) {
        items.push(el("li", { class: "turn assistant" }, el("span", { class: "who" }, view.agent), t.content));
      }
      for (const call of t.tool_calls || []) {
        const item = toolCallItem(call);
        if (unfolded.has(call.id)) item.firstChild.open = true;
        calls.set(call.id, item);
        items.push(item);
      }
    } else if (t.role === "tool") {
      const item = calls.get(t.tool_call_id);
      const content = t.content || "";
      const failed = content.startsWith("error:");
      if (item) {
        item.querySelector(".tool-result").textContent = content;
        item.querySelector(".tool-state").textContent = failed ? "failed" : "done";
        if (failed) item.classList.add("failed");
      }
    }
  }
  if (view.status === "waiting_external") {
    for (const p of view.pending || []) {
      const item = calls.get(p.tool_call_id);
      if (item) item.querySelector(".tool-state").textContent = "waiting";
    }
  }
  if (state.delta) {
    items.push(el("li", { class: "turn assistant streaming" }, el("span", { class: "who" }, view.agent), state.delta));
  }
  list.replaceChildren(...items);
  list.scrollTop = list.scrollHeight;
  let status = view.status;
  if (view.status_detail) status += `: ${view.status_detail}`;
  $("status").textContent = status;
  $("status").className = `status ${view.status}`;
  $("send-button").disabled = view.status === "running";
  renderUsage(view.usage);
  renderPending(view.status === "waiting_external" ? view.pending || [] : []);
}

/// `12 tokens, 1 tool call, cost 0.0004 USD`: what a session or a run used.
function usageText(u, currency) {
  const plural = (n, one) => `${n} ${one}${n === 1 ? "" : "s"}`;
  const parts = [plural(u.total_tokens, "token")];
  if (u.estimated_tokens) parts[0] += ` (${u.estimated_tokens} estimated)`;
  parts.push(plural(u.tool_calls, "tool call"));
  if (currency) parts.push(`cost ${Number(u.cost.toPrecision(4))} ${currency}`);
  return parts.join(", ");
}

function renderUsage(usage) {
  const line = $("usage");
  if (!usage) {
    line.hidden = true;
    return;
  }
  let text = `This session used ${usageText(usage, usage.currency)}.`;
  if (state.lastRun) text += ` Last run: ${usageText(state.lastRun, usage.currency)}.`;
  line.textContent = text;
  line.hidden = false;
}

// ---------------------------------------------------------------------------
// Pending calls: a run that waits shows a card per call, with the answer
// its disposition takes. Only the owner holds continuation tokens; a
// session-token holder sees the calls without them.

const ASKS = {
  confirm: "asks for your approval",
  needs_confirmation: "asks you to confirm",
  deferred: "waits for its result from you",
  needs_selection: "asks you to choose",
  needs_input: "needs more input",
  budget: "has used up a budget",
};

/// What a used-up budget says: `120 of 100 tokens per 24h`.
function budgetFacts(b) {
  const amount = (x) => (b.meter === "cost" ? Number(x.toPrecision(4)) : Math.round(x));
  return {
    budget: b.budget,
    used: `${amount(b.used)} of ${amount(b.limit)} ${b.meter.replace("_", " ")} per ${b.per}`,
  };
}

function factList(facts) {
  const list = el("dl", { class: "facts" });
  for (const [k, v] of Object.entries(facts || {})) {
    list.append(el("dt", {}, k), el("dd", {}, typeof v === "string" ? v : JSON.stringify(v)));
  }
  return list;
}

/// Posts one answer, then reads the session again; the event stream
/// follows the resumed run.
async function answerPending(card, token, body) {
  for (const c of card.querySelectorAll("button, input, textarea")) c.disabled = true;
  try {
    const view = await api("POST", `/v1/continuations/${encodeURIComponent(token)}`, {
      ...body,
      session_id: state.session,
    });
    render(view);
  } catch (e) {
    for (const c of card.querySelectorAll("button, input, textarea")) c.disabled = false;
    throw e;
  }
  refresh();
}

function pendingCard(p, n) {
  const id = `pending-${n}`;
  const card = el("li", { class: "pending-card", "data-call": p.tool_call_id, "aria-labelledby": `${id}-title` });
  const title = el(
    "p",
    { id: `${id}-title`, class: "pending-title" },
    el("span", { class: "tool-name" }, p.tool || "The run"),
    ` ${ASKS[p.disposition] || p.disposition}`,
  );
  if (p.via && p.via.length) title.append(el("span", { class: "hint" }, ` (via ${p.via.join(" → ")})`));
  card.append(title);
  // A run held before a model request has no call to show.
  if (p.tool) card.append(el("code", { class: "pending-args" }, JSON.stringify(p.call ?? {})));
  if (p.budget) card.append(factList(budgetFacts(p.budget)));
  if (p.note) card.append(el("p", { class: "hint" }, p.note));
  if (p.facts && Object.keys(p.facts).length) card.append(factList(p.facts));
  const token = p.continuation_token;
  if (!token) {
    card.append(el("p", { class: "hint owner-only" }, "Only the owner can answer this call (open the session with the owner token)."));
    return card;
  }
  const answer = (body) => guarded(() => answerPending(card, token, body));
  const form = el("form", { class: "pending-answer" });
  switch (p.disposition) {
    case "confirm":
    case "needs_confirmation": {
      const reason = el("input", { id: `${id}-reason`, type: "text", autocomplete: "off" });
      const approve = el("button", { type: "submit" }, "Approve");
      const reject = el("button", { type: "button", class: "reject" }, "Reject");
      reject.addEventListener("click", () => {
        const body = { approve: false };
        if (reason.value.trim()) body.reason = reason.value.trim();
        answer(body);
      });
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        answer({ approve: true });
      });
      form.append(
        el("label", { for: reason.id }, "Reason, if you reject (the model reads it)"),
        reason,
        el("div", { class: "buttons" }, approve, reject),
      );
      break;
    }
    case "budget": {
      const go = el("button", { type: "submit" }, "Let the run go on");
      const stop = el("button", { type: "button", class: "reject" }, "End the run");
      stop.addEventListener("click", () => answer({ approve: false }));
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        answer({ approve: true });
      });
      form.append(
        el("p", { class: "hint" }, "Letting it go on lifts this budget for this run only."),
        el("div", { class: "buttons" }, go, stop),
      );
      break;
    }
    case "deferred": {
      const result = el("textarea", { id: `${id}-result`, rows: 2, required: true });
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        answer({ result: result.value });
      });
      form.append(
        el("label", { for: result.id }, `Result of ${p.tool}`),
        result,
        el("button", { type: "submit" }, "Submit result"),
      );
      break;
    }
    case "needs_selection": {
      form.addEventListener("submit", (ev) => ev.preventDefault());
      const options = el("ul", { class: "options", "aria-label": `Options for ${p.tool}` });
      for (const o of p.options || []) {
        const button = el("button", { type: "button", class: "option" }, el("span", { class: "option-label" }, o.label || o.id));
        // A button holds phrasing content only: its facts on one line.
        const facts = Object.entries(o.facts || {}).map(
          ([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`,
        );
        if (facts.length) button.append(el("span", { class: "option-facts" }, facts.join(" · ")));
        button.addEventListener("click", () => answer({ choice: o.id }));
        options.append(el("li", {}, button));
      }
      form.append(options);
      break;
    }
    case "needs_input": {
      const fields = (p.missing || []).map((name) => {
        const input = el("input", { id: `${id}-in-${name}`, name, type: "text", autocomplete: "off", required: true });
        return el("div", { class: "field" }, el("label", { for: input.id }, name), input);
      });
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        const input = {};
        for (const i of form.querySelectorAll("input")) input[i.name] = i.value;
        answer({ input });
      });
      form.append(...fields, el("button", { type: "submit" }, "Submit"));
      break;
    }
    default:
      form.append(el("p", { class: "hint" }, `This page cannot answer a "${p.disposition}" call.`));
  }
  card.append(form);
  return card;
}

/// Redraws the cards only when the calls changed, so what a person typed stays.
function renderPending(pending) {
  const key = JSON.stringify(pending.map((p) => [p.tool_call_id, !!p.continuation_token]));
  if (key === state.pendingKey) return;
  state.pendingKey = key;
  $("pending-list").replaceChildren(...pending.map(pendingCard));
  $("pending").hidden = pending.length === 0;
}

function renderDelta() {
  const list = $("transcript");
  let item = list.querySelector(".streaming");
  if (!item) {
    item = el("li", { class: "turn assistant streaming" }, el("span", { class: "who" }, state.agent), "");
    list.append(item);
  }
  item.lastChild.textContent = state.delta;
  list.scrollTop = list.scrollHeight;
}

/// Reads the session again; calls made meanwhile are folded into one more read.
async function refresh() {
  if (state.refreshing) {
    state.dirty = true;
    return;
  }
  state.refreshing = true;
  try {
    do {
      state.dirty = false;
      const id = state.session;
      const view = await api("GET", `/v1/sessions/${id}`);
      if (id === state.session) render(view);
    } while (state.dirty);
  } catch (e) {
    showError(e);
  } finally {
    state.refreshing = false;
  }
}

function onEvent(kind, data) {
  switch (kind) {
    case "delta":
      state.delta += (data && data.content) || "";
      renderDelta();
      return;
    case "run_finished":
      state.lastRun = (data && data.usage) || null;
      state.delta = "";
      break;
    case "message":
    case "tool_call":
      state.delta = "";
      break;
    default:
      break;
  }
  refresh();
}

/// One `text/event-stream` block.
function onBlock(block) {
  let kind = "message";
  let data = "";
  let id = null;
  let any = false;
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    any = true;
    if (field === "event") kind = value;
    else if (field === "data") data = data ? `${data}\n${value}` : value;
    else if (field === "id") id = value;
  }
  if (!any) return;
  if (id !== null && Number(id) > state.lastEventId) state.lastEventId = Number(id);
  let parsed = null;
  try {
    parsed = data ? JSON.parse(data) : null;
  } catch (_) {
    parsed = null;
  }
  onEvent(kind, parsed);
}

function closeStream() {
  if (state.stream) state.stream.abort();
  state.stream = null;
}

/// Follows the session's events with fetch (EventSource cannot send an
/// Authorization header); reconnects with Last-Event-ID when cut.
async function openStream(id) {
  const ctl = new AbortController();
  state.stream = ctl;
  while (!ctl.signal.aborted) {
    try {
      const headers = { Authorization: `Bearer ${bearer()}`, Accept: "text/event-stream" };
      if (state.lastEventId) headers["Last-Event-ID"] = String(state.lastEventId);
      const r = await fetch(`/v1/sessions/${encodeURIComponent(id)}/events`, {
        headers,
        signal: ctl.signal,
        credentials: "omit",
        cache: "no-store",
      });
      if (!r.ok) {
        const text = await r.text();
        let json = null;
        try {
          json = JSON.parse(text);
        } catch (_) {
          json = null;
        }
        throw apiError(r.status, json, text);
      }
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r/g, "");
        let end;
        while ((end = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          onBlock(block);
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
      if (e.status) {
        showError(e);
        return;
      }
    }
    if (ctl.signal.aborted) return;
    await new Promise((done) => setTimeout(done, 1000));
  }
}

// ---------------------------------------------------------------------------
// The forms.

async function createSession() {
  const agent = $("agent").value;
  const body = {
    agent,
    params: paramValues($("session-param-fields")),
    session_token: $("want-link").checked,
  };
  const view = await api("POST", "/v1/sessions", body);
  openSession(view, view.session_token || "");
  await refreshSessions();
}

async function send() {
  const prompt = $("prompt").value.trim();
  if (!prompt || !state.session) return;
  const body = { prompt };
  const params = paramValues($("message-param-fields"));
  if (Object.keys(params).length) body.params = params;
  $("send-button").disabled = true;
  try {
    const view = await api("POST", `/v1/sessions/${state.session}/messages`, body);
    $("prompt").value = "";
    for (const input of $("message-param-fields").querySelectorAll("input")) input.value = "";
    render(view);
  } catch (e) {
    $("send-button").disabled = false;
    throw e;
  }
}

/// A fork starts from the session's non-secret values; secret ones are never
/// inherited, so the new-session form's values for the same agent go along.
async function fork() {
  const params = $("agent").value === state.agent ? paramValues($("session-param-fields")) : {};
  const view = await api("POST", `/v1/sessions/${state.session}/fork`, { params });
  openSession(view, "");
  await refreshSessions();
}

async function openFromFragment() {
  const f = new URLSearchParams(location.hash.slice(1));
  const id = f.get("session");
  const token = f.get("token");
  if (!id || !token) return false;
  state.sessionToken = token;
  // A share link (`bsh_…`) says its mode; one that does not is taken as
  // read-only.
  const share = token.startsWith("bsh_");
  state.readOnly = share && f.get("mode") !== "write";
  state.owner = "";
  $("side").hidden = true;
  document.querySelector("main").classList.add("single");
  $("who").textContent = !share
    ? "Opened with a session token: this session only."
    : state.readOnly
      ? "Opened with a read-only share link: this session only, to read."
      : "Opened with a share link: this session only.";
  openSession(await api("GET", `/v1/sessions/${encodeURIComponent(id)}`), "");
  return true;
}

function start() {
  $("connect").addEventListener("submit", (ev) => {
    ev.preventDefault();
    guarded(() => connect($("owner-token").value.trim()));
  });
  $("disconnect").addEventListener("click", disconnect);
  $("agent").addEventListener("change", showAgent);
  $("new-session").addEventListener("submit", (ev) => {
    ev.preventDefault();
    guarded(createSession);
  });
  $("refresh-sessions").addEventListener("click", () => guarded(refreshSessions));
  $("send").addEventListener("submit", (ev) => {
    ev.preventDefault();
    guarded(send);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("send").requestSubmit();
    }
  });
  $("fork").addEventListener("click", () => guarded(fork));
  $("share-link").addEventListener("focus", (ev) => ev.target.select());
  window.addEventListener("hashchange", () => location.reload());
  guarded(async () => {
    if (await openFromFragment()) return;
    const saved = sessionStorage.getItem(OWNER_KEY);
    if (saved) await connect(saved);
  });
}

start();
