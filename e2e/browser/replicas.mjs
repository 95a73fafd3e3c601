// replicas.mjs — the browser terminal across kloud replicas behind a load balancer (run by
// e2e/replicas_test.go): alice logs in through the balancer's URL, opens machine
// $KLOUD_MACHINE_ID's terminal, types `echo hello-$((6*7))` and reads hello-42; the test checks
// in the balancer's log that the terminal's WebSocket went to another replica than the agent's
// ({"need": "landed"}: "done", or "same" and the page reloads so the next WebSocket goes to the
// next replica); then the test SIGKILLs the agent's replica ({"need": "kill"}): the agent
// registers again on another replica, the tab reattaches to the same session and runs
// `echo after-$((6*7+1))`, and a reloaded page replays both lines. Prints one JSON line per step and a final
// {"ok": …}; exit status 0 when every step passed.
//
// Env: KLOUD_URL (the balancer), KLOUD_USER, KLOUD_PASSWORD, KLOUD_MACHINE_ID, KLOUD_ARTIFACTS,
// KLOUD_CHROMIUM.

import { join } from 'node:path';
import { mkdirSync } from 'node:fs';
import { log, poll, ask, step, stepCounts, loginForm, watchNet, launchChromium } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL;
const user = env.KLOUD_USER || 'alice';
const machineID = env.KLOUD_MACHINE_ID;
const artifacts = env.KLOUD_ARTIFACTS || 'artifacts';
mkdirSync(artifacts, { recursive: true });

const t0 = Date.now();
const pageErrors = [];
let outage = false; // while the test has a replica down, failed WebSockets are expected
let browser;
let page;

const termLines = async () => (await page.evaluate(() => window.kloudDebug && window.kloudDebug.termText())) || [];
const hasLine = async (want) => (await termLines()).some((l) => l.trim() === want);
const shot = async (name) => { const p = join(artifacts, name); await page.screenshot({ path: p }); return p; };

async function main() {
  await step('log in through the balancer', async () => {
    browser = await launchChromium();
    page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    page.setDefaultTimeout(60000);
    watchNet(page);
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    page.on('console', (m) => {
      if (m.type() !== 'error' || m.text().startsWith('Failed to load resource')) return;
      if (outage && /WebSocket connection to .* failed/.test(m.text())) return;
      pageErrors.push('console: ' + m.text());
    });
    const resp = await page.goto(base + '/');
    const replica = resp.headers()['x-kloud-replica'];
    if (!replica) throw new Error('the page came without X-Kloud-Replica: not through the balancer?');
    await loginForm(page);
    await page.fill('#login-username', user);
    await page.fill('#login-password', env.KLOUD_PASSWORD || '');
    await page.click('#login-submit');
    await page.waitForSelector('#conn.conn-open');
    return { pageFrom: replica };
  });

  let session;
  await step('open the terminal and run echo hello-$((6*7))', async () => {
    await page.goto(base + '/#/machines');
    await page.click(`tr[data-machine="${machineID}"] .term-open`);
    await page.waitForSelector('.term-pane.active[data-state="connected"]', { timeout: 90000 });
    session = await page.getAttribute('.term-pane.active', 'data-session');
    await poll('shell prompt', async () => (await termLines()).some((l) => l.trim() !== ''), 60000);
    await page.click('.term-pane.active .term-host');
    await page.keyboard.type('echo hello-$((6*7))');
    await page.keyboard.press('Enter');
    await poll('hello-42 in the xterm buffer', () => hasLine('hello-42'), 60000);
    return { session, screenshot: await shot('terminal.png') };
  });

  await step("the terminal's replica is not the agent's", async () => {
    for (let i = 0; ; i++) {
      try {
        await ask('landed');
        return { reloads: i };
      } catch (e) {
        if (!String(e.message).endsWith(': same') || i >= 8) throw e;
      }
      // Same replica: reload; the tab reattaches over a new WebSocket, which the balancer sends
      // to the next replica.
      await page.reload();
      await page.waitForSelector('#conn.conn-open');
      await page.waitForSelector('.term-pane.active[data-state="connected"]', { timeout: 90000 });
      const again = await page.getAttribute('.term-pane.active', 'data-session');
      if (again !== session) throw new Error(`after reload the tab is on session ${again}, not ${session}`);
      await poll('hello-42 replayed after reload', () => hasLine('hello-42'), 60000);
    }
  });

  await step("the agent's replica SIGKILLed: the terminal reattaches and replays", async () => {
    outage = true;
    const killed = Date.now();
    await ask('kill');
    // The relay through the dead replica drops and the tab reconnects once the agent is back;
    // the drop may be too short to see, so it is noted, not required. Typing until the shell
    // answers is what a user does: a tab that shows "connected" on a dead relay never gets it.
    let dropped = false;
    const seen = () => page.getAttribute('.term-pane.active', 'data-state').then((s) => { dropped ||= s !== 'connected'; return s; });
    await poll('the terminal drops', async () => (await seen()) !== 'connected', 15000, 50).catch(() => {});
    await poll('the terminal connected again', async () => (await seen()) === 'connected', 120000, 100);
    let typed = 0;
    await poll('after-43 in the xterm buffer', async () => {
      if (await hasLine('after-43')) return true;
      if (typed++ % 150 === 0) { // every 15 s
        await page.click('.term-pane.active .term-host');
        await page.keyboard.type('echo after-$((6*7+1))');
        await page.keyboard.press('Enter');
      }
      return false;
    }, 120000, 100);
    const back = Date.now() - killed;
    const again = await page.getAttribute('.term-pane.active', 'data-session');
    if (again !== session) throw new Error(`after the replica died the tab is on session ${again}, not ${session}`);
    // A fresh page has an empty buffer: what it shows now is the session's replay, through
    // whichever replica the balancer gives it and the agent's new one.
    await page.reload();
    await page.waitForSelector('#conn.conn-open');
    await page.waitForSelector('.term-pane.active[data-state="connected"]', { timeout: 90000 });
    await poll('hello-42 and after-43 replayed in a reloaded page', async () => await hasLine('hello-42') && hasLine('after-43'), 60000);
    outage = false;
    return { workingAgainMs: back, droppedSeen: dropped, typed: Math.ceil(typed / 150), screenshot: await shot('terminal-after-failover.png') };
  });
}

let ok = false;
try {
  await main();
  if (pageErrors.length) throw new Error('errors in the page:\n' + pageErrors.join('\n'));
  ok = true;
} catch (e) {
  if (page) {
    try { await shot('failure.png'); } catch { /* the page is gone */ }
  }
  log({ error: String(e && e.message || e), pageErrors });
} finally {
  if (browser) await browser.close().catch(() => {});
}
log({ ok, ms: Date.now() - t0, steps: stepCounts().run });
process.exit(ok ? 0 : 1);
