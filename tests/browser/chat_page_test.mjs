// The chat page at `/` in a real browser: headless Chromium (Debian's package), driven over the
// DevTools protocol, loads the page from `ingot serve` on the demo model, types a message, sends it and
// sees the reply arrive in pieces (streamed), equal to the API's greedy answer; then the Stop button
// cuts a long reply and the server's slot is free again. Run by ./run (registered in ctest).
import { spawn } from "node:child_process";
import { cpSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

const src = process.env.INGOT_SOURCE_DIR;
const dir = mkdtempSync(join(tmpdir(), "ingot-browser-"));
const model = join(dir, "model");
const profile = join(dir, "profile");
cpSync(join(src, "models/demo"), model, { recursive: true });
for (const f of ["tokenizer.json", "tokenizer_config.json"]) cpSync(join(process.env.INGOT_TOKENIZER_DIR, f), join(model, f));

const children = [];
// Whether any process of the group led by pid is left.
function groupAlive(pid) {
  try {
    process.kill(-pid, 0);
    return true;
  } catch {
    return false;
  }
}
// The programs are ended and waited for before their folders go: Chromium writes its profile until
// it exits, and so do its helpers (zygote, renderers, crash handler), which outlive a killed main
// process; each program runs in a process group of its own, so the whole group is killed and waited
// for (up to 10 s).
async function cleanup() {
  await Promise.all(children.map(async (c) => {
    const exited = c.exitCode !== null || c.signalCode !== null ? Promise.resolve() :
      new Promise((resolve) => c.once("exit", resolve));
    try {
      process.kill(-c.pid, "SIGKILL");
    } catch {
      c.kill("SIGKILL");
    }
    await exited;
    for (let i = 0; i < 100 && groupAlive(c.pid); ++i) await new Promise((r) => setTimeout(r, 100));
  }));
  rmSync(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
}
async function fail(e) {
  console.log(`FAILED: ${e.stack || e}`);
  await cleanup();
  process.exit(1);
}
process.on("unhandledRejection", fail);

// Starts a program and resolves with the first match of `re` in its output.
function start(cmd, args, re, what) {
  const p = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], detached: true });
  children.push(p);
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`${what} did not start within 60 s: ${out}`)), 60000);
    const on = (d) => {
      out += d;
      const m = out.match(re);
      if (m) { clearTimeout(timer); resolve(m); }
    };
    p.stdout.on("data", on);
    p.stderr.on("data", on);
    p.on("exit", (code) => reject(new Error(`${what} exited (${code}): ${out}`)));
  });
}

const [, port] = await start(process.env.INGOT_BINARY, [
  "serve", "--model", model, "--port", "0", "--device", "cpu", "--threads", "2", "--slots", "2", "--capacity", "512",
  "--chat-template", join(src, "tests/data/server/chat_template.jinja"),
], /listening on http:\/\/127\.0\.0\.1:(\d+)/, "ingot serve");
const base = `http://127.0.0.1:${port}`;

