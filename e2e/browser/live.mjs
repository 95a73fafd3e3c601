// live.mjs — pages that update themselves (issue 22 §4), in the Debian Chromium
// (playwright-core). The owner (KLOUD_USER, KLOUD_PASSWORD) opens the machines page and the page
// of stack KLOUD_STACK_ID; a third page of hers is the "API client": it calls machine.stop and
// machine.start on KLOUD_MACHINE_ID over its own kite connection, KLOUD_CHANGES times each,
// taking the time right before each call. A MutationObserver in each watched page stamps when
// the machine's row first shows a new state, with the machine's updatedAt the row shows (when
// kloud wrote that state: the store's clock, this host's). The script prints every latency of
// kloud's write → the DOM (stamp − updatedAt) and of the call → the DOM (stamp − the time
// before the call, which adds the call and the job's start), their medians per page, and fails
// when a page's median write → DOM passes KLOUD_MAX_MEDIAN_MS.
// Then nothing changes for KLOUD_QUIET_MS: the two pages must send no HTTP request and no
// WebSocket frame but answers to kloud's pings and their own kite.ping. Screenshots
// live-machines.png and live-stack.png in KLOUD_ARTIFACTS. One JSON line per step and a final
// {"ok": …}. Run by e2e/live_test.go.
import path from 'node:path';
import { log, step, poll, stepCounts, launchChromium } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL;
const mid = env.KLOUD_MACHINE_ID;
const sid = env.KLOUD_STACK_ID;
const changes = Number(env.KLOUD_CHANGES || 3);
const quietMs = Number(env.KLOUD_QUIET_MS || 15000);
const maxMedian = Number(env.KLOUD_MAX_MEDIAN_MS || 200);
const row = `tr[data-machine="${mid}"]`;

// watch counts what page sends: HTTP requests, and WebSocket frames other than its own
// kite.ping and its answers to kloud's requests (pings).
function watch(page, name) {
  const seen = { name, http: [], frames: [], pings: 0 };
  page.on('request', (r) => seen.http.push(`${r.method()} ${new URL(r.url()).pathname}`));
  page.on('websocket', (ws) => ws.on('framesent', (f) => {
    let m = null;
    try { m = JSON.parse(typeof f.payload === 'string' ? f.payload : f.payload.toString()); } catch { /* not JSON */ }
    if (m && (m.method === 'kite.ping' || (!m.method && m.id !== undefined))) { seen.pings++; return; }
    seen.frames.push(m && m.method ? m.method : String(f.payload).slice(0, 80));
  }));
  return seen;
}

// stamp installs a MutationObserver that records when the machine's row first shows each
// new state (window.__states: [{state, at}]).
async function stamp(page) {
  await page.evaluate((sel) => {
    window.__states = [];
    let last = document.querySelector(sel) && document.querySelector(sel).dataset.state;
    new MutationObserver(() => {
      const r = document.querySelector(sel);
      const s = r && r.dataset.state;
      if (s && s !== last) {
        last = s;
        window.__states.push({ state: s, at: Date.now(), updated: Date.parse(r.dataset.updated) });
      }
    }).observe(document.body, { subtree: true, childList: true, attributes: true, attributeFilter: ['data-state'] });
  }, row);
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };

