// ui.mjs — drives the Debian Chromium (playwright-core, no browser download) through kloud's
// web UI as a user would: log in through the form, add a credential from the provider's form
// (for the dummy: the form's inputs are checked against its JSON Schema, and a credential is
// updated),
// write a template and plan it, create and build a stack watching its progress, see the machine
// Running with its agent connected, and every page reading as a new user reads it (stacks and
// templates by title, attribute values rather than JSON, errors in a short line with the rest
// folded, a snapshot name placeholder that fits, no credential asked of a provider that takes
// none), then (KLOUD_TERMINAL=1) open its terminal, type
// `echo hello-$((6*7))`, read hello-42 from the xterm buffer, reload and see the session
// replayed, and (KLOUD_SHARE_USER) share it read-only with a second user who watches from a
// second browser and cannot type; then (KLOUD_RESTART=1) kloud is killed and started again while the page stays
// open: the header shows "reconnecting", then the page (and the terminal tab) carry on.
// Screenshots go to $KLOUD_ARTIFACTS. Run by e2e/browser_test.go; prints one JSON line per
// step, {"need": "kill"|"start"} when it needs the test to act (it answers "done" on stdin),
// and a final {"ok": …} line; exit status 0 when every step passed.
//
// Env: KLOUD_URL, KLOUD_USER, KLOUD_PASSWORD, KLOUD_ARTIFACTS (default ./artifacts),
// KLOUD_TERMINAL (1: terminal steps), KLOUD_RESTART (1: restart steps), KLOUD_CHROMIUM (default /usr/bin/chromium),
// KLOUD_SHARE_USER and KLOUD_SHARE_PASSWORD (a second user: share steps, with the terminal),
// KLOUD_QUOTA_ADMIN and KLOUD_QUOTA_ADMIN_PASSWORD (a kloud administrator: quota page steps; the
// test gives alice a quota of 3 machines first),
// KLOUD_PLUGIN (1: the provider is a plugin: providers page and schema form steps),
// KLOUD_AUDIT_USER and KLOUD_AUDIT_PASSWORD (a kloud administrator: the Audit page steps),
// KLOUD_PROVIDER (default dummy), KLOUD_CRED_FIELDS (JSON of field values, default
// {"token":"abc123"}), KLOUD_TEMPLATE (template text), KLOUD_TAGS (the machine's attribute
// with kloud's tags: tags, labels), KLOUD_PLAN_DEFAULT (an attribute the plan shows folded: a
// provider default the template does not set), KLOUD_UNAVAILABLE (a provider kloud offers that is unavailable on its host).

import { chromium } from 'playwright-core';
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { log, poll, ask, step, stepCounts, loginForm, watchNet, axeCheck } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL || 'http://127.0.0.1:7000';
const user = env.KLOUD_USER || 'alice';
const password = env.KLOUD_PASSWORD || '';
const artifacts = env.KLOUD_ARTIFACTS || 'artifacts';
const withTerminal = env.KLOUD_TERMINAL === '1';
const providerName = env.KLOUD_PROVIDER || 'dummy';
const label = env.KLOUD_MACHINE || 'vm.0'; // the machine the template makes
const withCredential = env.KLOUD_CREDENTIAL !== '0';
const shareUser = env.KLOUD_SHARE_USER || '';
const sharePassword = env.KLOUD_SHARE_PASSWORD || '';
const quotaAdmin = env.KLOUD_QUOTA_ADMIN || ''; // a kloud administrator: quota page steps
const credFields = JSON.parse(env.KLOUD_CRED_FIELDS || '{"token":"abc123"}');
const template = env.KLOUD_TEMPLATE || `resource "terraform_data" "vm" {
  count = 1
  input = "#!/bin/bash\\necho hello from the user script"
}
`;

mkdirSync(artifacts, { recursive: true });
const t0 = Date.now();
const pageErrors = [];
// While the test has kloud down on purpose, the page's failed reconnect attempts are expected.
let outage = false;
let page;
let context;
let machineID; // the machine the terminal steps use
const profile = mkdtempSync(join(tmpdir(), 'kloud-chromium-'));

async function shot(name, fullPage = false) {
  const p = join(artifacts, name);
  await page.screenshot({ path: p, fullPage });
  return p;
}

const termLinesOf = (p) => p.evaluate(() => window.kloudDebug && window.kloudDebug.termText());
const termLines = () => termLinesOf(page);
const hasLine = async (p, want) => (await termLinesOf(p) || []).some((l) => l.trim() === want);

