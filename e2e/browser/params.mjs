// params.mjs — a template's typed parameters on the New stack page, in the Debian Chromium
// (playwright-core): the owner (KLOUD_USER, KLOUD_PASSWORD) opens the page of template
// KLOUD_TEMPLATE_ID; the form has a labelled input per parameter (a select for choices, a
// number input, a textarea for a list, a password field for a sensitive one) and the preset
// picker, which fills it (size "large"); a value kloud refuses shows the variable's own message
// next to its field; then the stack is created and built from the page, whose details show the
// values given (not the sensitive one), and whose Parameters card changes a mutable parameter
// (an invalid value refused next to its field) but not the immutable one. Screenshots
// stack-params.png, stack-params-error.png, stack-page-params.png and stack-params-updated.png in
// KLOUD_ARTIFACTS. Prints one JSON line per step
// and a final {"ok": …, "stackId"}; exit status 0 when every step passed. Run by
// e2e/params_test.go.
import path from 'node:path';
import { chromium } from 'playwright-core';
import { log, step, poll, stepCounts, axeCheck } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL;
const tid = env.KLOUD_TEMPLATE_ID;
const shot = (name) => page.screenshot({ path: path.join(env.KLOUD_ARTIFACTS, name), fullPage: true });

const browser = await chromium.launch({
  executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
const page = await context.newPage();
let stackId = '';
try {
  await step('log in', async () => {
    const r = await context.request.post(base + '/api/login', { data: { username: env.KLOUD_USER, password: env.KLOUD_PASSWORD } });
    if (!r.ok()) throw new Error(`login: ${r.status()} ${await r.text()}`);
  });
  await step('the form shows the parameters, filled by the default preset', async () => {
    await page.goto(base + `/#/stacks/new/${encodeURIComponent(tid)}`);
    await page.waitForSelector('#param-size', { timeout: 60000 });
    const kinds = await page.evaluate(() => {
      const out = {};
      for (const el of document.querySelectorAll('[data-param]')) {
        const label = document.querySelector(`label[for="${el.id}"]`);
        out[el.dataset.param] = { tag: el.tagName.toLowerCase(), type: el.type, label: label ? label.textContent.trim() : '', required: el.required };
      }
      return out;
    });
    const want = { size: 'select', cpus: 'number', tags: 'textarea', api_key: 'password' };
    for (const [name, kind] of Object.entries(want)) {
      const k = kinds[name];
      if (!k || (k.tag !== kind && k.type !== kind) || !k.label) throw new Error(`parameter ${name}: ${JSON.stringify(k)}, want a labelled ${kind}`);
    }
    if (!kinds.api_key.required || !kinds.size.label.startsWith('Machine size')) throw new Error(`labels: ${JSON.stringify(kinds)}`);
    const preset = await page.inputValue('#stack-preset');
    const size = await page.inputValue('#param-size');
    if (preset !== 'big' || size !== '"large"') throw new Error(`preset ${preset}, size ${size}: the default preset did not fill the form`);
    const unlabeled = await page.evaluate(() => [...document.querySelectorAll('#stack-form input, #stack-form select, #stack-form textarea')]
      .filter((el) => !el.labels || el.labels.length === 0).map((el) => el.id || el.outerHTML.slice(0, 60)));
    if (unlabeled.length) throw new Error(`inputs without a label: ${unlabeled.join(', ')}`);
    await shot('stack-params.png');
    await axeCheck(page, 'the New stack form with parameters'); // docs/CONTRIBUTING.md "Accessibility"
    return { kinds };
  });
  await step('a value the validation refuses is shown next to its field', async () => {
    await page.fill('#param-cpus', '9');
    await page.fill('#param-api_key', 'k3y-value');
    await page.click('#stack-create');
    const msg = await poll('#param-cpus-error', async () => {
      const t = await page.textContent('#param-cpus-error');
      return t && t.trim() ? t.trim() : null;
    });
    if (msg !== 'A machine has 1 to 4 CPUs.') throw new Error(`cpus error: ${msg}`);
    if (await page.getAttribute('#param-cpus', 'aria-invalid') !== 'true') throw new Error('cpus is not marked invalid');
    await shot('stack-params-error.png');
    await axeCheck(page, 'the New stack form with a refused value');
    return { msg };
  });
  await step('create and build the stack with the form\'s values', async () => {
    await page.fill('#param-cpus', '3');
    await page.fill('#param-tags', '["a", "b"]');
    await page.click('#stack-create');
    await page.waitForURL(/#\/stacks\/[^/]+$/, { timeout: 120000 });
    stackId = decodeURIComponent(page.url().split('#/stacks/')[1]);
    await page.waitForSelector('#stack-build', { timeout: 60000 });
    await page.click('#stack-build');
    await poll('the stack is Initialized', async () => {
      const t = await page.textContent('.title-row .badge', { timeout: 1000 });
      return t && t.trim() === 'Initialized';
    }, 240000, 500);
    const shown = await page.textContent('#stack-parameters');
    for (const want of ['preset big', 'cpus = 3', 'tags = ["a","b"]']) if (!shown.includes(want)) throw new Error(`the stack page shows parameters ${shown}`);
    if (shown.includes('api_key') || shown.includes('k3y')) throw new Error(`the stack page shows the sensitive parameter: ${shown}`);
    await shot('stack-page-params.png');
    await axeCheck(page, 'a stack page with its parameters');
    return { stackId, shown };
  });
  await step('the stack page changes a mutable parameter; an immutable one cannot change', async () => {
    await page.waitForSelector('#update-param-cpus', { timeout: 60000 });
    if (!(await page.isDisabled('#update-param-size'))) throw new Error('size (mutable = false) can be changed');
    if (await page.$('#update-param-api_key')) throw new Error('the sensitive parameter is in the update form');
    if (await page.inputValue('#update-param-cpus') !== '3') throw new Error(`cpus shown as ${await page.inputValue('#update-param-cpus')}`);
    await page.fill('#update-param-cpus', '7');
    await page.click('#stack-params-update');
    const msg = await poll('#update-param-cpus-error', async () => {
      const t = await page.textContent('#update-param-cpus-error');
      return t && t.trim() ? t.trim() : null;
    });
    if (msg !== 'A machine has 1 to 4 CPUs.') throw new Error(`cpus error: ${msg}`);
    await page.fill('#update-param-cpus', '2');
    await page.click('#stack-params-update');
    const shown = await poll('the stack shows cpus = 2', async () => {
      const t = await page.textContent('#stack-parameters', { timeout: 1000 });
      return t && t.includes('cpus = 2') ? t : null;
    }, 240000, 500);
    await poll('the stack is Initialized again', async () => {
      const t = await page.textContent('.title-row .badge', { timeout: 1000 });
      return t && t.trim() === 'Initialized';
    }, 240000, 500);
    await shot('stack-params-updated.png');
    return { shown };
  });
} finally {
  await context.close();
  await browser.close();
}
const failed = stepCounts().failed > 0;
log({ ok: !failed, steps: stepCounts().run, stackId });
process.exit(failed ? 1 : 0);
