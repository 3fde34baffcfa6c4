// Runs ingot's ONNX exports in ONNX Runtime (the onnxruntime-node package, CPU) over the transformers
// reference of their checkpoint (docs/reference-format.md) and judges them as `ingot check` judges the
// engine: full prefill, token-by-token decode at write indices, random chunk splits, rows at different
// write indices in one call, greedy generation; and checks that every cache slot a call does not write keeps its bytes.
// Qwen3.5 exports' linear states (past_conv_state.{i}, past_recurrent_state.{i}, f32) travel with the caches:
// fed back call to call, copied whole per row in the mixed case, and stale random bytes in the row at write
// index 0, which the graph must not read.
//
//   node check.mjs EXPORT_DIR=REFERENCE.safetensors ...      (ORT_MODULE: path of onnxruntime-node)
//
// Tolerances are the project's (docs/reference-format.md, "Tolerances"): f32 allclose(atol 1e-4, rtol
// 1e-4) with every next token agreeing; 16-bit weights with f32 activations: mean |Δ| <= 4·u·s, per-logit
// |Δ| <= 48·u·s; f16 compute (16-bit activations): mean 4·u·s·√(L/2), max 64·u·s·√(L/2); next-token
// agreement where the reference's top-2 margin is at least the max bound (s = RMS of the reference logits,
// u = 2^-8 bf16, 2^-11 fp16, L = layers). Exit 1 on any failure.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const require = createRequire(import.meta.url);
const ort = require(process.env.ORT_MODULE || 'onnxruntime-node');

function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const base = 8 + n;
  const out = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [a, b] = t.data_offsets;
    const bytes = buf.buffer.slice(buf.byteOffset + base + a, buf.byteOffset + base + b);
    const data = t.dtype === 'F32' ? new Float32Array(bytes) : t.dtype === 'I64' ? new BigInt64Array(bytes) : null;
    if (!data) throw new Error(`${file}: tensor ${name} has dtype ${t.dtype}, not F32 or I64`);
    out[name] = { shape: t.shape, data };
  }
  return out;
}

