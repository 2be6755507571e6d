// Drives the sidecar's chat page in Debian's headless chromium, as a person
// would, for sidecar/tests/it/chat_page/browser.rs (which starts the sidecar and the
// mock model and checks what they saw):
//
//   node chat-page.mjs BASE_URL OWNER_TOKEN SECRET_CANARY SCREENSHOT_DIR [SCENARIO]
//
// SCENARIO `chat` (the default): connect, parameters, a streamed answer,
// fork, the session list, a shared link. `pending`: a run that waits, its
// calls answered from their cards (approve, reject with a reason, a
// deferred result), and the same cards seen through a shared link.
// `booking`: the booking example's API-owned inputs: a missing field typed
// in, an option chosen, the prepared booking confirmed. `replica`: the page
// served by a replica that does not hold the session (its secret value is
// in another replica's memory; LINK is the session's shared link on this
// one): the owner opens it from the list and chats, then the link does.
// `shares`: READ_LINK, a read-only share's link, shows the conversation
// and follows it with no composer; WRITE_LINK, a write share's, chats.
//
// Prints one line per step and a screenshot path per state; exits non-zero,
// naming the step, on the first thing that is not as expected.
import { chromium } from "playwright-core";
import path from "node:path";
import fs from "node:fs";

const [base, ownerToken, canary, shots, scenario = "chat"] = process.argv.slice(2);
if (!shots) {
  console.error("usage: node chat-page.mjs BASE_URL OWNER_TOKEN SECRET_CANARY SCREENSHOT_DIR");
  process.exit(2);
}
fs.mkdirSync(shots, { recursive: true });
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const TIMEOUT = 30_000;

let step = "launch";
const problems = [];
function check(ok, what) {
  if (!ok) throw new Error(what);
}

const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});

