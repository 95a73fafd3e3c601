// lib.mjs — what the browser scripts (ui.mjs, update.mjs, ports.mjs) share: one JSON line per
// event on stdout, named steps, polling, asking the Go test that runs the script
// (e2e/browser_test.go runBrowserScript) to act, and axe-core's accessibility checks.
//
// A rule for every script: click by selector (page.click(sel)), never through an ElementHandle
// kept from an earlier query. The pages render their parts again when data arrives (a job
// ending, a machine changing state), and a kept handle is then detached: the click fails, or
// reads what the page no longer shows.

import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

export function log(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

// step runs one named step and prints its line: {"step", "ok": true, "ms", …what fn returned}
// or {"step", "ok": false, "ms", "error"}. A failed step throws again (the script stops there)
// unless keepGoing is set, when step returns false and the script carries on. stepCounts()
// says how many steps ran and how many of them failed, for the script's final line.
const counts = { run: 0, failed: 0 };
export const stepCounts = () => ({ ...counts });
export async function step(name, fn, { keepGoing = false } = {}) {
  const start = Date.now();
  counts.run++;
  try {
    const detail = await fn();
    log({ step: name, ok: true, ms: Date.now() - start, ...(detail || {}) });
    return true;
  } catch (e) {
    counts.failed++;
    log({ step: name, ok: false, ms: Date.now() - start, error: String(e && e.stack || e) });
    if (keepGoing) return false;
    throw e;
  }
}

// poll calls fn until it returns a truthy value or the deadline passes.
export async function poll(what, fn, timeout = 60000, every = 100) {
  const end = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`${what}: not after ${timeout} ms (last: ${last && last.message ? last.message : JSON.stringify(last)})`);
    await new Promise((r) => setTimeout(r, every));
  }
}

// ask prints {"need": what} for the test driving the script and waits for its answer line on
// stdin: "done", or what went wrong (then it throws).
const answers = [];
let wake = null;
let pending = '';
let listening = false;
export async function ask(what) {
  if (!listening) {
    listening = true;
    process.stdin.setEncoding('utf8');
    process.stdin.on('data', (d) => {
      pending += d;
      let i;
      while ((i = pending.indexOf('\n')) >= 0) {
        answers.push(pending.slice(0, i));
        pending = pending.slice(i + 1);
        if (wake) { const f = wake; wake = null; f(); }
      }
    });
  }
  log({ need: what });
  while (!answers.length) await new Promise((r) => { wake = r; });
  const a = answers.shift();
  if (a !== 'done') throw new Error(`asked for ${what}: ${a}`);
}

// watchNet keeps what a page's loads went through, for loginForm's answer and error: requests
// that failed (with the browser's reason), requests still waiting, and the page's own notes
// (boot.js's "kloud: reloading the page: …" when its modules did not load).
export function watchNet(page) {
  const net = { failed: [], pending: new Map(), notes: [], start: Date.now() };
  const at = () => `${Date.now() - net.start}ms`;
  const name = (r) => { const u = new URL(r.url()); return u.pathname; };
  page.on('request', (r) => net.pending.set(r, `${name(r)} since ${at()}`));
  page.on('requestfinished', (r) => net.pending.delete(r));
  page.on('requestfailed', (r) => {
    net.pending.delete(r);
    net.failed.push(`${at()} ${r.method()} ${name(r)}: ${r.failure() ? r.failure().errorText : 'failed'}`);
  });
  page.on('console', (m) => { if (m.text().startsWith('kloud: ')) net.notes.push(`${at()} ${m.text()}`); });
  page._kloudNet = net;
  return net;
}

// loginForm waits for the login form of a page that was just opened: the app's boot (its
// modules, then the login page) took over 30 s on a loaded CI host (4 test packages on 2 cores),
// so the first wait is long; if it never shows, the error says what the page showed instead and
// (with watchNet) which requests failed or never ended. It returns the page's notes and failed
// requests when there were any (a reload by boot.js, say), for the step's line.
export async function loginForm(page, timeout = 90000) {
  const net = page._kloudNet;
  try {
    await page.waitForSelector('#login-username', { timeout });
  } catch (e) {
    const shown = await page.evaluate(() => `${location.href}: ${document.body ? document.body.innerText.slice(0, 300) : '(no body)'}`).catch((x) => String(x));
    // What the page had fetched by then (a module that never arrived is missing from the list).
    const fetched = await page.evaluate(() => performance.getEntriesByType('resource')
      .map((r) => `${new URL(r.name).pathname} ${Math.round(r.duration)}ms`)).catch((x) => [String(x)]);
    let more = '';
    if (net) more = `\nfailed: ${JSON.stringify(net.failed)}\nnever ended: ${JSON.stringify([...net.pending.values()])}\nnotes: ${JSON.stringify(net.notes)}`;
    throw new Error(`${e.message}\nthe page shows ${JSON.stringify(shown)}\nit fetched: ${fetched.join(', ')}${more}`);
  }
  if (!net || (!net.failed.length && !net.notes.length)) return {};
  return { failed: net.failed, notes: net.notes };
}

// launchChromium starts the Debian Chromium ($KLOUD_CHROMIUM, default /usr/bin/chromium)
// headless, with nothing of its own on the network (no background fetches, updates, sync or
// QUIC); extraArgs are added to its command line.
export async function launchChromium(extraArgs = []) {
  const { chromium } = await import('playwright-core');
  return chromium.launch({
    executablePath: process.env.KLOUD_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', ...extraArgs],
  });
}

// wcagTags are the axe-core rules every page passes (docs/CONTRIBUTING.md, "Accessibility").
export const wcagTags = ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'];

// axeViolations runs axe-core (npm axe-core) with the rules of wcagTags on what page shows now
// and returns its violations: [{rule, impact, help, targets (the first 10 elements' selectors),
// nodes (how many elements)}].
export async function axeViolations(page) {
  // The library defines window.axe (again after a reload).
  await page.evaluate(readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8'));
  const run = () => page.evaluate(async (tags) => {
    const r = await window.axe.run(document, { runOnly: { type: 'tag', values: tags }, resultTypes: ['violations'] });
    return r.violations.map((v) => ({ rule: v.id, impact: v.impact, help: v.help, targets: v.nodes.map((n) => n.target.join(' ')).slice(0, 10), nodes: v.nodes.length }));
  }, wcagTags);
  // A page that rendered part of itself again during the run (data arriving) can make axe
  // fail on a removed node: once more then.
  return run().catch(run);
}

// violationLine is one violation as a line: rule (impact) help: the elements.
export const violationLine = (v) => `${v.rule} (${v.impact}) ${v.help}: ${v.targets.join(', ')}${v.nodes > v.targets.length ? ` (+${v.nodes - v.targets.length})` : ''}`;

// axeCheck throws, listing the violations, when axe-core finds any on what page shows now
// (what names it in the error).
export async function axeCheck(page, what) {
  const vs = await axeViolations(page);
  if (vs.length) throw new Error(`axe-core on ${what}: ${vs.length} violations:\n${vs.map(violationLine).join('\n')}`);
}
