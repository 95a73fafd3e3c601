// a11y.mjs — every page of kloud's web UI checked for accessibility in the Debian Chromium
// (playwright-core): axe-core (npm axe-core, WCAG 2.0/2.1 A and AA rules: tags wcag2a, wcag2aa,
// wcag21a, wcag21aa) on each page a member (KLOUD_USER) and a kloud administrator
// (KLOUD_ADMIN) see, with the data of a built stack in them (a machine with its terminal open,
// the stack's page with its last job, the template editor with a plan, the stack-create form,
// an update plan, credentials with one opened, teams, quotas with the administrators' form,
// audit, buckets, providers, the login page, a notice), and the keyboard: on every page each
// element with a click listener (read through the Chrome DevTools Protocol,
// DOMDebugger.getEventListeners) is a button, a link, a form control or a summary, so that Tab
// reaches it; every Tab stop shows its focus; Shift+Tab leaves the terminal and the template's
// text (where Tab is the shell's, or indents); the member logs in, goes to another page (the
// focus lands on its heading) and shares the machine with KLOUD_SHARE_USER by keyboard only
// (Tab, typing, arrows, Enter).
// It fails listing each violation: page, user, rule, impact, the elements' selectors.
//
// Env: KLOUD_URL, KLOUD_USER and KLOUD_PASSWORD (the member who owns the built stack),
// KLOUD_ADMIN and KLOUD_ADMIN_PASSWORD (a kloud administrator), KLOUD_SHARE_USER (a member to
// share the machine with), KLOUD_ARTIFACTS (screenshots), KLOUD_CHROMIUM, KLOUD_STATIC (optional:
// serve the UI's files from this directory, kloud/web/static, instead of kloud's embedded copy:
// for working on the UI without building kloud again). Run by e2e/browser_a11y_test.go; prints
// one JSON line per step and a final {"ok": …}; exit status 0 when every check passed.

import { readFileSync, existsSync } from 'node:fs';
import { join, extname, normalize } from 'node:path';
import { log, poll, step, stepCounts, loginForm, watchNet, launchChromium, axeViolations, violationLine } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL || 'http://127.0.0.1:7000';
const artifacts = env.KLOUD_ARTIFACTS || 'artifacts';
const member = { name: env.KLOUD_USER || 'alice', password: env.KLOUD_PASSWORD || '' };
const admin = { name: env.KLOUD_ADMIN || 'ops', password: env.KLOUD_ADMIN_PASSWORD || '' };
const shareUser = env.KLOUD_SHARE_USER || 'bob';

const violations = []; // {user, page, rule, impact, help, targets}
const pageErrors = [];
const audited = [];

// audit runs axe-core on what page shows now and keeps its violations under name.
async function audit(p, user, name) {
  const res = await axeViolations(p);
  for (const v of res) violations.push({ user, page: name, ...v });
  const keys = await unreachable(p);
  for (const k of keys) violations.push({ user, page: name, rule: 'kloud-click-not-focusable', impact: 'serious', help: 'an element with a click listener must be a button, a link, a form control or a summary (Tab must reach it)', targets: [k], nodes: 1 });
  const walk = await focusWalk(p);
  for (const k of walk.unseen) violations.push({ user, page: name, rule: 'kloud-focus-not-visible', impact: 'serious', help: 'an element focused by Tab must show its focus (an outline or a shadow)', targets: [k], nodes: 1 });
  audited.push(`${user} ${name}`);
  await p.screenshot({ path: join(artifacts, `a11y-${user}-${name.replace(/[^a-z0-9]+/gi, '-')}.png`), fullPage: true });
  return { violations: res.length + keys.length + walk.unseen.length, tabStops: walk.stops };
}

// focusWalk presses Tab through the page from its start (at most 120 times, until the focus
// comes back to where it began or enters the terminal, whose Tab is the shell's) and returns
// the elements focused that showed no focus ring (unseen) and how many there were (stops).
async function focusWalk(p) {
  await fromTop(p);
  const unseen = [];
  const seen = new Set();
  let stops = 0;
  for (let i = 0; i < 120; i++) {
    await p.keyboard.press('Tab');
    const f = await p.evaluate(() => {
      const el = document.activeElement;
      if (!el || el === document.body) return null;
      if (el.closest('.xterm')) return { xterm: true };
      if (!el.dataset.a11yStop) el.dataset.a11yStop = String(document.querySelectorAll('[data-a11y-stop]').length);
      const cs = getComputedStyle(el);
      const ring = (cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) > 0) || (cs.boxShadow && cs.boxShadow !== 'none');
      const id = el.id ? '#' + el.id : '';
      const cls = el.classList.length ? '.' + [...el.classList].join('.') : '';
      return { stop: el.dataset.a11yStop, ring, what: el.tagName.toLowerCase() + id + cls + ' "' + (el.textContent || el.getAttribute('aria-label') || '').trim().slice(0, 40) + '"' };
    });
    if (!f) continue;
    if (f.xterm || seen.has(f.stop)) break;
    seen.add(f.stop);
    stops++;
    if (!f.ring) unseen.push(f.what);
  }
  await p.evaluate(() => { for (const el of document.querySelectorAll('[data-a11y-stop]')) delete el.dataset.a11yStop; });
  return { unseen, stops };
}

