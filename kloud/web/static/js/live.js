// live.js — keeps a page current from kloud's events instead of polling: live() opens an
// event.watch stream (docs/protocol.md "Events") for some topics (and optionally one stack), and
// re-reads the page's data (refresh) when an event comes. Reads never overlap, and event-driven
// ones start at most every minGap ms: the first event after a quiet spell is read at once, a
// burst (a build changing ten machines) makes one more read after the gap, not one each, so a
// busy stack keeps a page well under kloud's per-user rate limit. After a reconnect the stream
// is opened again and the page re-reads (events sent meanwhile are lost). The page ends it with
// stop() when it is left.

const minGap = 250; // ms between the starts of two event-driven reads

// live subscribes, then resolves with {stop, refresh}. onEvent(ev) may return false to skip the
// re-read for an event (it handled it itself). A page reads its data with refresh() after live()
// resolved, so a change between its read and the subscription is not missed, and reads never
// overlap (an older answer never overwrites a newer one); refresh() resolves with what the
// page's refresh returned, or rejects if the read fails.
export async function live(kite, { topics, stackId, refresh, onEvent }) {
  let running = null;
  let again = false;
  let stopped = false;
  let lastStart = 0;
  let timer = null;
  const run = () => {
    if (stopped) return Promise.resolve();
    if (running) { again = true; return running; }
    lastStart = Date.now();
    running = (async () => {
      try {
        return await refresh();
      } finally {
        running = null;
        if (again && !stopped) { again = false; quiet(); }
      }
    })();
    return running;
  };
  // quiet reads again after an event, no sooner than minGap after the last read began; a read
  // that fails is left to the connection indicator (the next event or the reconnect reads again).
  const quiet = () => {
    if (stopped) return;
    if (running) { again = true; return; }
    const wait = lastStart + minGap - Date.now();
    if (wait > 0) {
      if (!timer) timer = setTimeout(() => { timer = null; quiet(); }, wait);
      return;
    }
    run().catch(() => {});
  };
  const params = stackId ? { topics, stackId } : { topics };
  let sub = null;
  try {
    sub = await kite.subscribe('event.watch', params, {
      reopen: true,
      onEvent: (ev) => {
        if (stopped) return;
        if (ev.op !== 'resync' && onEvent && onEvent(ev) === false) return;
        quiet();
      },
      onReopen: () => quiet(),
    });
  } catch (e) {
    console.error('event.watch', e); // an older kloud: the page shows what it read, not live
  }
  return {
    refresh: run,
    stop() {
      stopped = true;
      clearTimeout(timer);
      if (sub) sub.end();
    },
  };
}