/// A fresh profile (no sessionStorage, no cookies) whose console errors,
/// CSP reports included, and script errors are kept as problems.
async function newPage() {
  const context = await browser.newContext({ viewport: { width: 1200, height: 860 } });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  page.on("console", (m) => {
    // A failed request is judged by its response, below.
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) {
      problems.push(`console error: ${m.text()}`);
    }
  });
  page.on("response", (r) => {
    // The browser asks for /favicon.ico by itself; the page has none.
    if (r.status() >= 400 && new URL(r.url()).pathname !== "/favicon.ico") {
      problems.push(`HTTP ${r.status()} for ${r.request().method()} ${r.url()}`);
    }
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  return { context, page };
}

let n = 0;
async function shot(page, name) {
  n += 1;
  const file = path.join(shots, `${String(n).padStart(2, "0")}-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  console.log(`screenshot ${file}`);
}

/// Nothing the page shows, holds in its markup or keeps in storage has the
/// secret value (a password input's value is neither markup nor text).
async function secretNeverRendered(page) {
  const seen = await page.evaluate(
    (c) => ({
      html: document.documentElement.outerHTML.includes(c),
      text: document.body.innerText.includes(c),
      storage: JSON.stringify(Object.entries(sessionStorage)).includes(c),
      cookie: document.cookie,
    }),
    canary,
  );
  check(!seen.html && !seen.text && !seen.storage, `the secret value is rendered: ${JSON.stringify(seen)}`);
  check(seen.cookie === "", `the page has cookies: ${seen.cookie}`);
}

async function chatScenario() {
  const { context, page } = await newPage();

  step = "open the page";
  const response = await page.goto(base + "/");
  check(response.ok(), `GET / answered ${response.status()}`);
  await page.getByRole("heading", { name: "Bindery chat" }).waitFor();
  await shot(page, "connect");

  step = "a wrong token is refused, and the page says so";
  await page.getByLabel("Owner token").fill("not-the-owner-token");
  await page.getByRole("button", { name: "Connect" }).click();
  await page.getByRole("alert").filter({ hasText: "unauthorized" }).waitFor();
  // That 401 was the point; nothing else may fail.
  problems.splice(0, problems.length, ...problems.filter((p) => !p.startsWith("HTTP 401 for GET")));
  check(await page.locator("#new-session").isHidden(), "a refused token shows the agents");
  await shot(page, "refused-token");

  step = "connect with the owner token, by keyboard";
  await page.getByLabel("Owner token").fill(ownerToken);
  await page.getByLabel("Owner token").press("Enter");
  await page.getByText("Connected with the owner token.").waitFor();
  check(await page.getByRole("alert").isHidden(), "the error stays after connecting");
  check(await page.locator("#connect").isHidden(), "the connect form stays once connected");

  step = "pick the agent and see its open parameters";
  await page.getByLabel("Agent", { exact: true }).selectOption("invoices");
  const fields = page.locator("#session-param-fields input");
  await fields.first().waitFor();
  const names = await fields.evaluateAll((inputs) => inputs.map((i) => `${i.name}:${i.type}`));
  // tenant and billing_token are open; region has a default (bound); otp is
  // message-scope, asked for with each message.
  check(
    JSON.stringify(names) === JSON.stringify(["tenant:text", "billing_token:password"]),
    `session parameter fields: ${JSON.stringify(names)}`,
  );
  await page.getByLabel(/^tenant/).fill("acme-corp");
  await page.getByLabel(/^billing_token/).fill(canary);
  await page.getByLabel("Give a link to this session").check();
  await shot(page, "agent-and-parameters");

  step = "create a session";
  await page.getByRole("button", { name: "Create session" }).click();
  const title = page.locator("#chat-title");
  await title.filter({ hasText: "Session" }).waitFor();
  const otp = page.locator("#message-param-fields input[name=otp]");
  check((await otp.getAttribute("type")) === "password", "the message-scope secret otp is not a password input");
  const link = await page.getByLabel(/^Link to this session/).inputValue();
  check(/#session=[^&]+&token=st_/.test(link), `share link: ${link}`);

  step = "send a message (Enter) and see the run stream";
  // What the page shows while the answer streams: each `.streaming` text.
  await page.evaluate(() => {
    window.__streamed = [];
    new MutationObserver(() => {
      const s = document.querySelector("#transcript .streaming");
      if (s) window.__streamed.push(s.lastChild.textContent);
    }).observe(document.getElementById("transcript"), { childList: true, subtree: true, characterData: true });
  });
  await page.getByLabel("Message").fill("Which invoices are overdue?");
  await page.getByLabel("Message").press("Enter");
  const tool = page.locator("#transcript .turn.tool").first();
  await tool.locator(".tool-state", { hasText: "done" }).waitFor();
  check((await tool.locator(".tool-name").innerText()) === "bash_query-invoices", "tool name");
  const args = await tool.locator(".tool-args").innerText();
  check(args.includes("overdue") && !args.includes(canary), `tool arguments: ${args}`);
  const answer = page.locator("#transcript .turn.assistant:not(.streaming)").last();
  await answer.filter({ hasText: "INV-1002" }).waitFor();
  await page.locator("#status", { hasText: "idle" }).waitFor();
  const streamed = await page.evaluate(() => window.__streamed);
  check(streamed.some((t) => t.length > 0), "no streamed text was shown before the answer");
  await tool.locator("summary").click();
  await tool.locator(".tool-result", { hasText: "INV-1002" }).waitFor();
  await secretNeverRendered(page);
  await shot(page, "answer-with-tool-call");
  console.log(`streamed ${streamed.length} partial texts, the last: ${JSON.stringify(streamed.at(-1))}`);

  step = "fork the session";
  const original = (await title.innerText()).match(/Session (\S+)/)[1];
  await page.getByRole("button", { name: "Fork" }).click();
  await title.filter({ hasText: `fork of ${original}` }).waitFor();
  await page.locator("#transcript .turn.tool").first().waitFor();
  check((await page.locator("#share").isHidden()), "a fork shows a share link");
  await shot(page, "fork");

  step = "list sessions";
  await page.getByRole("button", { name: "Refresh" }).click();
  const items = page.locator("#session-list li");
  await items.nth(1).waitFor();
  const listed = await items.allInnerTexts();
  check(listed.length === 2, `sessions listed: ${JSON.stringify(listed)}`);
  check(listed.some((t) => t.includes(`fork of ${original}`)), `no fork listed: ${JSON.stringify(listed)}`);
  await page.locator("#session-list li button", { hasText: "fork of" }).waitFor();
  // Back to the first session from the list, by keyboard.
  const first = page.locator("#session-list li button").filter({ hasNotText: "fork of" });
  await first.focus();
  await page.keyboard.press("Enter");
  await title.filter({ hasNotText: "fork of" }).waitFor();
  check((await first.getAttribute("aria-current")) === "true", "the open session is not marked in the list");
  await secretNeverRendered(page);
  await shot(page, "sessions");
  check((await context.cookies()).length === 0, "the owner's browser got cookies");

  step = "open the shared link in a fresh browser profile";
  const other = await newPage();
  await other.page.goto(link);
  await other.page.getByText("Opened with a session token: this session only.").waitFor();
  await other.page.locator("#transcript .turn.tool").first().waitFor();
  check(await other.page.locator("#connect").isHidden(), "the connect form shows with a session token");
  check(await other.page.locator("#sessions").isHidden(), "the session list shows with a session token");
  check(await other.page.locator("#fork").isHidden(), "a session-token holder is offered Fork");
  await other.page.getByLabel("Message").fill("And the open ones?");
  await other.page.getByLabel("Message").press("Enter");
  await other.page.locator("#transcript .turn.user", { hasText: "And the open ones?" }).waitFor();
  await other.page.locator("#transcript .turn.tool").nth(1).locator(".tool-state", { hasText: "done" }).waitFor();
  await other.page.locator("#status", { hasText: "idle" }).waitFor();
  await secretNeverRendered(other.page);
  await shot(other.page, "shared-link");
  check((await other.context.cookies()).length === 0, "the link's browser got cookies");
}

/// A fresh page connected with the owner token.
async function ownerPage() {
  const { context, page } = await newPage();
  await page.goto(base + "/");
  await page.getByLabel("Owner token").fill(ownerToken);
  await page.getByLabel("Owner token").press("Enter");
  await page.getByText("Connected with the owner token.").waitFor();
  return { context, page };
}

/// Connects as the owner and creates an invoices session (with a link);
/// returns the page and the link.
async function ownerSession() {
  const { context, page } = await ownerPage();
  await page.getByLabel("Agent", { exact: true }).selectOption("invoices");
  await page.getByLabel(/^tenant/).fill("acme-corp");
  await page.getByLabel(/^billing_token/).fill(canary);
  await page.getByLabel("Give a link to this session").check();
  await page.getByRole("button", { name: "Create session" }).click();
  await page.locator("#chat-title").filter({ hasText: "Session" }).waitFor();
  const link = await page.getByLabel(/^Link to this session/).inputValue();
  return { context, page, link };
}

/// Sends `prompt` and waits for the card of the call it makes.
async function untilPending(page, prompt, tool) {
  await page.getByLabel("Message").fill(prompt);
  await page.getByLabel("Message").press("Enter");
  const card = page.locator("#pending-list .pending-card").filter({ hasText: tool });
  await card.waitFor();
  await page.locator("#status", { hasText: "waiting_external" }).waitFor();
  return card;
}

/// The run resumed and the model answered with `text`; no card is left.
async function answered(page, text) {
  await page.locator("#transcript .turn.assistant:not(.streaming)", { hasText: text }).waitFor();
  await page.locator("#status", { hasText: "idle" }).waitFor();
  check(await page.locator("#pending").isHidden(), "a card stays after the run resumed");
}

async function pendingScenario() {
  step = "owner: a session whose run waits for an approval";
  const { page, link } = await ownerSession();
  let card = await untilPending(page, "delete invoice 7", "bash_delete-invoice");
  check((await card.locator(".pending-args").innerText()).includes("INV-7"), "the card lacks the model's arguments");
  check((await card.innerText()).includes("asks for your approval"), "the card does not say it asks for approval");
  const waitingCall = page.locator("#transcript .turn.tool .tool-state").last();
  check((await waitingCall.innerText()) === "waiting", "the waiting call is not marked waiting in the transcript");
  await secretNeverRendered(page);
  await shot(page, "pending-confirm");

  step = "approve (by keyboard): the tool runs and the model answers";
  await card.getByRole("button", { name: "Approve" }).focus();
  await page.keyboard.press("Enter");
  await answered(page, "done: deleted");
  await shot(page, "approved");

  step = "reject with a reason: the model reads the refusal";
  card = await untilPending(page, "delete it again", "bash_delete-invoice");
  await card.getByLabel(/^Reason, if you reject/).fill("not before the audit");
  await shot(page, "pending-reject-with-reason");
  await card.getByRole("button", { name: "Reject" }).click();
  await answered(page, "did not approve this call");
  await page.locator("#transcript .turn.assistant", { hasText: "not before the audit" }).waitFor();
  await shot(page, "rejected");

  step = "a deferred call waits for its result";
  card = await untilPending(page, "where am I?", "get_location");
  check((await card.innerText()).includes("waits for its result"), "the deferred card does not say what it waits for");

  step = "a session-token holder sees the card and that only the owner answers";
  const other = await newPage();
  await other.page.goto(link);
  const seen = other.page.locator("#pending-list .pending-card").filter({ hasText: "get_location" });
  await seen.locator(".owner-only").waitFor();
  check((await seen.locator("button, textarea, input").count()) === 0, "a session-token holder is offered an answer");
  await secretNeverRendered(other.page);
  await shot(other.page, "pending-shared-link");

  step = "owner: submit the deferred result";
  await card.getByLabel("Result of get_location").fill("Lisbon, Portugal");
  await shot(page, "pending-deferred");
  await card.getByLabel("Result of get_location").press("Tab");
  await page.keyboard.press("Enter");
  await answered(page, "done: Lisbon, Portugal");
  await secretNeverRendered(page);
  await shot(page, "deferred-answered");

  step = "the shared link follows the resumed run";
  await other.page.locator("#transcript .turn.assistant", { hasText: "done: Lisbon, Portugal" }).waitFor();
  check(await other.page.locator("#pending").isHidden(), "the shared link still shows the card");
}

/// The day the booking fixture has slots on (common::booking::DAY).
const DAY = "2026-10-01";

async function bookingScenario() {
  step = "owner: a booking session";
  const { page } = await ownerPage();
  await page.getByLabel("Agent", { exact: true }).selectOption("booking");
  await page.getByRole("button", { name: "Create session" }).click();
  await page.locator("#chat-title").filter({ hasText: "booking" }).waitFor();

  step = "a missing field is asked for, and typed in";
  let card = await untilPending(page, 'book {"service": "Haircut"}', "bash_book");
  check((await card.innerText()).includes("needs more input"), "the input card does not say what it needs");
  await card.getByLabel("date").fill(DAY);
  await shot(page, "needs-input");
  await card.getByLabel("date").press("Enter");

  step = "an option is chosen with its button";
  card = page.locator("#pending-list .pending-card").filter({ hasText: "asks you to choose" });
  await card.waitFor();
  const options = await card.locator("button.option .option-label").allInnerTexts();
  check(JSON.stringify(options) === JSON.stringify(["10:00", "11:00"]), `options: ${JSON.stringify(options)}`);
  check((await card.innerText()).includes("time: 11:00"), "an option's facts are not shown");
  await secretNeverRendered(page);
  await shot(page, "needs-selection");
  await card.getByRole("button", { name: /^11:00/ }).click();

  step = "the prepared booking is confirmed, with its facts";
  card = page.locator("#pending-list .pending-card").filter({ hasText: "asks you to confirm" });
  await card.waitFor();
  const facts = await card.locator(".facts").innerText();
  check(facts.includes("time") && facts.includes("11:00"), `confirmation facts: ${facts}`);
  await shot(page, "needs-confirmation");
  await card.getByRole("button", { name: "Approve" }).click();
  await answered(page, "booked");
  await secretNeverRendered(page);
  await shot(page, "booked");
}

async function budgetScenario() {
  step = "owner: a run that reaches its session's budget waits for a person";
  const { page } = await ownerSession();
  const card = await untilPending(page, "how much is overdue?", "The run");
  const text = await card.innerText();
  check(text.includes("has used up a budget"), `the budget card: ${text}`);
  const facts = await card.locator(".facts").innerText();
  check(facts.includes("per-session") && facts.includes("40 of 10 tokens per session"), `budget facts: ${facts}`);
  check((await card.locator(".pending-args").count()) === 0, "a budget card before a model request shows a call");
  await secretNeverRendered(page);
  await shot(page, "pending-budget");

  step = "let the run go on: the model answers, and the page says what it cost";
  await card.getByRole("button", { name: "Let the run go on" }).click();
  await answered(page, "answer:");
  const usage = page.locator("#usage");
  await usage.filter({ hasText: "This session used 80 tokens, 1 tool call, cost 0.0001 USD." }).waitFor();
  await usage.filter({ hasText: "Last run: 40 tokens, 0 tool calls, cost 0.00005 USD." }).waitFor();
  await shot(page, "budget-passed");

  step = "the next run asks again, and ending it says why";
  const again = await untilPending(page, "and now?", "The run");
  await again.getByRole("button", { name: "End the run" }).click();
  await page.locator("#status", { hasText: "a person did not let the run go past budget per-session" }).waitFor();
  await shot(page, "budget-refused");
}

/// Sends `prompt` on `page` and waits for the `nth` tool call to be done,
/// the answer shown and the session idle; what streamed meanwhile.
async function chatTurn(page, prompt, nth) {
  await page.evaluate(() => {
    window.__streamed = [];
    new MutationObserver(() => {
      const s = document.querySelector("#transcript .streaming");
      if (s) window.__streamed.push(s.lastChild.textContent);
    }).observe(document.getElementById("transcript"), { childList: true, subtree: true, characterData: true });
  });
  await page.getByLabel("Message").fill(prompt);
  await page.getByLabel("Message").press("Enter");
  const tool = page.locator("#transcript .turn.tool").nth(nth);
  await tool.locator(".tool-state", { hasText: "done" }).waitFor();
  await page.locator("#transcript .turn.assistant:not(.streaming)").filter({ hasText: "INV-1002" }).nth(nth).waitFor();
  await page.locator("#status", { hasText: "idle" }).waitFor();
  return page.evaluate(() => window.__streamed);
}

async function replicaScenario() {
  const link = process.env.LINK;
  check(link, "LINK is not set");
  const id = new URL(link).hash.match(/session=([^&]+)/)[1];

  step = "owner: open the session the other replica holds, from the list";
  const { context, page } = await ownerPage();
  await page.getByRole("button", { name: "Refresh" }).click();
  await page.locator(`#session-list li button[data-session="${id}"]`).click();
  await page.locator("#chat-title").filter({ hasText: "Session" }).waitFor();

  step = "owner: a message, answered by the holder and streamed from it";
  const streamed = await chatTurn(page, "Which invoices are overdue?", 0);
  check(streamed.some((t) => t.length > 0), "no streamed text was shown before the answer");
  await secretNeverRendered(page);
  await shot(page, "replica-owner");
  check((await context.cookies()).length === 0, "the owner's browser got cookies");

  step = "the shared link, on this replica";
  const other = await newPage();
  await other.page.goto(link);
  await other.page.getByText("Opened with a session token: this session only.").waitFor();
  await other.page.locator("#transcript .turn.tool").first().waitFor();
  await chatTurn(other.page, "And the open ones?", 1);
  await secretNeverRendered(other.page);
  await shot(other.page, "replica-link");
}

async function sharesScenario() {
  const [readLink, writeLink] = [process.env.READ_LINK, process.env.WRITE_LINK];
  check(readLink && writeLink, "READ_LINK and WRITE_LINK are not set");

  step = "a read-only share's link: the conversation, and no composer";
  const reader = await newPage();
  await reader.page.goto(readLink);
  await reader.page.getByText("Opened with a read-only share link: this session only, to read.").waitFor();
  await reader.page.locator("#transcript .turn.tool").first().waitFor();
  check(await reader.page.locator("#send").isHidden(), "a read-only share is offered the composer");
  check(await reader.page.locator("#fork").isHidden(), "a share holder is offered Fork");
  check(await reader.page.locator("#connect").isHidden(), "the connect form shows with a share link");
  await secretNeverRendered(reader.page);
  await shot(reader.page, "read-share");

  step = "a write share's link: it chats";
  const writer = await newPage();
  await writer.page.goto(writeLink);
  await writer.page.getByText("Opened with a share link: this session only.").waitFor();
  await writer.page.locator("#transcript .turn.tool").first().waitFor();
  check(await writer.page.locator("#send").isVisible(), "a write share has no composer");
  await writer.page.getByLabel("Message").fill("And the open ones?");
  await writer.page.getByLabel("Message").press("Enter");
  await writer.page.locator("#transcript .turn.tool").nth(1).locator(".tool-state", { hasText: "done" }).waitFor();
  await writer.page.locator("#status", { hasText: "idle" }).waitFor();
  await secretNeverRendered(writer.page);
  await shot(writer.page, "write-share");

  step = "the read-only page follows what the write share said";
  await reader.page.locator("#transcript .turn.user", { hasText: "And the open ones?" }).waitFor();
  await shot(reader.page, "read-share-followed");
  for (const p of [reader, writer]) {
    check((await p.context.cookies()).length === 0, "a share link's browser got cookies");
  }
}

try {
  if (scenario === "pending") await pendingScenario();
  else if (scenario === "replica") await replicaScenario();
  else if (scenario === "shares") await sharesScenario();
  else if (scenario === "budget") await budgetScenario();
  else if (scenario === "booking") await bookingScenario();
  else await chatScenario();
  check(problems.length === 0, problems.join("\n"));
  console.log(`chat page (${scenario}): all steps passed`);
} catch (e) {
  console.error(`chat page, step "${step}": ${e.message}`);
  if (problems.length) console.error(problems.join("\n"));
  await browser.close();
  process.exit(1);
}
await browser.close();