// unreachable lists the elements of the page with a click (or mouse) listener that the keyboard
// cannot reach: neither a native control (a[href], button, input, select, textarea, summary,
// label) nor focusable with a role. xterm's own elements are left out: the terminal is reached
// through its focusable input (its listeners on its canvas and rows are for the mouse).
async function unreachable(p) {
  const cdp = await p.context().newCDPSession(p);
  try {
    const { result: doc } = await cdp.send('Runtime.evaluate', { expression: 'document', objectGroup: 'a11y' });
    const { listeners } = await cdp.send('DOMDebugger.getEventListeners', { objectId: doc.objectId, depth: -1, pierce: true });
    const ids = [...new Set(listeners.filter((l) => ['click', 'mousedown', 'mouseup', 'dblclick', 'pointerdown', 'pointerup'].includes(l.type) && l.backendNodeId).map((l) => l.backendNodeId))];
    const bad = [];
    for (const backendNodeId of ids) {
      // A node the page removed since (a table rendered again as data arrived) is skipped.
      const object = await cdp.send('DOM.resolveNode', { backendNodeId, objectGroup: 'a11y' }).then((r) => r.object, () => null);
      if (!object) continue;
      const { result } = await cdp.send('Runtime.callFunctionOn', {
        objectId: object.objectId, returnByValue: true,
        functionDeclaration: `function () {
          const el = this;
          if (el.nodeType !== 1 || el === document.documentElement || el === document.body || el.closest('.xterm')) return null;
          if (el.matches('a[href], button, input, select, textarea, summary, label')) return null;
          if (el.tabIndex >= 0 && el.getAttribute('role')) return null;
          const id = el.id ? '#' + el.id : '';
          const cls = el.classList.length ? '.' + [...el.classList].join('.') : '';
          return el.tagName.toLowerCase() + id + cls + ' "' + (el.textContent || '').trim().slice(0, 40) + '"';
        }`,
      });
      if (result.value) bad.push(result.value);
    }
    return bad;
  } finally {
    await cdp.send('Runtime.releaseObjectGroup', { objectGroup: 'a11y' }).catch(() => {});
    await cdp.detach().catch(() => {});
  }
}

// settled waits for sel and for the page's "Loading…" and "terraform plan…" placeholders to go.
async function settled(p, sel, timeout = 60000) {
  await p.waitForSelector(sel, { timeout });
  await poll(`${sel}: loaded`, () => p.evaluate(() => !document.querySelector('main:not([hidden]) .loading')), timeout, 100);
}

// open goes to hash (#/…) and waits for sel.
async function open(p, hash, sel) {
  await p.goto(base + '/' + hash);
  await settled(p, sel);
}

// fromTop moves the keyboard's starting point to the top of the page, as a page just opened has
// it: the next Tab focuses the page's first control.
const fromTop = (p) => p.evaluate(() => {
  const b = document.body;
  b.tabIndex = -1;
  b.focus();
  b.removeAttribute('tabindex');
  window.scrollTo(0, 0);
});

// tabTo presses Tab until the focused element matches sel (at most max times); it returns how
// many presses it took.
async function tabTo(p, sel, max = 150) {
  for (let i = 1; i <= max; i++) {
    await p.keyboard.press('Tab');
    if (await p.evaluate((sel) => document.activeElement && document.activeElement.matches(sel), sel)) return i;
  }
  throw new Error(`${max} presses of Tab never reached ${sel}`);
}

// focusRing describes how the focused element shows its focus (its outline or box shadow); null
// when it shows none.
const focusRing = (p) => p.evaluate(() => {
  const el = document.activeElement;
  const cs = getComputedStyle(el);
  if (cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) > 0) return `outline ${cs.outlineWidth} ${cs.outlineStyle} ${cs.outlineColor}`;
  if (cs.boxShadow && cs.boxShadow !== 'none') return `box-shadow ${cs.boxShadow}`;
  return null;
});

