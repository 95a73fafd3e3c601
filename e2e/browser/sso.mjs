// sso.mjs — single sign-on in the Debian Chromium (playwright-core): open kloud, click "Sign in
// with SSO", fill the OpenID provider's own login form (zitadel/oidc's example OP, started by the
// Go test), land back in kloud's UI as the user kloud made of the identity, and see the team the
// groups claim names on the Teams page. It runs the whole login twice, in two fresh browser
// contexts (the second login must be the same user). Run by e2e/sso_test.go; prints one JSON line
// per step and a final {"ok": …}; exit status 0 when every step passed.
//
// Env: KLOUD_URL, KLOUD_CHROMIUM, KLOUD_ARTIFACTS, KLOUD_SSO_LOGIN and KLOUD_SSO_PASSWORD (what the
// OP's form takes), KLOUD_SSO_ISSUER (the OP's URL), KLOUD_SSO_USER (the kloud username
// expected), KLOUD_SSO_TEAM (the team the group names).

import { chromium } from 'playwright-core';
import { join } from 'node:path';
import { mkdirSync } from 'node:fs';
import { log, step, stepCounts, loginForm, watchNet } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL;
const artifacts = env.KLOUD_ARTIFACTS || 'artifacts';
const issuer = new URL(env.KLOUD_SSO_ISSUER);
mkdirSync(artifacts, { recursive: true });

const browser = await chromium.launch({
  executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
try {
  for (const round of [1, 2]) {
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const page = await context.newPage();
    page.setDefaultTimeout(60000);
    watchNet(page);
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    page.on('response', (r) => {
      const u = new URL(r.url());
      if (r.status() >= 400 && !(r.status() === 401 && u.pathname === '/api/session')) errors.push(`${r.request().method()} ${u.origin}${u.pathname}: ${r.status()}`);
    });
    await step(`${round}: the login page offers SSO`, async () => {
      await page.goto(base + '/');
      // The app boots, asks /api/session, shows the login form, then asks /api/login/methods:
      // on a loaded CI host (4 test packages on 2 cores) the boot alone took longer than 30 s.
      const seen = await loginForm(page);
      if (seen.failed) log({ loginPage: round, ...seen }); // how its first load went, when not smoothly
      await page.waitForSelector('#login-sso').catch((e) => {
        throw new Error(`${e.message}\nthe page's failed requests and errors: ${JSON.stringify(errors)}`);
      });
      if (round === 1) await page.screenshot({ path: join(artifacts, 'login.png') });
    });
    await step(`${round}: "Sign in with SSO" shows the provider's login form`, async () => {
      await page.click('#login-sso');
      await page.waitForSelector('input#username');
      const at = new URL(page.url());
      if (at.origin !== issuer.origin) throw new Error(`the form is at ${at.origin}, not the provider's ${issuer.origin}`);
      if (round === 1) await page.screenshot({ path: join(artifacts, 'provider-form.png') });
    });
    await step(`${round}: the provider's form brings the user back into kloud`, async () => {
      await page.fill('input#username', env.KLOUD_SSO_LOGIN);
      await page.fill('input#password', env.KLOUD_SSO_PASSWORD);
      await page.click('button[type=submit]');
      await page.waitForFunction((want) => {
        const u = document.querySelector('#header .user');
        return u && u.textContent.trim().startsWith(want) && document.querySelector('#conn.conn-open');
      }, env.KLOUD_SSO_USER);
      const at = new URL(page.url());
      if (at.origin !== new URL(base).origin || at.hash !== '#/machines') throw new Error(`landed at ${page.url()}`);
      if (round === 1) await page.screenshot({ path: join(artifacts, 'signed-in.png') });
    });
    await step(`${round}: the Teams page shows the group's team`, async () => {
      await page.goto(base + '/#/teams');
      await page.waitForFunction((team) => document.querySelector('main') && document.querySelector('main').textContent.includes(team)
        && !document.querySelector('main .loading'), env.KLOUD_SSO_TEAM);
      if (round === 1) await page.screenshot({ path: join(artifacts, 'teams.png'), fullPage: true });
      if (errors.length) throw new Error(`page errors: ${errors.join('; ')}`);
    });
    await context.close();
  }
} catch {
  // the failed step printed its line
} finally {
  await browser.close();
}
const failed = stepCounts().failed > 0;
log({ ok: !failed, steps: stepCounts().run });
process.exit(failed ? 1 : 0);