// Seeded generator (mulberry32), so every run draws the same splits and stale bytes.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// f32 -> IEEE half bits, round to nearest even; normal range only (the stale values are in [-4, 4]).
function f16bits(x) {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 16) & 0x8000;
  const exp = ((u >>> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return sign;
  let mant = u & 0x7fffff;
  let h = sign | (exp << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h += 1;
  return h;
}

class Export {
  constructor(dir, session, contract) {
    this.dir = dir;
    this.session = session;
    this.c = contract;
    this.cacheType = contract.cache.dtype;  // float32 | float16
    this.cacheInputs = contract.inputs.filter((i) => i.name.startsWith('past_key_values.'));
    // Qwen3.5's linear layers: f32 conv and recurrent states, one whole [..] block per row.
    this.stateInputs = contract.inputs.filter((i) => i.name.startsWith('past_conv_state.') || i.name.startsWith('past_recurrent_state.'));
    this.stateElems = (i) => i.shape.slice(1).reduce((a, b) => a * b, 1);
    this.rowElems = contract.cache.layout === 'heads_first'
      ? contract.cache.kv_heads * contract.cache.capacity * contract.cache.head_dim
      : contract.cache.capacity * contract.cache.kv_heads * contract.cache.head_dim;
  }
  cacheShape(B) {
    const c = this.c.cache;
    return c.layout === 'heads_first' ? [B, c.kv_heads, c.capacity, c.head_dim] : [B, c.capacity, c.kv_heads * c.head_dim];
  }
  newCache(B) {  // zeros, as a runtime allocates
    const caches = {};
    for (const i of this.cacheInputs) {
      const n = B * this.rowElems;
      caches[i.name] = this.cacheType === 'float16' ? new Uint16Array(n) : new Float32Array(n);
    }
    for (const i of this.stateInputs) caches[i.name] = new Float32Array(B * this.stateElems(i));
    return caches;
  }
  isState(name) { return !name.startsWith('past_key_values.'); }
  typeOf(name) { return this.isState(name) ? 'float32' : this.cacheType; }
  shapeOf(name, B) {
    if (!this.isState(name)) return this.cacheShape(B);
    return [B, ...this.stateInputs.find((i) => i.name === name).shape.slice(1)];
  }
  presentName(name) {
    return name.startsWith('past_key_values.') ? name.replace('past_key_values.', 'present.') : name.replace(/^past_/, 'present_');
  }
  // Slot s of row r, element e within the slot, as a flat index (both layouts).
  slotIndices(r, s) {
    const c = this.c.cache, out = [];
    if (c.layout === 'heads_first') {
      for (let h = 0; h < c.kv_heads; ++h)
        for (let d = 0; d < c.head_dim; ++d) out.push(r * this.rowElems + (h * c.capacity + s) * c.head_dim + d);
    } else {
      const w = c.kv_heads * c.head_dim;
      for (let d = 0; d < w; ++d) out.push(r * this.rowElems + s * w + d);
    }
    return out;
  }
  // ids: array of B rows of S ids; wi: B write indices; caches: {past name: typed array [B, ...]}.
  async run(ids, wi, caches) {
    const B = ids.length, S = ids[0].length;
    const feeds = {
      input_ids: new ort.Tensor('int64', BigInt64Array.from(ids.flat().map(BigInt)), [B, S]),
      write_indices: new ort.Tensor('int64', BigInt64Array.from(wi.map(BigInt)), [B]),
    };
    for (const [name, data] of Object.entries(caches)) feeds[name] = new ort.Tensor(this.typeOf(name), data, this.shapeOf(name, B));
    const out = await this.session.run(feeds);
    const present = {};
    for (const name of Object.keys(caches)) present[name] = out[this.presentName(name)].data;
    return { logits: out.logits.data, present };  // logits [B, S, vocab] f32
  }
}

function argmax(a, off, n) {
  let b = 0;
  for (let i = 1; i < n; ++i) if (a[off + i] > a[off + b]) b = i;
  return b;
}
function margin(a, off, n) {  // top-1 minus top-2
  let m1 = -Infinity, m2 = -Infinity;
  for (let i = 0; i < n; ++i) {
    const v = a[off + i];
    if (v > m1) { m2 = m1; m1 = v; } else if (v > m2) m2 = v;
  }
  return m1 - m2;
}

// Accumulates one case's comparison of our rows against reference positions.
class Judge {
  constructor(tol, V) { this.tol = tol; this.V = V; this.max = 0; this.sum = 0; this.n = 0; this.bad = 0;
    this.agree = 0; this.required = 0; this.flips = 0; this.nan = false; }
  // ours[oOff .. +V) against ref[rOff .. +V)
  add(ours, oOff, ref, rOff) {
    const { atol, rtol } = this.tol, V = this.V;
    for (let i = 0; i < V; ++i) {
      const a = ours[oOff + i], b = ref[rOff + i];
      if (!Number.isFinite(a)) this.nan = true;
      const d = Math.abs(a - b);
      this.max = Math.max(this.max, d);
      this.sum += d;
      ++this.n;
      if (!(d <= atol + rtol * Math.abs(b))) ++this.bad;
    }
    const same = argmax(ours, oOff, V) === argmax(ref, rOff, V);
    this.agree += same;
    const needed = this.tol.allTokens || margin(ref, rOff, V) >= this.tol.tie;
    if (needed) { ++this.required; if (!same) ++this.flips; }
  }
  get mean() { return this.sum / Math.max(1, this.n); }
  get ok() {
    return !this.nan && this.bad === 0 && this.flips === 0 && (this.tol.mean === undefined || this.mean <= this.tol.mean);
  }
}

// compute: the export's arithmetic dtype (contract.compute_dtype); layers: the model's. 16-bit
// activations round the residual stream at every layer, so their bounds (the project's GPU row:
// mean 4, max 64 u·s) grow with sqrt(layers / 2), as ingot check's do.
function tolerances(dtype, compute, layers, refLogits) {
  if (dtype === 'f32') return { atol: 1e-4, rtol: 1e-4, allTokens: true, tie: 0, label: 'allclose(1e-4, 1e-4)' };
  let ss = 0;
  for (const v of refLogits) ss += v * v;
  const s = Math.sqrt(ss / refLogits.length);
  const u = dtype === 'bf16' ? 2 ** -8 : 2 ** -11;
  const act16 = compute !== 'f32';
  const depth = act16 ? Math.sqrt(Math.max(1, layers / 2)) : 1;
  const atol = (act16 ? 64 : 48) * u * s * depth, mean = 4 * u * s * depth;
  return { atol, rtol: 0, mean, allTokens: false, tie: atol,
    label: `max <= ${atol.toExponential(2)}, mean <= ${mean.toExponential(2)}` };
}

async function checkOne(dir, refFile) {
  const contract = JSON.parse(fs.readFileSync(path.join(dir, 'ingot_export.json'), 'utf8'));
  const session = await ort.InferenceSession.create(path.join(dir, contract.model), { executionProviders: ['cpu'], intraOpNumThreads: 1, logSeverityLevel: 3 });
  const ex = new Export(dir, session, contract);
  const ref = readSafetensors(refFile);
  const [N, S] = ref.input_ids.shape, V = contract.vocab_size;
  if (ref.logits.shape[2] !== V) throw new Error(`${refFile}: vocab ${ref.logits.shape[2]} but the export has ${V}`);
  const ids = [...Array(N)].map((_, r) => [...Array(S)].map((_, s) => Number(ref.input_ids.data[r * S + s])));
  const R = ref.logits.data;
  const tol = tolerances(contract.weight_dtype, contract.compute_dtype || 'f32', contract.mask.window.length, R);
  const refOff = (r, s) => (r * S + s) * V;
  const cases = [];
  const judge = (name) => { const j = new Judge(tol, V); j.name = name; cases.push(j); return j; };

  // Full prefill of every row at write index 0.
  {
    const j = judge('prefill');
    const { logits } = await ex.run(ids, Array(N).fill(0), ex.newCache(N));
    for (let r = 0; r < N; ++r) for (let s = 0; s < S; ++s) j.add(logits, (r * S + s) * V, R, refOff(r, s));
  }
  // One token at a time, write index = tokens so far, each call's present fed back as past.
  {
    const j = judge('decode');
    let caches = ex.newCache(N);
    for (let s = 0; s < S; ++s) {
      const { logits, present } = await ex.run(ids.map((row) => [row[s]]), Array(N).fill(s), caches);
      for (let r = 0; r < N; ++r) j.add(logits, r * V, R, refOff(r, s));
      caches = present;
    }
  }
  // Random chunk splits (1-7 tokens), all rows together.
  {
    const j = judge('chunks');
    const rand = rng(1234);
    let caches = ex.newCache(N);
    for (let w = 0; w < S;) {
      const len = Math.min(S - w, 1 + Math.floor(rand() * 7));
      const { logits, present } = await ex.run(ids.map((row) => row.slice(w, w + len)), Array(N).fill(w), caches);
      for (let r = 0; r < N; ++r) for (let s = 0; s < len; ++s) j.add(logits, (r * len + s) * V, R, refOff(r, w + s));
      caches = present;
      w += len;
    }
  }
  // Rows at different write indices in one call: each row prefilled alone (B = 1) to its own length,
  // the rows stacked into one cache whose unwritten slots hold stale finite bytes (as a reused row
  // does), then one call of k tokens per row. The stale slots must stay hidden (logits still match)
  // and every slot outside [w_r, w_r + k) must keep its bytes.
  let kept = true, keptSlots = 0;
  {
    const j = judge('mixed');
    const k = 4;
    // Spread over [0, S - k] (0, 7, 13, 20 for the fixtures' 4 rows of 24); a single row starts late.
    const offsets = [...Array(N)].map((_, r) => (N === 1 ? S - k : Math.round((r * (S - k)) / (N - 1))));
    const caches = ex.newCache(N);
    const rand = rng(99);
    // Stale bytes everywhere, the linear states too: a row at write index 0 must not read its state.
    for (const [name, data] of Object.entries(caches))
      for (let i = 0; i < data.length; ++i) {
        const v = (rand() * 2 - 1) * 4;
        data[i] = ex.typeOf(name) === 'float16' ? f16bits(v) : v;
      }
    for (let r = 0; r < N; ++r) {
      const w = offsets[r];
      if (w === 0) continue;
      const { present } = await ex.run([ids[r].slice(0, w)], [0], ex.newCache(1));
      for (const name of Object.keys(caches)) {
        if (ex.isState(name)) {  // a linear state is the whole carry of its row's first w tokens
          const n = present[name].length;
          caches[name].set(present[name], r * n);
          continue;
        }
        for (let s = 0; s < w; ++s) {
          const src = ex.slotIndices(0, s), dst = ex.slotIndices(r, s);
          for (let e = 0; e < src.length; ++e) caches[name][dst[e]] = present[name][src[e]];
        }
      }
    }
    const { logits, present } = await ex.run(ids.map((row, r) => row.slice(offsets[r], offsets[r] + k)), offsets, caches);
    for (let r = 0; r < N; ++r) for (let s = 0; s < k; ++s) j.add(logits, (r * k + s) * V, R, refOff(r, offsets[r] + s));
    for (const name of Object.keys(caches).filter((n) => !ex.isState(n)))  // states are rewritten whole
      for (let r = 0; r < N; ++r)
        for (let s = 0; s < contract.cache.capacity; ++s) {
          if (s >= offsets[r] && s < offsets[r] + k) continue;
          for (const i of ex.slotIndices(r, s)) {
            // Byte identity: compare the stored bit patterns (NaN-safe).
            const a = caches[name], b = present[name];
            const same = ex.cacheType === 'float16' ? a[i] === b[i] : Object.is(a[i], b[i]);
            if (!same) kept = false;
          }
          ++keptSlots;
        }
  }
  // Greedy generation through the graph (prefill the prompt, then one decode call per token, the pick
  // fed back), against the reference's greedy continuation. f32: every token must agree. 16-bit: tokens
  // must agree up to the first step whose reference top-2 margin (greedy_margin) is below the bound,
  // since the two runs see the same tokens only until then; without margins they are reported only.
  let greedy = null;
  if (ref.greedy_ids && ref.greedy_prompt_len) {
    const P = Number(ref.greedy_prompt_len.data[0]), T = ref.greedy_ids.shape[1], G = T - P;
    const gid = (r, t) => Number(ref.greedy_ids.data[r * T + t]);
    if (P + G - 1 > contract.cache.capacity) throw new Error(`greedy case needs ${P + G - 1} slots, capacity ${contract.cache.capacity}`);
    const prompts = [...Array(N)].map((_, r) => [...Array(P)].map((_, t) => gid(r, t)));
    let { logits, present: caches } = await ex.run(prompts, Array(N).fill(0), ex.newCache(N));
    const ours = [...Array(N)].map(() => []);
    let last = [...Array(N)].map((_, r) => argmax(logits, (r * P + P - 1) * V, V));
    for (let g = 0; g < G; ++g) {
      last.forEach((t, r) => ours[r].push(t));
      if (g === G - 1) break;
      const out = await ex.run(last.map((t) => [t]), Array(N).fill(P + g), caches);
      caches = out.present;
      last = [...Array(N)].map((_, r) => argmax(out.logits, r * V, V));
    }
    let same = 0, judged = 0, wrong = 0;
    for (let r = 0; r < N; ++r) {
      let fragileFrom = G;
      if (!tol.allTokens && ref.greedy_margin) {
        for (let g = 0; g < G; ++g) if (ref.greedy_margin.data[r * G + g] < tol.tie) { fragileFrom = g; break; }
      } else if (!tol.allTokens) fragileFrom = 0;  // nothing tells a fragile step: report only
      let diverged = false;
      for (let g = 0; g < G; ++g) {
        const eq = ours[r][g] === gid(r, P + g);
        if (!diverged) same += eq;
        if (!diverged && g < fragileFrom) { ++judged; if (!eq) ++wrong; }
        if (!eq) diverged = true;
      }
    }
    greedy = { same, total: N * G, judged, ok: wrong === 0 };
  }
  await session.release?.();
  return { dir, contract, tol, cases, kept, keptSlots, greedy };
}

const pairs = process.argv.slice(2);
if (!pairs.length) { console.error('usage: node check.mjs EXPORT_DIR=REFERENCE.safetensors ...'); process.exit(2); }
let failed = 0;
const summary = [];
console.log('export | case | max |Δ| | mean |Δ| | next-token agree | bound | result');
for (const p of pairs) {
  const [dir, refFile] = p.split('=');
  let res;
  try {
    res = await checkOne(dir, refFile);
  } catch (e) {
    console.log(`${path.basename(dir)} | load/run | - | - | - | - | FAIL: ${e.message}`);
    ++failed;
    continue;
  }
  let worst = 0, agree = 0, total = 0, ok = res.kept;
  for (const j of res.cases) {
    console.log(`${path.basename(dir)} | ${j.name} | ${j.max.toExponential(2)} | ${j.mean.toExponential(2)} | ` +
      `${j.agree}/${j.n / j.V} | ${res.tol.label} | ${j.ok ? 'ok' : 'FAIL'}` +
      (j.bad ? ` (${j.bad} logits out of bound)` : '') + (j.flips ? ` (${j.flips} required tokens differ)` : '') +
      (j.nan ? ' (non-finite logits)' : ''));
    worst = Math.max(worst, j.max);
    agree += j.agree;
    total += j.n / j.V;
    ok = ok && j.ok;
  }
  console.log(`${path.basename(dir)} | unwritten slots keep their bytes | ${res.keptSlots} slots | ${res.kept ? 'ok' : 'FAIL'}`);
  if (res.greedy) {
    console.log(`${path.basename(dir)} | greedy | tokens equal until the first difference ${res.greedy.same}/${res.greedy.total}, ` +
      `${res.greedy.judged} judged | ${res.greedy.ok ? 'ok' : 'FAIL'}`);
    ok = ok && res.greedy.ok;
  }
  if (!ok) ++failed;
  summary.push({ name: path.basename(dir), c: res.contract, worst, agree, total, ok });
}
console.log('\nsummary: export | target | dtype | compute | layout | max |Δlogit| | next-token agreement | result');
for (const s of summary)
  console.log(`${s.name} | ${s.c.target} | ${s.c.weight_dtype} | ${s.c.compute_dtype} | ${s.c.cache.layout} | ${s.worst.toExponential(2)} | ` +
    `${s.agree}/${s.total} | ${s.ok ? 'ok' : 'FAIL'}`);
console.log(`\n${pairs.length - failed} of ${pairs.length} exports pass`);
process.exit(failed ? 1 : 0);
