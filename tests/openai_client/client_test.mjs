// `ingot serve` as applications use it: the official `openai` npm package against the server running
// the demo model (models/demo + the Llama 2 tokenizer, a test chat template). Chat (whole and
// streamed, which must agree), stop strings, n = 2, logprobs (whole and streamed), completions, the
// model list, and errors (bad parameter, top_logprobs out of range or without logprobs, a logit bias the
// sampler lacks, unknown model, wrong API key) seen as the SDK's error classes with the field named. Run by ./run (registered in ctest); exits non-zero on the first failure.
import { spawn } from "node:child_process";
import { cpSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

const require = createRequire(import.meta.url);
const OpenAI = require(process.env.OPENAI_MODULE).default ?? require(process.env.OPENAI_MODULE);
const src = process.env.INGOT_SOURCE_DIR;
const KEY = "client-test-key";

// The demo model beside its tokenizer, as `make demo` lays it out.
const dir = mkdtempSync(join(tmpdir(), "ingot-openai-"));
for (const f of readdirSync(join(src, "models/demo"))) cpSync(join(src, "models/demo", f), join(dir, f));
for (const f of ["tokenizer.json", "tokenizer_config.json"])
  cpSync(join(process.env.INGOT_TOKENIZER_DIR, f), join(dir, f));

const server = spawn(process.env.INGOT_BINARY, [
  "serve", "--model", dir, "--port", "0", "--device", "cpu", "--threads", "2", "--slots", "2",
  "--capacity", "256", "--api-key", KEY, "--chat-template", join(src, "tests/data/server/chat_template.jinja"),
], { stdio: ["ignore", "pipe", "inherit"] });

function cleanup() {
  server.kill("SIGTERM");
  rmSync(dir, { recursive: true, force: true });
}

const port = await new Promise((resolve, reject) => {
  let out = "";
  const timer = setTimeout(() => reject(new Error("ingot serve did not start within 60 s: " + out)), 60000);
  server.stdout.on("data", (d) => {
    out += d;
    const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) { clearTimeout(timer); resolve(Number(m[1])); }
  });
  server.on("exit", (code) => reject(new Error(`ingot serve exited (${code}) before listening: ${out}`)));
});

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: KEY, maxRetries: 0, timeout: 120000 });
const messages = [{ role: "user", content: "Tell me a story about a cat." }];
let passed = 0;

async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok - ${name}`);
  } catch (e) {
    console.log(`FAILED - ${name}: ${e.stack || e}`);
    cleanup();
    process.exit(1);
  }
}

async function expectError(fn, status, cls, param, fragment) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    if (param !== undefined) assert.equal(e.param, param);
    if (fragment) assert.ok(e.message.includes(fragment), e.message);
    return;
  }
  assert.fail(`expected HTTP ${status}`);
}

let greedy = "";
await check("models.list names the served model", async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert.deepEqual(ids, [dir.split("/").pop()]);
});

await check("chat completion (greedy)", async () => {
  const r = await client.chat.completions.create({ model: dir.split("/").pop(), messages, max_tokens: 40, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  greedy = r.choices[0].message.content;
  assert.ok(greedy.length > 0);
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

await check("streamed chat equals the whole answer, with usage", async () => {
  const stream = await client.chat.completions.create({
    messages, max_tokens: 40, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "";
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, greedy);
  assert.ok(finish);
  assert.ok(usage && usage.completion_tokens > 0);
});

await check("stop string cuts the answer before it", async () => {
  assert.ok(greedy.length >= 4, greedy);
  const at = Math.floor(greedy.length / 2);
  const stop = greedy.slice(at, at + 2);
  const r = await client.chat.completions.create({ messages, max_tokens: 40, temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].message.content, greedy.slice(0, greedy.indexOf(stop)));
  assert.equal(r.choices[0].finish_reason, "stop");
});

await check("n = 2 gives two choices", async () => {
  const r = await client.chat.completions.create({ messages, max_tokens: 40, temperature: 0, n: 2 });
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  for (const c of r.choices) assert.equal(c.message.content, greedy);
  const s = await client.chat.completions.create({ messages, max_tokens: 20, temperature: 1, seed: 5, n: 2 });
  assert.equal(s.choices.length, 2);
});

await check("logprobs: the chosen tokens and their alternatives, whole and streamed", async () => {
  const r = await client.chat.completions.create({ messages, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  // The tokens spell the answer; an answer that ended at the end-of-sequence token has that token last.
  const text = r.choices[0].message.content, joined = content.map((e) => e.token).join("");
  const eos = r.choices[0].finish_reason === "stop" ? content[content.length - 1].token : "";
  assert.ok(joined === text || joined === text + eos, JSON.stringify({ joined, text }));
  for (const e of content) {
    assert.ok(Number.isFinite(e.logprob) && e.logprob <= 0, JSON.stringify(e));
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 3);
    // Greedy: the chosen token is the most likely one.
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, JSON.stringify(e));
    for (let k = 1; k < 3; ++k) assert.ok(e.top_logprobs[k].logprob <= e.top_logprobs[k - 1].logprob);
  }
  const stream = await client.chat.completions.create({
    messages, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3, stream: true,
  });
  const streamed = [];
  for await (const chunk of stream) for (const c of chunk.choices) if (c.logprobs) streamed.push(...c.logprobs.content);
  assert.deepEqual(streamed, content);
});

await check("completions with a text prompt, streamed and whole", async () => {
  const r = await client.completions.create({ model: dir.split("/").pop(), prompt: "Once upon a time,", max_tokens: 20, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.ok(r.choices[0].text.length > 0);
  const stream = await client.completions.create({ prompt: "Once upon a time,", max_tokens: 20, temperature: 0, stream: true });
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
  assert.equal(text, r.choices[0].text);
});

await check("errors arrive as the SDK's classes naming the field", async () => {
  await expectError(() => client.chat.completions.create({ messages, temperature: 5 }), 400, OpenAI.BadRequestError,
    "temperature", "[0, 2]");
  await expectError(() => client.chat.completions.create({ messages, logprobs: true, top_logprobs: 21 }), 400,
    OpenAI.BadRequestError, "top_logprobs", "[0, 20]");
  await expectError(() => client.chat.completions.create({ messages, top_logprobs: 2 }), 400, OpenAI.BadRequestError,
    "top_logprobs", "needs logprobs: true");
  await expectError(() => client.chat.completions.create({ messages, logit_bias: { "5": 10 } }), 400,
    OpenAI.BadRequestError, "logit_bias");
  await expectError(() => client.chat.completions.create({ messages, max_tokens: 5000 }), 400, OpenAI.BadRequestError,
    "max_tokens", "cache positions");
  await expectError(() => client.chat.completions.create({ model: "gpt-nope", messages }), 404, OpenAI.NotFoundError,
    "model", "gpt-nope");
  const wrong = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "wrong", maxRetries: 0 });
  await expectError(() => wrong.chat.completions.create({ messages }), 401, OpenAI.AuthenticationError, undefined,
    "invalid API key");
});

cleanup();
console.log(`${passed} checks passed`);
