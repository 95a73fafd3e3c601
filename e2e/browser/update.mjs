// update.mjs — the stack update and snapshot pages in the Debian Chromium (playwright-core), as a
// user drives them (issue 13 §1 and §2): on the machine page, take a snapshot (the running
// machine is stopped, saved and started again), see it listed ready with its size and the
// quota, restore it after the test changed a file, delete it; on the stack page, see "Update
// available (rev 1 → 2)" once the test saved a new revision, read the plan's per-machine diff,
// confirm the update and watch its job, then scale the counted resource back down from the
// Scale card. Confirm dialogs are accepted as a user would. The Go test (e2e/
// browser_update_test.go) checks through the API and inside the machine at each {"need": …}
// and answers "done" (or what went wrong) on stdin.
//
// Env: KLOUD_URL, KLOUD_USER, KLOUD_PASSWORD, KLOUD_ARTIFACTS, KLOUD_CHROMIUM, KLOUD_STACK (the
// stack's id, built with one machine), KLOUD_MACHINE_ID (its machine), KLOUD_MACHINE (its label,
// e.g. web.0), KLOUD_RESOURCE (the counted resource's name, e.g. web), KLOUD_ADDED
// (the machine revision 2 adds, e.g. web.1), KLOUD_OTHER_USER (a user of the same password
// and no share, who must see none of the controls). Prints one JSON line per step and a final
// {"ok": …, "steps": N}; exit status 0 when every step passed.

import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { log, poll, ask, step, stepCounts, loginForm, watchNet, axeCheck } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL;
const artifacts = env.KLOUD_ARTIFACTS || 'artifacts';
const stackID = env.KLOUD_STACK;
const machineID = env.KLOUD_MACHINE_ID;
const label = env.KLOUD_MACHINE;
const resource = env.KLOUD_RESOURCE;
const added = env.KLOUD_ADDED;
mkdirSync(artifacts, { recursive: true });

const t0 = Date.now();
const pageErrors = [];
let page;

const shot = async (name) => { const p = join(artifacts, name); await page.screenshot({ path: p }); return p; };

// jobs counts the job views in container; started(container, n) waits for the one a click
// added after n of them, done(…) for it to end (anything but succeeded is an error).
const jobs = (container) => page.evaluate((sel) => document.querySelectorAll(`${sel} .job`).length, container);
async function jobDone(container, before, what, timeout = 300000) {
  const j = await poll(`${what}: job finished`, () => page.evaluate(([sel, n]) => {
    const all = document.querySelectorAll(`${sel} .job`);
    const el = all.length > n ? all[all.length - 1] : null;
    return el && ['succeeded', 'failed', 'cancelled'].includes(el.dataset.status)
      ? { status: el.dataset.status, text: el.textContent } : null;
  }, [container, before]), timeout, 500);
  if (j.status !== 'succeeded') throw new Error(`${what}: job ${j.status}: ${j.text}`);
  return j;
}

const snapRow = (id) => `#snapshots tr[data-snapshot="${id}"]`;
const text = async (sel) => ((await page.textContent(sel)) || '').replace(/\s+/g, ' ').trim();

