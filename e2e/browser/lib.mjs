// lib.mjs — what the browser scripts (ui.mjs, update.mjs) share: one JSON line per event on
// stdout, polling, and asking the Go test that runs the script (e2e/browser_test.go
// runBrowserScript) to act.

export function log(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

// poll calls fn until it returns a truthy value or the deadline passes.
export async function poll(what, fn, timeout = 30000, every = 100) {
  const end = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`${what}: not after ${timeout} ms (last: ${last && last.message ? last.message : JSON.stringify(last)})`);
    await new Promise((r) => setTimeout(r, every));
  }
}

// ask prints {"need": what} for the test driving the script and waits for its answer line on
// stdin: "done", or what went wrong (then it throws).
const answers = [];
let wake = null;
let pending = '';
let listening = false;
export async function ask(what) {
  if (!listening) {
    listening = true;
    process.stdin.setEncoding('utf8');
    process.stdin.on('data', (d) => {
      pending += d;
      let i;
      while ((i = pending.indexOf('\n')) >= 0) {
        answers.push(pending.slice(0, i));
        pending = pending.slice(i + 1);
        if (wake) { const f = wake; wake = null; f(); }
      }
    });
  }
  log({ need: what });
  while (!answers.length) await new Promise((r) => { wake = r; });
  const a = answers.shift();
  if (a !== 'done') throw new Error(`asked for ${what}: ${a}`);
}