// rawJSON returns the texts in the page's main part that are JSON objects shown as they are
// (a user reads values, not JSON), leaving out what is code or a log on purpose: the template
// editor's textarea, job logs and the details a user unfolds.
const rawJSON = () => page.evaluate(() => {
  const out = [];
  const walk = document.createTreeWalker(document.querySelector('main'), NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    if (n.parentElement.closest('textarea, .job-log, details pre')) continue;
    if (/\{\s*"[^"]*"\s*:/.test(n.textContent)) out.push(n.textContent.slice(0, 200));
  }
  return out;
});

async function main() {
  await step('launch chromium', async () => {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium',
      headless: true,
      viewport: { width: 1280, height: 800 },
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
        '--disable-component-update', '--disable-sync'],
    });
    page = context.pages()[0] || await context.newPage();
    page.setDefaultTimeout(60000);
    watchNet(page);
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    // Failed requests are judged by URL (the console line does not name it): 401 is expected
    // from GET /api/session before login and from the wrong password on purpose.
    page.on('console', (m) => {
      if (m.type() !== 'error' || m.text().startsWith('Failed to load resource')) return;
      if (outage && /WebSocket connection to .* failed/.test(m.text())) return;
      pageErrors.push('console: ' + m.text());
    });
    page.on('response', (r) => {
      if (r.status() < 400) return;
      const path = new URL(r.url()).pathname;
      if (r.status() === 401 && (path === '/api/session' || path === '/api/login')) return;
      pageErrors.push(`${r.request().method()} ${path}: ${r.status()}`);
    });
  });

  await step('a module that fails to download: the page loads again by itself', async () => {
    // The first download of one module the app imports fails as a dropped connection would:
    // the browser then runs none of the app's modules, and boot.js must load the page again.
    let dropped = 0;
    await page.route('**/static/js/jobs.js', (r) => { dropped++; return r.abort('connectionreset'); }, { times: 1 });
    await page.goto(base + '/');
    const seen = await loginForm(page);
    if (dropped !== 1) throw new Error(`the download of jobs.js was dropped ${dropped} times, not once`);
    if (!(seen.notes || []).some((n) => n.includes('kloud: reloading the page: a file failed to download'))) {
      throw new Error(`no reload by boot.js: ${JSON.stringify(seen)}`);
    }
    const shown = { failed: [...seen.failed], notes: [...seen.notes] };
    page._kloudNet.notes.length = 0;
    page._kloudNet.failed.length = 0;
    return shown;
  });

  await step('login through the form', async () => {
    await page.goto(base + '/');
    // A wrong password first: the form says so and stays.
    const seen = await loginForm(page);
    await page.fill('#login-username', user);
    await page.fill('#login-password', 'not-the-password');
    await page.click('#login-submit');
    await poll('login error shown', async () => (await page.textContent('#login-error')).includes('wrong username or password'));
    await page.fill('#login-password', password);
    await page.click('#login-submit');
    await page.waitForSelector('#conn.conn-open');
    await page.waitForSelector(`#header .user:has-text("${user}")`);
    return { hash: await page.evaluate(() => location.hash), ...seen };
  });

  if (withCredential) await credentialSteps();
  else {
    await step(`the credentials page says ${providerName} needs no credential`, async () => {
      await page.goto(base + '/#/credentials');
      await page.waitForSelector('#cred-form');
      await page.selectOption('#cred-provider', providerName);
      const v = await page.evaluate(() => ({ says: (document.getElementById('cred-none') || {}).textContent, add: document.getElementById('cred-add').disabled }));
      if (!v.says || !v.says.includes('needs no credential') || !v.add) throw new Error(`the form offers a credential for a provider that takes none: ${JSON.stringify(v)}`);
      return v;
    });
  }

  await step('a template with a syntax error is refused, saying where', async () => {
    await page.goto(base + '/#/templates/new');
    await page.waitForSelector('#template-form');
    await page.fill('#template-title', 'broken');
    await page.fill('#template-file', 'resource "terraform_data" "vm" {\n  count =\n}\n');
    await page.click('#template-save');
    const sel = '.notice-error:has-text("main.tf:2")';
    await page.waitForSelector(sel);
    const text = (await page.textContent(`${sel} span`)).trim();
    // The sentence says what is wrong; the error code's own words add nothing.
    if (/invalid params/.test(text)) throw new Error(`the error ends in its code: ${text}`);
    await page.click(`${sel} button`); // dismissed
    return { error: text };
  });

  let templateID;
  await step('write a template and plan it', async () => {
    await page.goto(base + '/#/templates/new');
    await page.waitForSelector('#template-form');
    await page.fill('#template-title', 'browser demo');
    await page.fill('#template-file', template);
    await page.click('#template-save');
    await page.waitForFunction(() => /^#\/templates\/[^/]+$/.test(location.hash) && !location.hash.endsWith('/new'));
    templateID = (await page.evaluate(() => location.hash)).split('/')[2];
    await page.waitForSelector('#template-plan:not([disabled])');
    await page.click('#template-plan');
    await page.waitForSelector(`#plan table.grid td:has-text("${label}")`, { timeout: 120000 });
    const raw = await rawJSON();
    if (raw.length) throw new Error(`the plan shows raw JSON: ${raw.join(' | ')}`);
    // A provider default the template does not set is folded under "+N more".
    if (env.KLOUD_PLAN_DEFAULT) {
      const shown = await page.evaluate(() => document.querySelector('#plan table.grid tbody').innerText);
      const folded = await page.evaluate(() => [...document.querySelectorAll('#plan details.plan-more')].map((d) => d.textContent).join(' '));
      if (shown.includes(`${env.KLOUD_PLAN_DEFAULT}=`) || !folded.includes(`${env.KLOUD_PLAN_DEFAULT}=`)) throw new Error(`${env.KLOUD_PLAN_DEFAULT} is not folded: shown ${JSON.stringify(shown)}, folded ${JSON.stringify(folded)}`);
    }
    return { templateID, plan: (await page.textContent('#plan table.grid tbody')).replace(/\s+/g, ' ').trim(), screenshot: await shot('plan.png', true) };
  });

  let stackID;
  const stackTitle = 'browser demo'; // the template's title: the stack's by default
  await step('create the stack and build it, watching progress', async () => {
    await page.click('#template-create-stack');
    await page.waitForSelector('#stack-form');
    // The form says nothing about credentials for a provider that takes none, and offers the
    // one there is for a provider that needs one.
    const form = (await page.textContent('#stack-form')).replace(/\s+/g, ' ');
    if (withCredential) {
      if (!(await page.$(`#stack-cred-${providerName}`))) throw new Error(`no credential select for ${providerName}: ${form}`);
    } else if (/credential/i.test(form)) {
      throw new Error(`the New stack page talks of a credential for ${providerName}, which takes none: ${form}`);
    }
    await shot('stack-new.png');
    await page.click('#stack-create');
    await page.waitForFunction(() => /^#\/stacks\/[^/]+$/.test(location.hash) && !location.hash.endsWith('/new'), null, { timeout: 120000 });
    stackID = (await page.evaluate(() => location.hash)).split('/')[2];
    await page.click('#stack-build');
    await page.waitForSelector('#stack-jobs .job');
    // Sample the progress bar until the job ends: it must move, and end at 100%. The job ends
    // by itself (kloud bounds the wait for its agents): 10 minutes is for a loaded host, where a
    // vagrant machine's apply alone took 100 s and its agent minutes more (CI, 4400e45).
    const seen = new Set();
    const status = await poll('build job finished', async () => {
      const v = await page.evaluate(() => {
        const j = document.querySelector('#stack-jobs .job');
        const bar = j && j.querySelector('.progress-bar');
        return j && { status: j.dataset.status, pct: bar.getAttribute('aria-valuenow'), log: j.querySelector('.job-log').textContent };
      });
      if (v) seen.add(v.pct);
      return v && ['succeeded', 'failed', 'cancelled'].includes(v.status) ? v : null;
    }, 600000, 50);
    // Let the bar's width transition end before the screenshot.
    await poll('bar at full width', () => page.evaluate(() => {
      const bar = document.querySelector('#stack-jobs .progress-bar');
      return bar.getBoundingClientRect().width >= bar.parentElement.getBoundingClientRect().width - 1;
    }), 5000, 50);
    await shot('stack-built.png');
    if (status.status !== 'succeeded') throw new Error(`build ${status.status}: ${status.log}`);
    if (status.pct !== '100') throw new Error(`progress ended at ${status.pct}%`);
    if (!status.log.includes('agent connected')) throw new Error(`log without "agent connected":\n${status.log}`);
    return { stackID, progressSeen: [...seen].map(Number).sort((a, b) => a - b) };
  });

  await step('machine Running with its agent connected', async () => {
    await page.goto(base + '/#/machines');
    // The table renders again as machine states arrive: the row is read in the page, in one
    // go, and looked up again by its selector, never kept as a handle.
    const running = `tr[data-label="${label}"][data-state="Running"][data-agent="connected"]`;
    machineID = await poll(`${label} Running and connected`, async () => {
      const id = await page.evaluate((sel) => { const r = document.querySelector(sel); return r && r.dataset.machine; }, running);
      if (!id) await page.evaluate(() => window.dispatchEvent(new HashChangeEvent('hashchange')));
      return id;
    }, 60000, 1000);
    const row = `tr[data-machine="${machineID}"]`;
    const text = await page.textContent(row);
    // The provider can stop its machines (provider.describe's capabilities): Stop is offered.
    if (!(await page.$(`${row} button[data-power="stop"]:not([disabled])`))) throw new Error(`no Stop button in ${text}`);
    // Its stack is named by its title (the template's: "browser demo"), linking to the stack.
    const stack = await page.textContent(`${row} a[href="#/stacks/${stackID}"]`);
    if (stack !== stackTitle) throw new Error(`the machine's stack is shown as ${JSON.stringify(stack)}, want its title "${stackTitle}"`);
    await shot('machines.png');
    return { machineID, row: text.replace(/\s+/g, ' ').trim() };
  });

  await step('every page renders', async () => {
    const out = {};
    for (const [hash, title] of [['#/teams', 'Teams'], ['#/credentials', 'Credentials'], ['#/templates', 'Templates'],
      ['#/stacks', 'Stacks'], ['#/buckets', 'Buckets'], [`#/templates/${templateID}`, 'Template browser demo'], [`#/machines/${machineID}`, `Machine ${label}`]]) {
      await page.goto(base + '/' + hash);
      await page.waitForSelector(`main h1:has-text("${title}")`);
      if (await page.$('main .card.error')) throw new Error(`${hash}: ${await page.textContent('main .card.error')}`);
      const raw = await rawJSON();
      if (raw.length) throw new Error(`${hash} shows raw JSON: ${raw.join(' | ')}`);
      await axeCheck(page, `${hash} of ${providerName}`); // docs/CONTRIBUTING.md "Accessibility"
      out[hash] = await shot(`page-${hash.replace(/[#/]+/g, '-').replace(/^-|-$/g, '')}.png`);
    }
    return { screenshots: Object.keys(out).length };
  });

  if (quotaAdmin) await quotaSteps();

  await step('the stack pages name the template by its title', async () => {
    const got = {};
    for (const [hash, sel] of [['#/stacks', `tr[data-stack="${stackID}"] a[href="#/templates/${templateID}"]`], [`#/stacks/${stackID}`, `main dl.kv a[href="#/templates/${templateID}"]`]]) {
      await page.goto(base + '/' + hash);
      await page.waitForSelector(sel);
      got[hash] = await page.textContent(sel);
      if (!got[hash].startsWith('browser demo, revision ')) throw new Error(`${hash}: template shown as ${JSON.stringify(got[hash])}, want its title "browser demo"`);
    }
    return got;
  });

  await step('the machine page shows its stack by title, no raw JSON, a placeholder that fits', async () => {
    await page.goto(base + `/#/machines/${machineID}`);
    await page.waitForSelector('#snapshot-name'); // the snapshots section loads on its own
    const problems = []; // all of them at once
    const stack = await page.textContent(`main dl.kv a[href="#/stacks/${stackID}"]`);
    if (stack !== stackTitle) problems.push(`the machine page shows its stack as ${JSON.stringify(stack)}, want its title "${stackTitle}"`);
    // Attribute values read as values: maps as key/value rows, no JSON text anywhere.
    const raw = await rawJSON();
    if (raw.length) problems.push(`the machine page shows raw JSON: ${raw.join(' | ')}`);
    const attrs = await page.evaluate(() => [...document.querySelectorAll('dd[data-attr]')].map((dd) => ({
      name: dd.dataset.attr,
      kloudTags: [...dd.querySelectorAll('details.kloud-tags dt')].map((dt) => dt.textContent),
      kloudTagsOpen: !!dd.querySelector('details.kloud-tags[open]'),
    })));
    const tags = env.KLOUD_TAGS && attrs.find((a) => a.name === env.KLOUD_TAGS);
    if (env.KLOUD_TAGS && (!tags || !tags.kloudTags.includes('kloud_owner') || tags.kloudTagsOpen)) {
      problems.push(`kloud's own tags in ${env.KLOUD_TAGS} are not folded under "kloud tags": ${JSON.stringify(attrs)}`);
    }
    // How to reach it with OpenSSH (its agent reported a host key at the build).
    if (providerName === 'dummy' || providerName === 'local') {
      const ssh = await page.$('#machine-ssh') ? await page.textContent('#machine-ssh') : '';
      if (!ssh.includes('kloud config-ssh') || !/ssh kloud--\S+/.test(ssh)) problems.push(`the machine page does not say how to ssh to it: ${JSON.stringify(ssh)}`);
    }
    // The snapshot name's placeholder fits its input.
    const ph = await page.evaluate(() => {
      const el = document.getElementById('snapshot-name');
      const cs = getComputedStyle(el);
      const ctx = document.createElement('canvas').getContext('2d');
      ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
      const room = el.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      return { placeholder: el.placeholder, width: Math.ceil(ctx.measureText(el.placeholder).width), room };
    });
    if (ph.width > ph.room) problems.push(`the snapshot name's placeholder is cut off: ${JSON.stringify(ph)}`);
    // Unfolded for the screenshot: the attributes (when there are many) and kloud's tags.
    if (await page.$('details.attrs:not([open])')) await page.click('details.attrs > summary');
    if (tags) await page.click(`dd[data-attr="${tags.name}"] details.kloud-tags summary`);
    const screenshot = await shot('machine.png', true);
    await axeCheck(page, `the page of a ${providerName} machine, its attributes unfolded`);
    if (problems.length) throw new Error(problems.join('\n'));
    return { attrs: attrs.map((a) => a.name), placeholder: ph, screenshot };
  });

  if (env.KLOUD_UNAVAILABLE) await unavailableSteps(env.KLOUD_UNAVAILABLE);
  if (withTerminal) await terminalSteps();
  if (withTerminal && shareUser) await shareSteps();
  if (env.KLOUD_AUDIT_USER) await auditSteps();
  if (env.KLOUD_RESTART === '1') await restartSteps();
}

async function credentialSteps() {
  await step('add a credential from the provider form', async () => {
    await page.goto(base + '/#/credentials');
    await page.waitForSelector('#cred-form');
    await page.selectOption('#cred-provider', providerName);
    await page.fill('#cred-title', 'browser cred');
    const types = {};
    for (const [k, v] of Object.entries(credFields)) {
      types[k] = await page.getAttribute(`#cred-${k}`, 'type');
      await page.fill(`#cred-${k}`, String(v));
    }
    await page.click('#cred-add');
    await page.waitForSelector('table.grid tr:has-text("browser cred")');
    await axeCheck(page, `the credentials page with ${providerName}'s form`);
    return { inputTypes: types };
  });

  if (providerName === 'dummy') await dummySchemaSteps();
  if (env.KLOUD_PLUGIN === '1') await pluginSteps();

  await step('authenticate and bootstrap the credential', async () => {
    const row = 'table.grid tr:has-text("browser cred")';
    await page.click(`${row} button:has-text("Authenticate")`);
    await page.waitForSelector(`${row} .badge:has-text("verified")`);
    if (!(await page.$(`${row} button:has-text("Bootstrap")`))) return { bootstrap: 'none offered' };
    await page.click(`${row} button:has-text("Bootstrap")`); // by selector: the table may render again
    const job = await poll('bootstrap job finished', () => page.evaluate(() => {
      const j = document.querySelector('.jobs .job');
      return j && ['succeeded', 'failed', 'cancelled'].includes(j.dataset.status) ? { status: j.dataset.status, text: j.textContent } : null;
    }), 120000, 100);
    if (job.status !== 'succeeded') throw new Error(`bootstrap ${job.status}: ${job.text}`);
    await page.waitForSelector(`${row} .badge:has-text("done")`);
    return { bootstrap: job.status };
  });
}

// unavailableSteps: the providers page says in one short line why provider name (one kloud
// offers, unavailable on this host) is unavailable, the whole error folded under "details", not
// a wall of red text.
async function unavailableSteps(name) {
  await step(`the providers page says briefly why ${name} is unavailable`, async () => {
    await page.goto(base + '/#/providers');
    const row = `tr[data-provider="${name}"]`;
    await page.waitForSelector(row);
    // What the row shows (innerText leaves out a folded detail): a badge, one short line.
    const v = await page.evaluate((row) => {
      const r = document.querySelector(row);
      const bad = getComputedStyle(document.documentElement).getPropertyValue('--bad').trim();
      const probe = document.createElement('span');
      probe.style.color = bad;
      document.body.append(probe);
      const red = getComputedStyle(probe).color;
      probe.remove();
      const d = r.querySelector('details');
      return {
        visible: r.innerText,
        badges: [...r.querySelectorAll('.badge')].map((b) => b.textContent),
        redText: [...r.querySelectorAll('*')].filter((e) => !e.closest('.badge') && [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim()) && getComputedStyle(e).color === red).map((e) => e.textContent.slice(0, 80)),
        detail: d && { open: d.open, text: d.textContent },
      };
    }, row);
    if (!v.badges.includes('unavailable')) throw new Error(`no "unavailable" badge: ${JSON.stringify(v)}`);
    const line = (v.visible.match(/no Docker daemon answers at unix:\/\/\S+/) || [])[0];
    if (!line) throw new Error(`the row does not say "no Docker daemon answers at unix://…": ${JSON.stringify(v.visible)}`);
    if (/DOCKER_HOST|connect:/.test(v.visible)) throw new Error(`the row shows the whole error, not a short line: ${JSON.stringify(v.visible)}`);
    if (v.redText.length) throw new Error(`red error text: ${JSON.stringify(v.redText)}`);
    if (!v.detail || v.detail.open || !v.detail.text.includes('DOCKER_HOST')) throw new Error(`the whole error is not folded under a detail: ${JSON.stringify(v.detail)}`);
    const closed = await shot('providers-unavailable.png');
    // The detail opens on a click and stays open while the page refreshes (on an event, or
    // here after a dropped connection: the page reconnects and reads again).
    await page.click(`${row} details summary`);
    if (!(await page.isVisible(`${row} details pre:has-text("DOCKER_HOST")`))) throw new Error('the detail does not open');
    await page.evaluate(() => { document.querySelector('main table.grid').dataset.seen = '1'; window.kloudDebug.dropConnection(); });
    await poll('the page refreshed', () => page.evaluate(() => !document.querySelector('main table.grid[data-seen]')), 15000, 200);
    if (!(await page.$(`${row} details[open]`))) throw new Error('the detail closed when the page refreshed');
    return { line, screenshots: [closed, await shot('providers-unavailable-detail.png')] };
  });
}

// pluginSteps (KLOUD_PLUGIN=1: the provider is a plugin kloud launched) checks the providers
// page lists it as a connected plugin with its capabilities, and that its credential form comes
// from the schema the plugin sent (KLOUD_PLUGIN_FORM: JSON of field id → {type, required, min,
// max} the form must have).
async function pluginSteps() {
  await step('the providers page shows the plugin and what it can do', async () => {
    await page.goto(base + '/#/providers');
    const row = `tr[data-provider="${providerName}"]`;
    await page.waitForSelector(row);
    const text = (await page.textContent(row)).replace(/\s+/g, ' ').trim();
    for (const want of ['plugin', 'connected', 'start', 'stop', 'info']) {
      if (!text.includes(want)) throw new Error(`providers page row lacks ${want}: ${text}`);
    }
    if (text.includes('not connected')) throw new Error(`plugin shown not connected: ${text}`);
    return { row: text, screenshot: await shot('providers.png') };
  });
  await step("the plugin's credential form comes from its schema", async () => {
    await page.goto(base + '/#/credentials');
    await page.waitForSelector('#cred-form');
    await page.selectOption('#cred-provider', providerName);
    const want = JSON.parse(env.KLOUD_PLUGIN_FORM || '{}');
    const got = {};
    for (const id of Object.keys(want)) {
      got[id] = await page.evaluate((id) => {
        const el = document.getElementById('cred-' + id);
        return el && { type: el.type, required: el.required, min: el.min, max: el.max };
      }, id);
      for (const [k, v] of Object.entries(want[id])) {
        if (!got[id] || got[id][k] !== v) throw new Error(`field ${id}: ${k} is ${got[id] && got[id][k]}, want ${v} (${JSON.stringify(got)})`);
      }
    }
    return { form: got };
  });
}

// dummySchemaSteps checks that the dummy's credential form is built from its JSON Schema (a
// select for the region's enum, a password input with bounds for the secret token, a number
// input with min/max for the quota), that the browser refuses a value the schema refuses, and
// that the update form keeps the secret, cannot change the immutable region and changes the
// quota.
async function dummySchemaSteps() {
  await step('the credential form comes from the provider schema', async () => {
    await page.goto(base + '/#/credentials');
    await page.waitForSelector('#cred-form');
    await page.selectOption('#cred-provider', providerName);
    const form = await page.evaluate(() => {
      const el = (id) => document.getElementById(id);
      const region = el('cred-region');
      const token = el('cred-token');
      const quota = el('cred-quota');
      return {
        region: region && { tag: region.tagName, options: [...region.options].map((o) => o.value), value: region.value },
        token: token && { type: token.type, required: token.required, minLength: token.minLength, maxLength: token.maxLength },
        quota: quota && { type: quota.type, min: quota.min, max: quota.max, step: quota.step },
        labels: [...document.querySelectorAll('#cred-form .field-label')].map((l) => l.textContent),
      };
    });
    const want = (ok, what) => { if (!ok) throw new Error(`${what}: ${JSON.stringify(form)}`); };
    want(form.region && form.region.tag === 'SELECT' && form.region.options.includes('local-1') && form.region.options.includes('local-2') && !form.region.options.includes('mars'), 'region is a select of the enum');
    want(form.token && form.token.type === 'password' && form.token.required && form.token.minLength === 3 && form.token.maxLength === 256, 'token is a required password input with its bounds');
    want(form.quota && form.quota.type === 'number' && form.quota.min === '1' && form.quota.max === '64' && form.quota.step === '1', 'quota is a number input with min/max');
    want(form.labels.includes('API token') && form.labels.includes('Region') && form.labels.includes('Machine quota'), 'labels are the schema titles');
    // The browser refuses what the schema refuses: nothing is sent.
    await page.fill('#cred-title', 'too big');
    await page.fill('#cred-token', 'abc123');
    await page.fill('#cred-quota', '65');
    await page.click('#cred-add');
    const invalid = await page.evaluate(() => !document.getElementById('cred-quota').checkValidity());
    if (!invalid) throw new Error('quota 65 passed the form');
    if (await page.$('table.grid tr:has-text("too big")')) throw new Error('a credential with quota 65 was added');
    await page.fill('#cred-quota', '4');
    await page.selectOption('#cred-region', 'local-2');
    await page.fill('#cred-title', 'schema cred');
    await page.click('#cred-add');
    await page.waitForSelector('table.grid tr:has-text("schema cred")');
    return { form, screenshot: await shot('credential-form.png') };
  });

  await step('update a credential: secret kept, region immutable, quota changed', async () => {
    await page.click('table.grid tr:has-text("schema cred") button.link');
    await page.waitForSelector('#cred-update-form', { state: 'attached' });
    await page.click('details.update summary');
    const upd = await page.evaluate(() => {
      const el = (id) => document.getElementById(id);
      return { region: el('cred-upd-region').disabled, regionValue: el('cred-upd-region').value, token: el('cred-upd-token').value, tokenType: el('cred-upd-token').type, quota: el('cred-upd-quota').value };
    });
    if (!upd.region || upd.regionValue !== 'local-2' || upd.token !== '' || upd.tokenType !== 'password' || upd.quota !== '4') {
      throw new Error(`update form: ${JSON.stringify(upd)}`);
    }
    await page.fill('#cred-upd-quota', '7');
    await page.click('#cred-update');
    await page.waitForSelector('.notice:has-text("updated (quota)")');
    await page.waitForSelector('table.kv, table.grid');
    await poll('quota 7 shown', () => page.evaluate(() => [...document.querySelectorAll('table.grid tr')].some((r) => /Machine quota\s*7/.test(r.textContent))), 10000);
    return { update: upd };
  });
}

async function terminalSteps() {
  let session;
  await step('open the terminal and run echo hello-$((6*7))', async () => {
    await page.goto(base + '/#/machines');
    await page.click(`tr[data-machine="${machineID}"] .term-open`);
    await page.waitForSelector('.term-pane.active[data-state="connected"]', { timeout: 60000 });
    session = await page.getAttribute('.term-pane.active', 'data-session');
    // Wait for the shell's prompt (any output) before typing.
    await poll('shell prompt', async () => (await termLines() || []).some((l) => l.trim() !== ''), 60000);
    await page.click('.term-pane.active .term-host');
    await page.keyboard.type('echo hello-$((6*7))');
    await page.keyboard.press('Enter');
    await poll('hello-42 in the xterm buffer', async () => (await termLines() || []).some((l) => l.trim() === 'hello-42'), 60000);
    // The buffer has it first; xterm paints the rows on its next animation frame.
    await poll('hello-42 rendered in .xterm-rows', async () => (await page.textContent('.term-pane.active .xterm-rows')).includes('hello-42'), 10000);
    return { session, screenshot: await shot('terminal.png') };
  });

  await step('reload: the tab reattaches and the session replays', async () => {
    await page.reload();
    await page.waitForSelector('#conn.conn-open');
    await page.waitForSelector('.term-pane.active[data-state="connected"]', { timeout: 60000 });
    const again = await page.getAttribute('.term-pane.active', 'data-session');
    if (again !== session) throw new Error(`after reload the tab is on session ${again}, not ${session}`);
    await poll('hello-42 replayed after reload', async () => (await termLines() || []).some((l) => l.trim() === 'hello-42'), 60000);
    return { session: again, screenshot: await shot('terminal-after-reload.png') };
  });
}

// shareSteps: alice shares the machine read-only with a second user, who logs in in a second
// browser, watches alice's session live (replay, then her typing) and cannot type; unsharing
// closes the watcher's terminal at once.
async function shareSteps() {
  const session = await page.getAttribute('.term-pane.active', 'data-session');
  let ctx2;
  let bob;
  const profile2 = mkdtempSync(join(tmpdir(), 'kloud-chromium-'));
  try {
    await step(`share the machine read-only with ${shareUser}`, async () => {
      await page.goto(base + `/#/machines/${machineID}`);
      await page.waitForSelector('#share-form');
      await page.fill('#share-username', shareUser);
      await page.selectOption('#share-grant', 'readonly');
      await page.click('#share-form button[type=submit]');
      await page.waitForSelector(`#shares tr:has-text("${shareUser}") .badge:has-text("readonly")`);
      return {};
    });
    await step(`${shareUser} logs in elsewhere and watches the session`, async () => {
      ctx2 = await chromium.launchPersistentContext(profile2, {
        executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium', headless: true, viewport: { width: 1280, height: 800 },
        args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
      });
      bob = ctx2.pages()[0] || await ctx2.newPage();
      bob.setDefaultTimeout(60000);
      bob.on('pageerror', (e) => pageErrors.push(`${shareUser}: ${e}`));
      watchNet(bob);
      await bob.goto(base + '/');
      const seen = await loginForm(bob);
      if (seen.failed) log({ loginPage: shareUser, ...seen }); // how its first load went, when not smoothly
      await bob.fill('#login-username', shareUser);
      await bob.fill('#login-password', sharePassword);
      await bob.click('#login-submit');
      await bob.waitForSelector('#conn.conn-open');
      await bob.waitForSelector(`tr[data-machine="${machineID}"] .badge:has-text("shared: readonly")`);
      if (await bob.$(`tr[data-machine="${machineID}"] button:has-text("Stop")`)) throw new Error('a read-only share is offered Stop');
      await bob.goto(base + `/#/machines/${machineID}`);
      await bob.click(`#term-sessions tr:has(code:text-is("${session}")) button:has-text("Watch")`);
      await bob.waitForSelector('.term-pane.active[data-state="connected"]', { timeout: 60000 });
      await poll(`${shareUser} sees the replay`, () => hasLine(bob, 'hello-42'), 60000);
      return {};
    });
    await step(`${shareUser} sees alice typing live and cannot type`, async () => {
      await page.goto(base + `/#/terminal/${machineID}`);
      await page.waitForSelector('.term-pane.active[data-state="connected"]');
      await page.click('.term-pane.active .term-host');
      await page.keyboard.type('echo live-$((7*6))');
      await page.keyboard.press('Enter');
      await poll(`${shareUser} sees live-42`, () => hasLine(bob, 'live-42'), 60000);
      await bob.click('.term-pane.active .term-host');
      await bob.keyboard.type('echo typed-by-watcher');
      await bob.keyboard.press('Enter');
      await page.keyboard.type('echo marker-$((1+1))');
      await page.keyboard.press('Enter');
      await poll('marker-2 on both screens', async () => await hasLine(page, 'marker-2') && hasLine(bob, 'marker-2'), 60000);
      const leaked = (await termLinesOf(page)).some((l) => l.includes('typed-by-watcher'));
      if (leaked) throw new Error('the read-only watcher typed into the session');
      const shotPath = join(artifacts, 'readonly-watcher.png');
      await bob.screenshot({ path: shotPath });
      return { screenshot: shotPath };
    });
    await step(`unsharing closes ${shareUser}'s terminal`, async () => {
      await page.goto(base + `/#/machines/${machineID}`);
      await page.click(`#shares tr:has-text("${shareUser}") button:has-text("Unshare")`);
      await bob.waitForSelector('.term-pane.active[data-state="error"]', { timeout: 60000 });
      return { watcher: (await bob.textContent('.term-pane.active .term-info')).trim() };
    });
  } finally {
    if (ctx2) await ctx2.close().catch(() => {});
    rmSync(profile2, { recursive: true, force: true });
  }
}

// auditSteps (KLOUD_AUDIT_USER, a kloud administrator, and KLOUD_AUDIT_PASSWORD): alice's menu
// has no Audit page; the administrator, in a second browser, opens it and finds alice's failed
// and successful logins and her stack's build, filters by user, and verifies the chain.
async function auditSteps() {
  const admin = env.KLOUD_AUDIT_USER;
  let ctx3;
  const profile3 = mkdtempSync(join(tmpdir(), 'kloud-chromium-'));
  try {
    await step(`${user} (no administrator) has no Audit page in the menu`, async () => {
      await page.goto(base + '/#/machines');
      await page.waitForSelector('#header nav a[href="#/stacks"]');
      if (await page.$('#header nav a[href="#/audit"]')) throw new Error(`${user} is offered the Audit page`);
      return {};
    });
    await step(`${admin} reads the audit log and verifies its chain`, async () => {
      ctx3 = await chromium.launchPersistentContext(profile3, {
        executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium', headless: true, viewport: { width: 1280, height: 800 },
        args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
      });
      const p = ctx3.pages()[0] || await ctx3.newPage();
      p.setDefaultTimeout(60000);
      p.on('pageerror', (e) => pageErrors.push(`${admin}: ${e}`));
      watchNet(p);
      await p.goto(base + '/');
      const seen = await loginForm(p);
      if (seen.failed) log({ loginPage: admin, ...seen }); // how its first load went, when not smoothly
      await p.fill('#login-username', admin);
      await p.fill('#login-password', env.KLOUD_AUDIT_PASSWORD || '');
      await p.click('#login-submit');
      await p.waitForSelector('#conn.conn-open');
      await p.click('#header nav a[href="#/audit"]');
      await p.waitForSelector('main h1:has-text("Audit log")');
      // The heading shows before the entries arrive: wait for them (a loaded machine is slow).
      await p.waitForSelector('#audit-entries tr[data-seq]');
      const rows = await p.$$eval('#audit-entries tr[data-seq]', (trs) => trs.map((tr) => ({ action: tr.dataset.action, text: tr.textContent })));
      const has = (action, ...words) => rows.some((r) => r.action === action && words.every((w) => r.text.includes(w)));
      const missing = [];
      if (!has('web.login', user, 'ok')) missing.push(`${user}'s login`);
      if (!has('web.login', user, 'error 401')) missing.push(`${user}'s failed login`);
      if (!has('stack.apply', user, 'stack/')) missing.push(`${user}'s stack.apply`);
      if (missing.length) throw new Error(`the audit page lacks ${missing.join(', ')}: ${rows.map((r) => r.text).join(' | ')}`);
      await p.fill('#audit-filter input[name=user]', user);
      await p.click('#audit-filter button[type=submit]');
      await poll('only alice\'s entries', () => p.$$eval('#audit-entries tr[data-seq]', (trs, u) => trs.length > 0 && trs.every((tr) => tr.children[2].textContent === u), user), 60000);
      await p.click('#audit-verify');
      await p.waitForSelector('#audit-verdict.ok');
      const verdict = (await p.textContent('#audit-verdict')).trim();
      if (!verdict.startsWith('Chain ok')) throw new Error(`verify: ${verdict}`);
      const shotPath = join(artifacts, 'audit.png');
      await p.screenshot({ path: shotPath, fullPage: true });
      return { entries: rows.length, verdict, screenshot: shotPath };
    });
  } finally {
    if (ctx3) await ctx3.close().catch(() => {});
    rmSync(profile3, { recursive: true, force: true });
  }
}

// restartSteps: kloud goes away and comes back; the page shows "reconnecting", then carries on
// (and an open terminal tab reattaches to its session).
async function restartSteps() {
  await step('kloud killed: the page shows reconnecting', async () => {
    if (withTerminal) {
      await page.goto(base + `/#/terminal/${machineID}`);
      await page.waitForSelector('.term-pane.active[data-state="connected"]');
    }
    outage = true;
    await ask('kill');
    await page.waitForSelector('#conn.conn-reconnecting', { timeout: 60000 });
    if (withTerminal) await page.waitForSelector('.term-pane.active[data-state="reconnecting"]', { timeout: 60000 });
    return { screenshot: await shot('reconnecting.png'), header: (await page.textContent('#conn')).trim() };
  });
  await step('kloud back: the page reconnects', async () => {
    await ask('start');
    await page.waitForSelector('#conn.conn-open', { timeout: 60000 });
    outage = false;
    if (withTerminal) {
      await page.waitForSelector('.term-pane.active[data-state="connected"]', { timeout: 60000 });
      await poll('hello-42 replayed after kloud restarted', async () => (await termLines() || []).some((l) => l.trim() === 'hello-42'), 60000);
      await shot('terminal-after-restart.png');
    }
    await page.goto(base + '/#/machines');
    await poll(`${label} Running and connected after the restart`, async () => {
      const r = await page.$(`tr[data-label="${label}"][data-state="Running"][data-agent="connected"]`);
      if (!r) await page.evaluate(() => window.dispatchEvent(new HashChangeEvent('hashchange')));
      return r;
    }, 60000, 1000);
    return {};
  });
}

// quotaSteps: the test gave alice a quota of 3 machines; her quota page shows it with her built
// machine in use, without the administrators' form; an administrator (a second browser) shows
// her quota and raises it to 5 on the page; her page then says 5, 1 in use, 4 left.
async function quotaSteps() {
  const cells = (p, sel) => p.$$eval(`${sel} tr[data-resource="machines"] td`, (tds) => tds.map((td) => td.textContent.trim()));
  await step("alice's quota page shows her limit and use", async () => {
    await page.goto(base + '/#/quota');
    await page.waitForSelector('#quota-mine tr[data-resource="machines"]');
    const row = await cells(page, '#quota-mine');
    if (row.join('|') !== 'Machines|3|1|2') throw new Error(`machines row: ${row.join(' | ')}, want limit 3, 1 in use, 2 left`);
    if (await page.$('#quota-form')) throw new Error('a member is offered the administrators\' quota form');
    return { row, screenshot: await shot('quota-member.png') };
  });
  await step(`${quotaAdmin} raises alice's quota on the quota page`, async () => {
    const profile3 = mkdtempSync(join(tmpdir(), 'kloud-chromium-'));
    let ctx3;
    try {
      ctx3 = await chromium.launchPersistentContext(profile3, {
        executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium', headless: true, viewport: { width: 1280, height: 800 },
        args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
      });
      const admin = ctx3.pages()[0] || await ctx3.newPage();
      admin.setDefaultTimeout(60000);
      admin.on('pageerror', (e) => pageErrors.push(`${quotaAdmin}: ${e}`));
      watchNet(admin);
      await admin.goto(base + '/');
      const seen = await loginForm(admin);
      if (seen.failed) log({ loginPage: quotaAdmin, ...seen }); // how its first load went, when not smoothly
      await admin.fill('#login-username', quotaAdmin);
      await admin.fill('#login-password', env.KLOUD_QUOTA_ADMIN_PASSWORD || '');
      await admin.click('#login-submit');
      await admin.waitForSelector('#conn.conn-open');
      await admin.goto(base + '/#/quota');
      await admin.waitForSelector('#quota-form');
      await admin.fill('#quota-name', user);
      await admin.click('#quota-show');
      const shown = `#quota-result [data-subject="user/${user}"]`;
      await admin.waitForSelector(`${shown} tr[data-resource="machines"]`);
      const before = await cells(admin, shown);
      if (before.join('|') !== 'Machines|3|1|2') throw new Error(`admin sees alice's machines row: ${before.join(' | ')}`);
      if (await admin.inputValue('#quota-machines') !== '3') throw new Error('the form is not filled with her quota');
      await admin.fill('#quota-machines', '5');
      await admin.click('#quota-set');
      await poll('the page shows the new limit', async () => (await cells(admin, shown)).join('|') === 'Machines|5|1|4', 15000);
      await admin.screenshot({ path: join(artifacts, 'quota-admin.png') });
    } finally {
      if (ctx3) await ctx3.close().catch(() => {});
      rmSync(profile3, { recursive: true, force: true });
    }
    await page.goto(base + '/#/machines');
    await page.goto(base + '/#/quota');
    await page.waitForSelector('#quota-mine tr[data-resource="machines"]');
    const row = await cells(page, '#quota-mine');
    if (row.join('|') !== 'Machines|5|1|4') throw new Error(`alice's machines row after the raise: ${row.join(' | ')}`);
    return { row };
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
  if (context) await context.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
}
log({ ok, ms: Date.now() - t0, steps: stepCounts().run });
process.exit(ok ? 0 : 1);
