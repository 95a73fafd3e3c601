// idle.mjs — a machine's idle stop in the web UI, in the Debian Chromium (playwright-core): the
// owner (KLOUD_USER, KLOUD_PASSWORD) logs in, the machines page's row of KLOUD_MACHINE_ID must
// show KLOUD_IDLE_TEXT in its Idle column, and the machine's page the same under "Idle stop",
// with the form that changes it (machine.set) and, with KLOUD_AUTOSTART_TEXT, the machine's
// autostart schedule. Screenshots machines-idle.png and
// machine-idle.png in KLOUD_ARTIFACTS. Prints one JSON line per step and a final {"ok": …};
// exit status 0 when every step passed. Run by e2e/idle_test.go.
import path from 'node:path';
import { chromium } from 'playwright-core';
import { log, step, poll, stepCounts } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL;
const id = env.KLOUD_MACHINE_ID;
const want = env.KLOUD_IDLE_TEXT;

const browser = await chromium.launch({
  executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  await step('log in', async () => {
    const r = await context.request.post(base + '/api/login', { data: { username: env.KLOUD_USER, password: env.KLOUD_PASSWORD } });
    if (!r.ok()) throw new Error(`login: ${r.status()} ${await r.text()}`);
  });
  await step('the machines page shows why the machine stopped', async () => {
    await page.goto(base + '/#/machines');
    const sel = `tr[data-machine="${id}"] .idle-cell`;
    const text = await poll(`${sel} says "${want}"`, async () => {
      const t = await page.textContent(sel, { timeout: 1000 });
      return t && t.includes(want) ? t : null;
    });
    await page.screenshot({ path: path.join(env.KLOUD_ARTIFACTS, 'machines-idle.png') });
    return { text };
  });
  await step('the machine page shows it, and the owner may change it', async () => {
    await page.goto(base + `/#/machines/${id}`);
    const text = await poll('#machine-idle', async () => {
      const t = await page.textContent('#machine-idle', { timeout: 1000 });
      return t && t.includes(want) ? t : null;
    });
    await page.waitForSelector('#idle-form', { timeout: 60000 });
    if (env.KLOUD_AUTOSTART_TEXT) {
      const a = await page.textContent('#autostart-status');
      if (!a.includes(env.KLOUD_AUTOSTART_TEXT)) throw new Error(`autostart shown as ${a}`);
    }
    await page.screenshot({ path: path.join(env.KLOUD_ARTIFACTS, 'machine-idle.png'), fullPage: true });
    return { text };
  });
  await context.close();
} finally {
  await browser.close();
}
const failed = stepCounts().failed > 0;
log({ ok: !failed, steps: stepCounts().run });
process.exit(failed ? 1 : 0);