// serveStatic answers the UI's files from dir (KLOUD_STATIC) instead of kloud.
async function serveStatic(context, dir) {
  const types = { '.js': 'text/javascript', '.mjs': 'text/javascript', '.css': 'text/css', '.html': 'text/html' };
  await context.route((u) => u.pathname === '/' || u.pathname.startsWith('/static/'), (route) => {
    const u = new URL(route.request().url());
    const rel = u.pathname === '/' ? 'index.html' : normalize(u.pathname.slice('/static/'.length));
    const f = join(dir, rel);
    if (rel.startsWith('..') || !existsSync(f)) return route.continue();
    return route.fulfill({ status: 200, contentType: types[extname(f)] || 'application/octet-stream', body: readFileSync(f) });
  });
}

async function newPage(browser) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  if (env.KLOUD_STATIC) await serveStatic(context, env.KLOUD_STATIC);
  const p = await context.newPage();
  p.setDefaultTimeout(60000);
  watchNet(p);
  p.on('pageerror', (e) => pageErrors.push(String(e)));
  return p;
}

async function apiLogin(p, u) {
  const r = await p.context().request.post(base + '/api/login', { data: { username: u.name, password: u.password } });
  if (!r.ok()) throw new Error(`login ${u.name}: ${r.status()} ${await r.text()}`);
  await p.goto(base + '/#/machines');
  await p.waitForSelector('#conn.conn-open');
}

let machineID, machineLabel, stackID, templateID;

// check is a step after which the script carries on: one run lists every page's violations.
const check = (name, fn) => step(name, fn, { keepGoing: true });

