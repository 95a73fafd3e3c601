// ports.mjs — a machine's web server through kloud, in the Debian Chromium (playwright-core):
// each user of KLOUD_USERS (JSON [{name, password, want: "ok"|"refused"}]) logs in on kloud's
// origin (POST /api/login in the browser context, so the session cookie is the browser's), opens
// KLOUD_OPEN_URL (kloud's /api/machines/ID/ports/PORT/open) and must land on the app's own
// origin showing KLOUD_MARKER ("ok"), or be refused without ever seeing it ("refused"). For an
// "ok" user it also checks that the page's origin is not kloud's and that the app cannot read
// kloud's session cookie (document.cookie). The app hosts (*.localhost) resolve to
// KLOUD_APPS_IP (--host-resolver-rules). With KLOUD_MACHINE_ID, an "ok" user's machine page must
// offer "Open in browser" and list the firewall, with the form to change it for KLOUD_OWNER only. Prints one JSON line per step and a final {"ok": …};
// exit status 0 when every step passed. Run by e2e/ports_test.go.
import { chromium } from 'playwright-core';
import { log, step, stepCounts, axeCheck } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL;
const openURL = env.KLOUD_OPEN_URL;
const marker = env.KLOUD_MARKER;
const users = JSON.parse(env.KLOUD_USERS || '[]');

// Every user's steps run even when an earlier one failed (keepGoing): the test sees them all.
const keepGoing = { keepGoing: true };

const browser = await chromium.launch({
  executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', `--host-resolver-rules=MAP *.localhost ${env.KLOUD_APPS_IP}`],
});
try {
  for (const u of users) {
    const context = await browser.newContext();
    const page = await context.newPage();
    await step(`${u.name}: log in`, async () => {
      const r = await context.request.post(base + '/api/login', { data: { username: u.name, password: u.password } });
      if (!r.ok()) throw new Error(`login: ${r.status()} ${await r.text()}`);
    }, keepGoing);
    await step(`${u.name}: open the app (want ${u.want})`, async () => {
      const resp = await page.goto(openURL);
      const text = await page.textContent('body');
      const origin = new URL(page.url()).origin;
      if (u.want === 'ok') {
        if (!resp.ok() || !text.includes(marker)) throw new Error(`at ${page.url()}: ${resp.status()} ${text.slice(0, 200)}`);
        if (origin === new URL(base).origin) throw new Error(`the app runs on kloud's origin ${origin}`);
        if (!/^http:\/\/p\d+--m[0-9a-z]+\.localhost(:\d+)?$/.test(origin)) throw new Error(`unexpected app origin ${origin}`);
        const cookies = await page.evaluate(() => document.cookie);
        if (cookies.includes('kloud_session') || cookies.includes('kloud_app')) throw new Error(`the app reads kloud's cookies: ${cookies}`);
        // And again straight at the app's URL: its own cookie, no trip through kloud's origin.
        const again = await page.goto(page.url());
        if (!again.ok() || !(await page.textContent('body')).includes(marker)) throw new Error('reload of the app failed');
      } else {
        if (text.includes(marker)) throw new Error(`${u.name} sees the app at ${page.url()}`);
        if (resp.status() < 400) throw new Error(`${u.name}: status ${resp.status()} at ${page.url()}`);
      }
    }, keepGoing);
    if (u.want === 'ok' && env.KLOUD_MACHINE_ID) {
      await step(`${u.name}: the machine page offers the port and shows the firewall`, async () => {
        await page.goto(base + `/#/machines/${env.KLOUD_MACHINE_ID}`);
        await page.waitForSelector('#app-form', { timeout: 60000 });
        await page.waitForSelector('#firewall table, #firewall p', { timeout: 60000 });
        const mayChange = (await page.$('#fw-form')) !== null;
        if (mayChange !== (u.name === env.KLOUD_OWNER)) throw new Error(`firewall form shown: ${mayChange}`);
        await axeCheck(page, `${u.name}'s machine page with its ports and firewall`); // docs/CONTRIBUTING.md "Accessibility"
      }, keepGoing);
    }
    await context.close();
  }
} finally {
  await browser.close();
}
const failed = stepCounts().failed > 0;
log({ ok: !failed });
process.exit(failed ? 1 : 0);