const browser = await launchChromium();
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  await step('log in', async () => {
    const r = await context.request.post(base + '/api/login', { data: { username: env.KLOUD_USER, password: env.KLOUD_PASSWORD } });
    if (!r.ok()) throw new Error(`login: ${r.status()} ${await r.text()}`);
  });
  const machines = await context.newPage();
  const stack = await context.newPage();
  const api = await context.newPage();
  const seenM = watch(machines, 'machines');
  const seenS = watch(stack, 'stack');
  await step('open the machines page and the stack page', async () => {
    await machines.goto(base + '/#/machines');
    await stack.goto(base + `/#/stacks/${sid}`);
    for (const p of [machines, stack]) {
      await p.waitForSelector(`${row}[data-state="Running"]`, { timeout: 90000 });
      await stamp(p);
    }
  });
  await step('the API client connects', async () => {
    await api.goto(base + '/#/stacks');
    await api.waitForSelector('#conn.conn-open', { timeout: 90000 });
    await api.evaluate(async () => {
      const { Kite, kiteURL } = await import('/static/js/kite.js');
      const { getSession } = await import('/static/js/session.js');
      const k = new Kite({ url: kiteURL(), auth: () => ({ type: 'session', key: getSession().session }) });
      k.connect();
      await k.call('kloud.version', {});
      window.__api = k;
    });
  });

  const lat = { machines: [], stack: [] }; // kloud's write → DOM
  const call = { machines: [], stack: [] }; // the call → DOM
  const change = async (method, want) => {
    const counts = await Promise.all([machines, stack].map((p) => p.evaluate(() => window.__states.length)));
    const t0 = await api.evaluate(async ([m, id]) => {
      const t = Date.now();
      await window.__api.call(m, { machineId: id });
      return t;
    }, [method, mid]);
    const out = {};
    for (const [i, [name, p]] of [['machines', machines], ['stack', stack]].entries()) {
      const first = await poll(`${name} page shows the machine's next state`, () => p.evaluate((n) => window.__states[n] || null, counts[i]), 60000, 20);
      if (!(first.updated > 0)) throw new Error(`${name}: the row shows no updatedAt: ${JSON.stringify(first)}`);
      lat[name].push(first.at - first.updated);
      call[name].push(first.at - t0);
      out[name] = { first: first.state, writeToDomMs: first.at - first.updated, callToDomMs: first.at - t0 };
      await p.waitForSelector(`${row}[data-state="${want}"]`, { timeout: 120000 });
    }
    return out;
  };
  // A second between changes, as a user's clicks: the pages' reads and the calls all count
  // against alice's rate limit (20 calls a second).
  const pause = () => new Promise((r) => setTimeout(r, 1000));
  for (let i = 0; i < changes; i++) {
    await step(`stop ${i + 1}: both pages show it`, () => change('machine.stop', 'Stopped'));
    await pause();
    await step(`start ${i + 1}: both pages show it`, () => change('machine.start', 'Running'));
    await pause();
  }
  await machines.screenshot({ path: path.join(env.KLOUD_ARTIFACTS, 'live-machines.png') });
  await stack.screenshot({ path: path.join(env.KLOUD_ARTIFACTS, 'live-stack.png'), fullPage: true });
  await step("latency: kloud's write → the page shows the change", async () => {
    const res = { machinesMs: lat.machines, stackMs: lat.stack, machinesMedianMs: median(lat.machines), stackMedianMs: median(lat.stack), maxMedianMs: maxMedian,
      callMachinesMs: call.machines, callStackMs: call.stack };
    log({ figure: "live latency, kloud's write → DOM (ms, median)", machines: res.machinesMedianMs, stack: res.stackMedianMs });
    log({ figure: 'live latency, call → DOM (ms, median)', machines: median(call.machines), stack: median(call.stack) });
    if (res.machinesMedianMs > maxMedian || res.stackMedianMs > maxMedian) throw new Error(`median over ${maxMedian} ms: ${JSON.stringify(res)}`);
    return res;
  });
  await step(`nothing changes for ${quietMs} ms: the pages send nothing but pings`, async () => {
    // Let the last start's tail (the agent registering again, the job's end) settle first.
    await new Promise((r) => setTimeout(r, 3000));
    for (const s of [seenM, seenS]) { s.http.length = 0; s.frames.length = 0; s.pings = 0; }
    await new Promise((r) => setTimeout(r, quietMs));
    const res = Object.fromEntries([seenM, seenS].map((s) => [s.name, { http: [...s.http], frames: [...s.frames], pings: s.pings }]));
    if ([seenM, seenS].some((s) => s.http.length || s.frames.length)) throw new Error(`requests while nothing changed: ${JSON.stringify(res)}`);
    return res;
  });
  await context.close();
} finally {
  await browser.close();
}
const failed = stepCounts().failed > 0;
log({ ok: !failed, steps: stepCounts().run });
process.exit(failed ? 1 : 0);