async function memberSteps(browser) {
  const u = member.name;
  const p = await newPage(browser);
  await step('the login page', async () => {
    await p.goto(base + '/');
    await loginForm(p);
    // A wrong password: the error shows.
    await p.fill('#login-username', u);
    await p.fill('#login-password', 'not-the-password');
    await p.press('#login-password', 'Enter');
    await poll('login error shown', async () => (await p.textContent('#login-error')).trim() !== '');
    return audit(p, 'anonymous', 'login');
  });
  await step(`${u} logs in by keyboard only`, async () => {
    await p.reload(); // an empty form
    await loginForm(p);
    await fromTop(p);
    await tabTo(p, '#login-username');
    await p.keyboard.type(u);
    await p.keyboard.press('Tab');
    await p.keyboard.type(member.password);
    await p.keyboard.press('Enter');
    await p.waitForSelector('#conn.conn-open');
    await p.waitForSelector(`#header .user:has-text("${u}")`);
    return {};
  });
  await step(`${u}: machines`, async () => {
    await settled(p, 'tr[data-machine][data-state="Running"]');
    const m = await p.evaluate((u) => {
      const r = [...document.querySelectorAll('tr[data-machine][data-state="Running"]')].find((tr) => tr.querySelector('.term-open'));
      return r && { id: r.dataset.machine, label: r.dataset.label, stack: r.querySelector('td.stack a').getAttribute('href').split('/')[2] };
    }, u);
    if (!m) throw new Error(`${u} owns no Running machine`);
    machineID = m.id;
    machineLabel = m.label;
    stackID = m.stack;
    return { machine: m, ...(await audit(p, u, 'machines')) };
  });
  await check(`${u}: a machine's page`, async () => {
    await open(p, `#/machines/${machineID}`, '#share-form');
    await settled(p, '#term-sessions table, #term-sessions p');
    return audit(p, u, 'machine');
  });
  await check(`${u} shares the machine by keyboard only, then unshares it`, async () => {
    await p.evaluate(() => document.activeElement && document.activeElement.blur());
    const presses = await tabTo(p, '#share-username');
    const ring = await focusRing(p);
    if (!ring) throw new Error('the focused username field shows no focus');
    await p.keyboard.type(shareUser);
    await p.keyboard.press('Tab'); // the grant
    await p.keyboard.press('ArrowDown'); // readonly → terminal
    await p.keyboard.press('Tab'); // Share
    if (!(await p.evaluate(() => document.activeElement.matches('#share-form button[type=submit]')))) throw new Error('Tab after the grant is not the Share button');
    const btnRing = await focusRing(p);
    if (!btnRing) throw new Error('the focused Share button shows no focus');
    await p.keyboard.press('Enter');
    await p.waitForSelector(`#shares tr:has-text("${shareUser}") .badge:has-text("terminal")`);
    await settled(p, '.notice');
    const withNotice = await audit(p, u, 'machine-shared-notice');
    await fromTop(p);
    await tabTo(p, '#shares tr button.danger');
    await p.keyboard.press('Enter');
    await poll('unshared', async () => !(await p.$(`#shares tr:has-text("${shareUser}")`)), 30000);
    return { tabs: presses, focus: ring, buttonFocus: btnRing, ...withNotice };
  });
  await check(`${u} goes to another page by keyboard and carries on from its heading`, async () => {
    await fromTop(p);
    await tabTo(p, '#header nav a[href="#/stacks"]');
    await p.keyboard.press('Enter');
    await p.waitForSelector('main h1:has-text("Stacks")');
    await poll('the focus on the heading', () => p.evaluate(() => document.activeElement.matches('main h1')), 10000);
    await p.keyboard.press('Tab');
    const next = await p.evaluate(() => document.activeElement.id);
    if (next !== 'stack-new') throw new Error(`Tab after the Stacks heading focused ${JSON.stringify(next)}, not "New stack"`);
    return {};
  });
  await check(`${u}: the terminal, and Shift+Tab leaves it`, async () => {
    await open(p, '#/machines', `tr[data-machine="${machineID}"] .term-open`);
    await fromTop(p);
    await tabTo(p, `tr[data-machine="${machineID}"] .term-open`);
    await p.keyboard.press('Enter');
    // The dummy provider's machines (klient processes on this host) have no account of alice's,
    // so her terminal ends in an honest error there ("no such account"): what this step checks
    // is the keyboard, in either state.
    await p.waitForSelector('.term-pane.active[data-state="connected"], .term-pane.active[data-state="error"]', { timeout: 60000 });
    await poll('the terminal has the focus', () => p.evaluate(() => !!document.activeElement.closest('.xterm')), 10000);
    await p.keyboard.press('Shift+Tab');
    const left = await p.evaluate(() => ({ inside: !!document.activeElement.closest('.xterm'), el: document.activeElement.outerHTML.slice(0, 80) }));
    if (left.inside) throw new Error('Shift+Tab does not leave the terminal');
    return { after: left.el, ...(await audit(p, u, 'terminal')) };
  });
  await check(`${u}: stacks and a stack's page`, async () => {
    await open(p, '#/stacks', `tr[data-stack="${stackID}"]`);
    const a = await audit(p, u, 'stacks');
    templateID = await p.evaluate((sid) => document.querySelector(`tr[data-stack="${sid}"] a.template-link`).getAttribute('href').split('/')[2], stackID);
    await open(p, `#/stacks/${stackID}`, '#stack-template-link');
    await settled(p, '#stack-jobs .job[data-status="succeeded"], #stack-jobs .job[data-status="failed"]');
    const b = await audit(p, u, 'stack');
    return { violations: a.violations + b.violations };
  });
  await check(`${u}: templates, the editor and its plan`, async () => {
    await open(p, '#/templates', `a[href="#/templates/${templateID}"]`);
    const a = await audit(p, u, 'templates');
    await open(p, '#/templates/new', '#template-form');
    const b = await audit(p, u, 'template-new');
    await open(p, `#/templates/${templateID}`, '#template-plan:not([disabled])');
    // The file's text keeps Tab (it indents); Shift+Tab leaves it.
    await p.focus('#template-file');
    await p.keyboard.press('Tab');
    const kept = await p.evaluate(() => document.activeElement.id === 'template-file');
    await p.keyboard.press('Shift+Tab');
    const left = await p.evaluate(() => document.activeElement.id);
    if (!kept || left === 'template-file') throw new Error(`the template's text: Tab kept the focus ${kept}, Shift+Tab went to ${JSON.stringify(left)}`);
    // A new revision (a comment more), for the stack's update plan below.
    await p.evaluate(() => {
      const t = document.getElementById('template-file');
      t.value += '\n# checked for accessibility\n';
      t.dispatchEvent(new Event('input'));
    });
    await p.click('#template-save');
    await p.waitForSelector('.notice:has-text("Saved revision")');
    await settled(p, '#template-plan:not([disabled])');
    await p.click('#template-plan');
    await settled(p, '#plan table.grid', 180000);
    const c = await audit(p, u, 'template-editor-plan');
    return { violations: a.violations + b.violations + c.violations };
  });
  await check(`${u}: the stack-create form and its plan`, async () => {
    await open(p, `#/stacks/new/${templateID}`, '#stack-form');
    const a = await audit(p, u, 'stack-new');
    await p.click('#stack-plan');
    await settled(p, 'main table.grid', 180000);
    const b = await audit(p, u, 'stack-new-plan');
    return { violations: a.violations + b.violations };
  });
  await check(`${u}: a stack's update plan`, async () => {
    await open(p, `#/stacks/${stackID}`, '#stack-update');
    await p.click('#stack-update');
    await settled(p, '#stack-update-apply', 180000);
    const a = await audit(p, u, 'stack-update-plan');
    await p.click('#stack-update-box button:has-text("Cancel")');
    return a;
  });
  for (const [hash, name, sel] of [['#/credentials', 'credentials', '#cred-form'], ['#/teams', 'teams', 'main h1:has-text("Teams")'],
    ['#/quota', 'quota', '#quota-mine tr'], ['#/buckets', 'buckets', 'main h1:has-text("Buckets")'], ['#/providers', 'providers', 'tr[data-provider]'],
    ['#/nowhere', 'not-found', 'main h2:has-text("Not found")']]) {
    await check(`${u}: ${name}`, async () => {
      await open(p, hash, sel);
      const a = await audit(p, u, name);
      if (name === 'credentials' && await p.$('table.grid button.link')) {
        // A credential opened, with its update form unfolded.
        await p.click('table.grid button.link');
        await p.waitForSelector('details.update', { state: 'attached' });
        await p.click('details.update summary');
        const b = await audit(p, u, 'credential');
        return { violations: a.violations + b.violations };
      }
      return a;
    });
  }
  await p.context().close();
}

