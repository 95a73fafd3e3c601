// netcut.mjs — a browser terminal across network cuts of its machine (docs/RELIABILITY.md,
// "Network cuts"), in the Debian Chromium (playwright-core). KLOUD_USER (KLOUD_PASSWORD) logs
// in, opens a terminal on KLOUD_MACHINE_ID from the machines page and runs a command; then, for
// each cut length of KLOUD_CUTS (seconds, comma-separated):
//   - asks the test to cut the machine's link ("cut") and types line A at once (it goes into the
//     dead link: kloud must not confirm it, and the page sends it again on reattach); every
//     second cut leaves the terminal idle instead, and types A once the tab says unreachable
//     (idle: true), so that unreachableMs is measured both ways;
//   - waits for the tab to say "machine unreachable" (unreachableMs, from the cut);
//   - types line B (held by the page: its status line must say so);
//   - asks for the link back when the cut's length has passed ("restore") and types line C at
//     once: reattachMs is when the tab says "connected" again, typingMs when C's output shows,
//     both from the link's return;
//   - every line typed so far must have run exactly once (each appends its name to ~/typed; the
//     shell counts them: the screen alone cannot say, since the echo of input typed ahead mixes
//     into the output of the command before it), and the output from before the first cut must
//     still be on the screen (the replay): a line typed just before a cut (kloud confirms input
//     within a round trip) is not sent again, and neither are the lines of an earlier cut.
// Fails past KLOUD_MAX_UNREACHABLE_MS or KLOUD_MAX_TYPING_MS. Prints one JSON line per step
// (each cut's figures in its "cut" step) and a final {"ok": …}; exit status 0 when every step
// passed. Run by e2e/netcut_test.go.
import path from 'node:path';
import { chromium } from 'playwright-core';
import { log, step, poll, ask, stepCounts } from './lib.mjs';

const env = process.env;
const base = env.KLOUD_URL;
const id = env.KLOUD_MACHINE_ID;
const cuts = (env.KLOUD_CUTS || '30').split(',').map(Number);
const maxUnreachable = Number(env.KLOUD_MAX_UNREACHABLE_MS || 30000);
const maxTyping = Number(env.KLOUD_MAX_TYPING_MS || 3000);