const [, devtools] = await start(process.env.CHROMIUM, [
  "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
  "--remote-debugging-port=0", `--user-data-dir=${profile}`, "about:blank",
], /DevTools listening on ws:\/\/127\.0\.0\.1:(\d+)\//, "chromium");

// One page target over the DevTools protocol.
const targets = await (await fetch(`http://127.0.0.1:${devtools}/json/list`)).json();
const page = targets.find((t) => t.type === "page");
assert.ok(page, "no page target");
const ws = new WebSocket(page.webSocketDebuggerUrl);
await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
let nextId = 1;
const pending = new Map();
ws.onmessage = (m) => {
  const msg = JSON.parse(m.data);
  if (msg.id && pending.has(msg.id)) {
    pending.get(msg.id)(msg);
    pending.delete(msg.id);
  }
};
function send(method, params = {}) {
  const id = nextId++;
  ws.send(JSON.stringify({ id, method, params }));
  return new Promise((resolve) => pending.set(id, resolve));
}
async function evaluate(expression) {
  const r = await send("Runtime.evaluate", { expression, awaitPromise: true, returnByValue: true });
  if (r.result.exceptionDetails) throw new Error(`page: ${JSON.stringify(r.result.exceptionDetails)}`);
  return r.result.result.value;
}
async function until(expression, what, seconds = 60) {
  for (let i = 0; i < seconds * 20; i++) {
    if (await evaluate(expression)) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

await send("Page.enable");
await send("Page.navigate", { url: base + "/" });
await until(`document.readyState === "complete" && document.getElementById("model").textContent.includes("slots")`,
  "the page to load and show the model");
console.log("ok - the page loads and shows", await evaluate(`document.getElementById("model").textContent`));

// Every text the reply bubble shows, recorded as it changes.
await evaluate(`window.__seen = []; new MutationObserver(() => {
  const b = document.querySelectorAll(".assistant"); if (b.length) window.__seen.push(b[b.length - 1].textContent);
}).observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true }); true`);

const message = "Tell me a story about a dog.";
await evaluate(`document.getElementById("temperature").value = "0";
  document.getElementById("max_tokens").value = "60";
  document.getElementById("input").value = ${JSON.stringify(message)};
  document.getElementById("send").click(); true`);
await until(`document.querySelector(".assistant")?.dataset.done === "1"`, "the reply to finish");
const reply = await evaluate(`document.querySelector(".assistant").textContent`);
const seen = await evaluate(`window.__seen.filter((t, i, a) => t !== a[i - 1]).length`);
assert.equal(await evaluate(`document.querySelectorAll(".error").length`), 0, "the page shows an error");
const api = await (await fetch(base + "/v1/chat/completions", {
  method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ messages: [{ role: "user", content: message }], temperature: 0, max_tokens: 60 }),
})).json();
assert.equal(reply, api.choices[0].message.content, "the page's reply differs from the API's greedy answer");
assert.ok(reply.length > 0);
assert.ok(seen > 2, `the reply did not arrive in pieces (${seen} states)`);
const stats = await evaluate(`document.getElementById("stats").textContent`);
assert.ok(/tok\/s|done/.test(stats), `no speed shown: "${stats}"`);
console.log(`ok - a message streams its reply (${seen} states, "${stats}")`);

// Stop: a long reply cut as soon as text arrives; the slot frees. The demo model often ends a story
// within a few tokens, so the test makes this reply long: the page's request gets ignore_eos (the
// server's extension) added on its way out.
await evaluate(`const realFetch = window.fetch;
  window.fetch = (url, init) => {
    if (init && init.body) init = { ...init, body: JSON.stringify({ ...JSON.parse(init.body), ignore_eos: true }) };
    return realFetch(url, init);
  }; true`);
await evaluate(`document.getElementById("reset").click();
  document.getElementById("max_tokens").value = "480";
  document.getElementById("input").value = "Once upon a time";
  document.getElementById("send").click(); true`);
await until(`(document.querySelector(".assistant")?.textContent || "").length > 0`, "the long reply to start");
await evaluate(`document.getElementById("stop").click(); true`);
await until(`document.querySelector(".assistant")?.dataset.done === "1"`, "the stopped reply to finish");
assert.equal(await evaluate(`document.getElementById("send").disabled`), false);
assert.equal(await evaluate(`document.querySelectorAll(".error").length`), 0, "stopping shows an error");
let free = false;
for (let i = 0; i < 400 && !free; i++) {
  const slots = await (await fetch(base + "/slots")).json();
  free = slots.every((s) => !s.busy);
  if (!free) await new Promise((r) => setTimeout(r, 50));
}
assert.ok(free, "the stopped request still holds a slot");
// The server saw the request cancelled, and far fewer than its 480 tokens were made.
const metrics = await (await fetch(base + "/metrics")).text();
assert.match(metrics, /ingot_generations_total\{reason="cancelled"\} 1\n/, metrics);
const generated = Number(metrics.match(/\ningot_generated_tokens_total (\d+)/)[1]);
assert.ok(generated < 480, `the stopped reply ran on: ${generated} tokens generated in all`);
console.log(`ok - Stop cancels the reply mid-way and the slot frees (${generated} tokens generated in all)`);

ws.close();
await cleanup();
console.log("3 checks passed");
process.exit(0);