async function adminSteps(browser) {
  const u = admin.name;
  const p = await newPage(browser);
  await step(`${u} (administrator) logs in`, async () => apiLogin(p, admin));
  for (const [hash, name, sel] of [['#/machines', 'machines', 'main h1:has-text("Machines")'], [`#/machines/${machineID}`, 'machine', '#share-form'],
    ['#/stacks', 'stacks', 'main h1:has-text("Stacks")'], [`#/stacks/${stackID}`, 'stack', '#stack-template-link'],
    ['#/templates', 'templates', 'main h1:has-text("Templates")'], ['#/teams', 'teams', 'main h1:has-text("Teams")'],
    ['#/audit', 'audit', '#audit-entries tr[data-seq]'], ['#/providers', 'providers', 'tr[data-provider]'],
    ['#/terminal', 'no-terminal', '#term-empty']]) {
    await check(`${u}: ${name}`, async () => {
      await open(p, hash, sel);
      return audit(p, u, name);
    });
  }
  await check(`${u}: quotas, a member's shown in the administrators' form`, async () => {
    await open(p, '#/quota', '#quota-form');
    await p.fill('#quota-name', member.name);
    await p.click('#quota-show');
    await settled(p, `#quota-result [data-subject="user/${member.name}"] tr`);
    return audit(p, u, 'quota');
  });
  await check(`${u}: the audit log verified`, async () => {
    await open(p, '#/audit', '#audit-entries tr[data-seq]');
    await p.click('#audit-verify');
    await p.waitForSelector('#audit-verdict.ok, #audit-verdict.error');
    return audit(p, u, 'audit-verified');
  });
  await p.context().close();
}

let ok = false;
let browser;
const t0 = Date.now();
try {
  // A page answered by the test (KLOUD_STATIC) has no address: Chromium would take it for a public
  // site and refuse its connections to kloud on loopback.
  await step('launch chromium', async () => { browser = await launchChromium(env.KLOUD_STATIC ? ['--disable-features=LocalNetworkAccessChecks'] : []); });
  await memberSteps(browser);
  await adminSteps(browser);
  await step('no accessibility violation on any page', async () => {
    if (violations.length) {
      const lines = violations.map((v) => `${v.user} ${v.page}: ${violationLine(v)}`);
      throw new Error(`${violations.length} violations:\n${lines.join('\n')}`);
    }
    return { pages: audited.length, audited };
  }, { keepGoing: true });
  if (pageErrors.length) throw new Error('errors in the page:\n' + pageErrors.join('\n'));
  ok = stepCounts().failed === 0;
} catch (e) {
  log({ error: String(e && e.message || e), pageErrors });
} finally {
  if (browser) await browser.close().catch(() => {});
}
log({ ok, ms: Date.now() - t0, steps: stepCounts().run });
process.exit(ok ? 0 : 1);