async function main() {
  const browser = await chromium.launch({
    executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    page = await context.newPage();
    page.setDefaultTimeout(60000);
    watchNet(page);
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    page.on('console', (m) => {
      if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) pageErrors.push('console: ' + m.text());
    });
    page.on('response', (r) => {
      if (r.status() >= 400 && !(r.status() === 401 && new URL(r.url()).pathname === '/api/session')) {
        pageErrors.push(`${r.request().method()} ${new URL(r.url()).pathname}: ${r.status()}`);
      }
    });
    // Every confirm() of these pages is a question a user answers yes to; record what was asked.
    const dialogs = [];
    page.on('dialog', (d) => { dialogs.push(d.message()); d.accept(); });

    await step('log in', async () => {
      await page.goto(base + '/');
      const seen = await loginForm(page);
      if (seen.failed) log({ loginPage: env.KLOUD_USER, ...seen }); // how its first load went, when not smoothly
      await page.fill('#login-username', env.KLOUD_USER);
      await page.fill('#login-password', env.KLOUD_PASSWORD);
      await page.click('#login-submit');
      await page.waitForSelector('#conn.conn-open');
    });

    let snapID;
    await step(`snapshot ${label} from its page`, async () => {
      await page.goto(base + `/#/machines/${machineID}`);
      await page.waitForSelector('#snapshot-form #snapshot-take:not([disabled])');
      const quota0 = await text('#snapshot-quota');
      if (!quota0.includes('0 of 10')) throw new Error(`quota before: ${quota0}`);
      await page.fill('#snapshot-name', 'before the change');
      const n = await jobs('#snapshot-jobs');
      await page.click('#snapshot-take');
      await jobDone('#snapshot-jobs', n, 'snapshot');
      // The list renders again as the job and the quota refresh: read by selector, no handle.
      const ready = '#snapshots tr[data-status="ready"]:has-text("before the change")';
      await page.waitForSelector(ready, { timeout: 60000 });
      snapID = await page.getAttribute(ready, 'data-snapshot');
      const cells = await page.$$eval(`${snapRow(snapID)} td`, (tds) => tds.map((td) => td.textContent.trim()));
      if (!/^\d+(\.\d)? (B|KiB|MiB|GiB)$/.test(cells[2]) || cells[2] === '0 B') throw new Error(`size cell: ${JSON.stringify(cells)}`);
      const quota = await poll('quota counts it', async () => { const q = await text('#snapshot-quota'); return q.includes('1 of 10') && q; });
      // The machine is running again once the job says so: the header badge shows it.
      await poll(`${label} Running again`, async () => (await text('main .title-row')).includes('Running'), 60000, 500);
      await axeCheck(page, 'the machine page with a snapshot'); // docs/CONTRIBUTING.md "Accessibility"
      return { snapID, row: cells, quota, screenshot: await shot('snapshot-taken.png') };
    });

    await step('the test changes the file after the snapshot', () => ask('change-file'));

    await step('restore the snapshot from the page', async () => {
      const n = await jobs('#snapshot-jobs');
      await page.click(`${snapRow(snapID)} button[data-restore="${snapID}"]`);
      await jobDone('#snapshot-jobs', n, 'restore');
      if (!dialogs.some((d) => d.startsWith('Restore "before the change" into web.0?'))) throw new Error(`no confirm asked: ${JSON.stringify(dialogs)}`);
      await poll(`${label} Running after the restore`, async () => (await text('main .title-row')).includes('Running'), 60000, 500);
      return { screenshot: await shot('snapshot-restored.png') };
    });

    await step('the file is back as it was saved', () => ask('check-restored'));

    await step('delete the snapshot', async () => {
      await page.click(`${snapRow(snapID)} button[data-delete-snapshot="${snapID}"]`);
      await page.waitForSelector(snapRow(snapID), { state: 'detached' });
      await page.waitForSelector('#snapshots p.empty:has-text("No snapshot of this machine.")');
      const quota = await text('#snapshot-quota');
      if (!quota.includes('0 of 10')) throw new Error(`quota after delete: ${quota}`);
      return { quota };
    });

    await step('the test saves revision 2 of the template', () => ask('new-revision'));

    await step('the stacks list and the stack page offer the update and show its plan', async () => {
      await page.goto(base + '/#/stacks');
      const badge = await text(`tr[data-stack="${stackID}"] .badge-update`);
      if (badge !== 'update: rev 2') throw new Error(`stacks list badge: ${badge}`);
      await page.goto(base + `/#/stacks/${stackID}`);
      await poll('update button', async () => {
        const b = await page.$('#stack-update');
        if (!b) await page.evaluate(() => window.dispatchEvent(new HashChangeEvent('hashchange')));
        return b;
      }, 60000, 1000);
      // The stack page renders its header again whenever it refreshes (the watched job ending,
      // a machine's state): the button is found again by its selector, never kept as a handle.
      const label0 = await text('#stack-update');
      if (label0 !== 'Update available (rev 1 → 2)') throw new Error(`button says ${label0}`);
      await page.click('#stack-update');
      await page.waitForSelector('#stack-update-apply', { timeout: 300000 });
      const summary = await text('#stack-update-summary');
      if (summary !== '1 add, 1 keep') throw new Error(`plan summary: ${summary}`);
      const rows = await page.$$eval('#stack-update-box tr[data-machine]', (trs) => trs.map((tr) => [tr.dataset.machine, tr.dataset.action, tr.textContent.replace(/\s+/g, ' ').trim()]));
      const byLabel = Object.fromEntries(rows.map((r) => [r[0], r]));
      if (!byLabel[label] || byLabel[label][1] !== 'keep' || !byLabel[added] || byLabel[added][1] !== 'add') throw new Error(`plan rows: ${JSON.stringify(rows)}`);
      if (rows.some((r) => r[2].includes('eyJ'))) throw new Error(`the plan shows a key: ${JSON.stringify(rows)}`);
      await axeCheck(page, 'the update plan');
      return { button: label0, summary, rows, screenshot: await shot('update-plan.png') };
    });

    await step('confirm the update and watch it', async () => {
      // The stack page shows one job, the one it follows: the build's until the update starts.
      const oldJob = await page.getAttribute('#stack-jobs .job', 'data-job');
      await page.click('#stack-update-apply');
      await page.waitForSelector(`#stack-jobs .job:not([data-job="${oldJob}"])`);
      await jobDone('#stack-jobs', 0, 'update');
      await page.waitForSelector('#stack-update', { state: 'detached', timeout: 30000 });
      const dd = await text('main dl.kv');
      if (!dd.includes('revision 2')) throw new Error(`stack page after update: ${dd}`);
      await poll('two machines Running and connected', () => page.evaluate(() => document.querySelectorAll('tr[data-state="Running"][data-agent="connected"]').length === 2), 60000, 1000);
      return { screenshot: await shot('updated.png') };
    });

    await step('the update kept the machine and added one', () => ask('check-updated'));

    await step(`scale ${resource} to 1 from the Scale card`, async () => {
      await page.waitForSelector('#stack-scale-resource');
      const opts = await page.$$eval('#stack-scale-resource option', (os) => os.map((o) => [o.value, o.textContent]));
      if (!opts.some(([v, t]) => v === resource && t === `${resource} (2 now)`)) throw new Error(`scale options: ${JSON.stringify(opts)}`);
      await page.selectOption('#stack-scale-resource', resource);
      await page.fill('#stack-scale-count', '1');
      const before = dialogs.length;
      const oldJob = await page.getAttribute('#stack-jobs .job', 'data-job');
      await page.click('#stack-scale');
      await poll('scale confirm asked', () => dialogs.length > before, 5000);
      if (!dialogs[before].startsWith(`Set ${resource} to 1 machine(s)?`)) throw new Error(`confirm: ${dialogs[before]}`);
      await page.waitForSelector(`#stack-jobs .job:not([data-job="${oldJob}"])`);
      await jobDone('#stack-jobs', 0, 'scale');
      await poll('one machine left in the table', () => page.evaluate(() => document.querySelectorAll('main tr[data-machine]').length === 1), 60000, 1000);
      // The card is drawn again when the stack's state settles (live events): wait for it.
      let hint = '';
      await poll('the Scale card says the stack was scaled', async () => (hint = await text('#stack-scale-box')).includes('was scaled'), 30000, 500)
        .catch(() => { throw new Error(`scale card after scaling: ${hint}`); });
      return { screenshot: await shot('scaled.png') };
    });

    await step('the scale removed the added machine only', () => ask('check-scaled'));

    // Another user (KLOUD_OTHER_USER, no share) is offered none of it on alice's pages.
    await step(`${env.KLOUD_OTHER_USER} sees no snapshot, update or scale controls of alice's`, async () => {
      const other = await browser.newContext({ viewport: { width: 1280, height: 900 } });
      try {
        const r = await other.request.post(base + '/api/login', { data: { username: env.KLOUD_OTHER_USER, password: env.KLOUD_PASSWORD } });
        if (!r.ok()) throw new Error(`login: ${r.status()}`);
        const p = await other.newPage();
        p.on('dialog', (d) => d.dismiss());
        const seen = {};
        for (const [hash, controls] of [[`#/machines/${machineID}`, '#snapshots, #snapshot-form, button[data-restore]'],
          [`#/stacks/${stackID}`, '#stack-update, #stack-scale, #stack-destroy']]) {
          await p.goto(base + '/' + hash);
          await p.waitForSelector('#conn.conn-open');
          await p.waitForSelector('main h1, main .card.error, main .error-text');
          await p.waitForTimeout(1000); // sections that load later have had their chance
          if (await p.$(controls)) throw new Error(`${hash} offers ${controls}: ${(await p.textContent('main')).slice(0, 300)}`);
          seen[hash] = ((await p.textContent('main')) || '').replace(/\s+/g, ' ').trim().slice(0, 120);
        }
        return { seen };
      } finally {
        await other.close();
      }
    });
    await context.close();
  } finally {
    await browser.close();
  }
}

let ok = false;
try {
  await main();
  if (pageErrors.length) throw new Error('errors in the page:\n' + pageErrors.join('\n'));
  ok = true;
} catch (e) {
  if (page) await shot('failure.png').catch((err) => log({ screenshot: String(err) }));
  log({ error: String(e && e.message || e), pageErrors });
}
log({ ok, ms: Date.now() - t0, steps: stepCounts().run });
process.exit(ok ? 0 : 1);
