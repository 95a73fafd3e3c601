// buckets.mjs — a stack's buckets in the web UI (Debian Chromium, playwright-core): alice logs in
// through the form, opens her stack's page (KLOUD_STACK), sees its bucket (KLOUD_BUCKET, the
// claim's label) ready with no key in the page, opens "Show my key" and reads the key that
// `kloud bucket credentials --json` gave the test (KLOUD_CREDS), with the export lines; grants
// read to KLOUD_GRANT_USER and sees the grant, revokes it and sees it gone; the Buckets page lists
// the claim linking to the stack, without JSON; "Delete bucket" on the stack page ends the claim. Run by e2e/browser_test.go TestBrowserBuckets;
// one JSON line per step and a final {"ok": …}; exit status 0 when every step passed.
//
// Env: KLOUD_URL, KLOUD_USER, KLOUD_PASSWORD, KLOUD_ARTIFACTS, KLOUD_CHROMIUM, KLOUD_STACK,
// KLOUD_BUCKET, KLOUD_CREDS, KLOUD_GRANT_USER.

import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { log, poll, step, stepCounts, loginForm, watchNet, launchChromium, axeCheck } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL;
const artifacts = env.KLOUD_ARTIFACTS || 'artifacts';
const creds = JSON.parse(env.KLOUD_CREDS || '{}');
const grantee = env.KLOUD_GRANT_USER;
const card = `#stack-buckets .bucket[data-bucket="${env.KLOUD_BUCKET}"]`;
mkdirSync(artifacts, { recursive: true });

const browser = await launchChromium();
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
page.setDefaultTimeout(60000);
watchNet(page);
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push(String(e)));
page.on('dialog', (d) => d.accept());
const shot = (name) => page.screenshot({ path: join(artifacts, name), fullPage: true });
const cardText = () => page.evaluate((sel) => document.querySelector(sel).innerText, card);

try {
  await step('login through the form', async () => {
    await page.goto(base + '/');
    const seen = await loginForm(page);
    await page.fill('#login-username', env.KLOUD_USER);
    await page.fill('#login-password', env.KLOUD_PASSWORD);
    await page.click('#login-submit');
    await page.waitForSelector('#conn.conn-open');
    return seen;
  });

  await step('the stack page shows the bucket, no key until asked', async () => {
    await page.goto(`${base}/#/stacks/${env.KLOUD_STACK}`);
    await page.waitForSelector(`${card}[data-state="ready"]`);
    const text = await cardText();
    for (const want of [creds.bucket, creds.endpoint]) if (!text.includes(want)) throw new Error(`the card does not show ${want}: ${text}`);
    const html = await page.content();
    if (html.includes(creds.secretAccessKey) || html.includes(creds.accessKeyId)) throw new Error('the key is in the page before "Show my key"');
  });

  await step('"Show my key" shows the key kloud bucket credentials printed', async () => {
    await page.click(`${card} details.bucket-creds summary`);
    await page.waitForSelector(`${card} .key-secret`);
    const got = await page.evaluate((sel) => {
      const q = (c) => document.querySelector(`${sel} ${c}`).textContent;
      return { endpoint: q('.key-endpoint'), bucket: q('.key-bucket'), accessKeyId: q('.key-id'), secretAccessKey: q('.key-secret'), exports: q('.key-export') };
    }, card);
    for (const k of ['endpoint', 'bucket', 'accessKeyId', 'secretAccessKey']) {
      if (got[k] !== creds[k]) throw new Error(`${k}: the page shows ${JSON.stringify(got[k])}, the CLI ${JSON.stringify(creds[k])}`);
    }
    if (!got.exports.includes(`export AWS_SECRET_ACCESS_KEY=${creds.secretAccessKey}`) && !got.exports.includes(`export AWS_SECRET_ACCESS_KEY='${creds.secretAccessKey}'`)) {
      throw new Error(`the export lines lack the secret: ${got.exports}`);
    }
    await shot('bucket-key.png');
    await axeCheck(page, 'the stack page with its bucket and key'); // docs/CONTRIBUTING.md "Accessibility"
  });

  await step(`grant ${grantee} read, then revoke`, async () => {
    await page.fill(`${card} .grant-user`, grantee);
    await page.selectOption(`${card} .grant-access`, 'read');
    await page.click(`${card} .grant-form button[type=submit]`);
    await page.waitForSelector(`${card} tr[data-grant="${grantee}"][data-access="read"]`);
    await shot('bucket-granted.png');
    await page.click(`${card} button[data-revoke="${grantee}"]`);
    await poll('the grant gone', async () => (await page.$(`${card} tr[data-grant="${grantee}"]`)) === null, 30000);
  });

  await step('the Buckets page lists the claim, linking to its stack', async () => {
    await page.goto(`${base}/#/buckets`);
    await page.waitForSelector('main h1:has-text("Buckets")');
    const row = `main tr[data-bucket="${env.KLOUD_STACK}/${env.KLOUD_BUCKET}"]`;
    await page.waitForSelector(`${row} a[href="#/stacks/${env.KLOUD_STACK}"]`);
    const text = await page.textContent('main');
    if (/\{\s*"[^"]*"\s*:/.test(text)) throw new Error(`the page shows JSON: ${text}`);
    if (!(await page.textContent(row)).includes(creds.bucket)) throw new Error(`the row does not name ${creds.bucket}`);
    await shot('buckets.png');
    await axeCheck(page, 'the Buckets page');
  });

  await step('"Delete bucket" (data not kept) ends the claim', async () => {
    await page.goto(`${base}/#/stacks/${env.KLOUD_STACK}`);
    await page.waitForSelector(`${card} .bucket-delete`);
    await page.click(`${card} .bucket-delete`);
    await poll('the bucket gone from the stack page', async () => (await page.$(card)) === null, 30000);
  });

  await step('no page errors', async () => {
    if (pageErrors.length) throw new Error(pageErrors.join('\n'));
  });
} catch (e) {
  await page.screenshot({ path: join(artifacts, 'failure.png'), fullPage: true }).catch(() => {});
} finally {
  await browser.close();
}
const c = stepCounts();
log({ ok: c.failed === 0, steps: c.run });
process.exit(c.failed ? 1 : 0);