const browser = await chromium.launch({
  executablePath: env.KLOUD_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  const lines = async () => (await page.evaluate((m) => window.kloudDebug && window.kloudDebug.termText(m), id)) || [];
  const count = async (want) => (await lines()).filter((l) => l.trim() === want).length;
  const state = () => page.getAttribute('.term-pane.active', 'data-state', { timeout: 1000 });
  const status = () => page.textContent('.term-pane.active .term-bar', { timeout: 1000 });
  // type sends keystrokes to the terminal (xterm's hidden textarea has the focus).
  const type = async (text) => {
    await page.keyboard.type(text);
    await page.keyboard.press('Enter');
  };
  // line types the command of line name: it records its run in ~/typed and prints name-42.
  const line = (name) => type(`echo ${name} >>~/typed; echo ${name}-$((40+2))`);

  await step('log in and open the terminal', async () => {
    const r = await context.request.post(base + '/api/login', { data: { username: env.KLOUD_USER, password: env.KLOUD_PASSWORD } });
    if (!r.ok()) throw new Error(`login: ${r.status()} ${await r.text()}`);
    await page.goto(base + '/#/machines');
    await page.click(`tr[data-machine="${id}"] .term-open`, { timeout: 60000 });
    await page.waitForSelector('.term-pane.active[data-state="connected"]', { timeout: 60000 });
    await poll('shell prompt', async () => (await lines()).some((l) => l.trim() !== ''), 60000);
    await page.click('.term-pane.active .term-host');
    await line('before');
    await poll('before-42 shown', async () => (await count('before-42')) === 1, 30000);
  });

  const typed = ['before']; // every line typed so far: each must run once
  for (const [i, secs] of cuts.entries()) {
    const tag = (x) => `c${i}${x}`;
    await step(`cut ${i + 1}: ${secs} s`, async () => {
      const cutAt = Date.now();
      const idle = i % 2 === 1;
      await ask('cut');
      if (!idle) await line(tag('a')); // into the dead link
      let sawConnected = false;
      await poll('the tab says the machine is unreachable', async () => (await state()) === 'unreachable', maxUnreachable + 30000, 50);
      const unreachableMs = Date.now() - cutAt;
      if (idle) await line(tag('a'));
      const said = await status();
      if (!said.includes('machine unreachable')) throw new Error(`status line: ${said}`);
      await line(tag('b')); // held by the page
      const heldSaid = await status();
      if (!/bytes typed, held/.test(heldSaid)) throw new Error(`input typed while unreachable: the status line does not say it is held: ${heldSaid}`);
      await page.screenshot({ path: path.join(env.KLOUD_ARTIFACTS, `cut${i + 1}-unreachable.png`) });
      // The link stays down for the cut's length; the tab must not claim "connected" meanwhile.
      while (Date.now() - cutAt < secs * 1000) {
        if ((await state()) === 'connected') sawConnected = true;
        await sleep(250);
      }
      if (sawConnected) throw new Error('the tab said "connected" while the machine was cut off');
      const upAt = Date.now();
      await ask('restore');
      await line(tag('c'));
      await poll('the tab is connected again', async () => (await state()) === 'connected', 60000, 20);
      const reattachMs = Date.now() - upAt;
      await poll(`${tag('c')}-42 shown`, async () => (await count(`${tag('c')}-42`)) >= 1, 60000, 20);
      const typingMs = Date.now() - upAt;
      // Every line typed ran once; the replay kept the output from before the cut.
      // The shell's count: CHECKi, then each line that ran other than once (name×n), then how
      // many ran in all; want "CHECKi <1 + 3 per cut so far>".
      for (const x of ['a', 'b', 'c']) typed.push(tag(x));
      await type(`echo CHECK${i} $(sort ~/typed | uniq -c | awk '$1 != 1 {print $2 "x" $1}') $(wc -l <~/typed)`);
      const want = `CHECK${i} ${typed.length}`;
      let got = '';
      try {
        got = await poll(`the shell's count of the lines run (want "${want}")`, async () => (await lines()).map((l) => l.trim()).find((l) => l.startsWith(`CHECK${i} `)), 10000);
      } catch (e) {
        await page.screenshot({ path: path.join(env.KLOUD_ARTIFACTS, `cut${i + 1}-lost.png`) });
        const tail = (await lines()).filter((l) => l.trim() !== '').slice(-12);
        throw new Error(`${e.message}; status line: ${await status()}; screen's last lines: ${JSON.stringify(tail)}`);
      }
      const again = got === want ? [] : [got];
      const counts = { ranOnce: got === want };
      const replay = await count('before-42');
      await page.screenshot({ path: path.join(env.KLOUD_ARTIFACTS, `cut${i + 1}-back.png`) });
      const figures = { secs, idle, unreachableMs, reattachMs, typingMs, counts, replay, again };
      log({ figures });
      if (again.length) throw new Error(`the lines typed did not each run once: the shell says "${got}", want "${want}" (name×n: ran n times)`);
      if (replay < 1) throw new Error('the output from before the first cut is gone after the reattach (no replay)');
      if (unreachableMs > maxUnreachable) throw new Error(`"machine unreachable" after ${unreachableMs} ms, want ≤ ${maxUnreachable}`);
      if (typingMs > maxTyping) throw new Error(`typing worked again ${typingMs} ms after the link returned, want ≤ ${maxTyping}`);
      return figures;
    });
  }
  await context.close();
} finally {
  await browser.close();
}
const failed = stepCounts().failed > 0;
log({ ok: !failed, steps: stepCounts().run });
process.exit(failed ? 1 : 0);
