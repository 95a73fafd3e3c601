// terminal.js — terminal tabs: xterm.js (+ fit addon) on a binary WebSocket per attachment,
// through kloud to the machine's klient:
//
//   GET /api/machines/{id}/terminal?session=NAME&mode=create|attach|shared|readonly&cols=C&rows=R
//   (authenticated by the kloud_session cookie)
//   browser → kloud: binary frames, first byte 0 = input bytes, 1 = resize JSON {"cols","rows"}
//   kloud → browser: binary frames of raw output (a text frame is a JSON notice, e.g. {session})
//
// A session outlives its connections: the open tabs and their session names are kept in
// sessionStorage, so after a reload (or a dropped connection) each tab reattaches (mode=attach)
// and the machine replays the session's recent output. A lost connection shows "reconnecting"
// and retries with backoff; a machine kloud cannot reach (a network cut: kloud's pings of klient
// go unanswered, 4004, or the text notice {unreachable}) shows "machine unreachable" and is
// reattached the moment its agent is back (kloud holds the request open for it).
//
// No keystroke is dropped silently: what is typed while the tab is not attached is held (up to
// HELD_MAX bytes, the status line says how much) and sent when it is attached again, and what
// was sent but not yet confirmed by kloud (the text notice {confirmed: n}, input bytes klient
// has) when a connection is lost is sent again with it. Input past HELD_MAX is refused, and the
// status line says so.

import { Terminal } from '../vendor/xterm/xterm.mjs';
import { FitAddon } from '../vendor/xterm/addon-fit.mjs';
import { h, clear, errorText } from './ui.js';

const STORE = 'kloud.terminals';
const HELD_MAX = 16 * 1024; // bytes of input held while a tab is not attached
const enc = new TextEncoder();
const dec = new TextDecoder();

function newSessionName() {
  const b = new Uint8Array(4);
  crypto.getRandomValues(b);
  return 'web-' + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

function wsBase() {
  return (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host;
}

// sessionsOf asks kloud for the machine's terminal sessions: {ok, status, sessions}.
export async function sessionsOf(machineId) {
  try {
    const res = await fetch(`/api/machines/${encodeURIComponent(machineId)}/sessions`, { credentials: 'same-origin' });
    if (!res.ok) {
      let msg = `${res.status} ${res.statusText}`;
      try { const b = await res.json(); if (b.error) msg = b.error; } catch { /* text */ }
      return { ok: false, status: res.status, error: msg, sessions: [] };
    }
    const b = await res.json();
    const list = Array.isArray(b) ? b : (b.sessions || []);
    return { ok: true, status: res.status, sessions: list };
  } catch (e) {
    return { ok: false, status: 0, error: errorText(e), sessions: [] };
  }
}

// killSession ends a session (DELETE /api/machines/{id}/sessions/{session}); throws kloud's
// message.
export async function killSession(machineId, session) {
  const res = await fetch(`/api/machines/${encodeURIComponent(machineId)}/sessions/${encodeURIComponent(session)}`, { method: 'DELETE', credentials: 'same-origin' });
  if (!res.ok) {
    let msg = `${res.status} ${res.statusText}`;
    try { const b = await res.json(); if (b.error) msg = b.error; } catch { /* text */ }
    throw new Error(`end session ${session}: ${msg}`);
  }
}

// sessionID returns a session entry's id (what ?session= takes); sessionLabel its display
// name.
export function sessionID(s) {
  return (s && (s.session || s.id)) || '';
}

export function sessionLabel(s) {
  return (s && (s.name || s.session || s.id)) || '';
}

// Close codes of a terminal WebSocket (docs/protocol.md, "Web terminal"): what the tab does
// about each. 1000/1001 and the rest: reconnect with backoff.
const CloseUnshared = 4001; // the machine was unshared from us: stop
const CloseEnded = 4002; // the shell exited, was killed or idled out: stop, offer a new one
const CloseTooSlow = 4003; // we fell behind: reattach (the replay catches up)
const CloseAgentGone = 4004; // kloud lost the machine's agent: retry
const CloseRefused = 4005; // klient refused (the reason says why): show it, stop
const CloseBadMessage = 4006; // a frame of ours broke the framing: a bug, stop

class TermTab {
  constructor(mgr, { machineId, label, session, mode }) {
    this.mgr = mgr;
    this.machineId = machineId;
    this.label = label || machineId;
    this.session = session || newSessionName();
    this.mode = mode || 'create';
    this.key = `${machineId}/${this.session}`;
    this.state = 'new';
    this.attempt = 0;
    this.closing = false;
    this.everOpen = false;
    this.receivedAny = false;
    this.attached = false; // kloud's attach notice came on this connection: input goes out
    this.held = []; // input typed while not attached (Uint8Arrays), sent on attach
    this.heldBytes = 0;
    this.refusedBytes = 0; // input refused (HELD_MAX reached) since the last attach
    this.unacked = []; // [{end, bytes}]: input sent on this connection, not yet confirmed
    this.sentTotal = 0; // input bytes sent on this connection
  }

  get readonly() { return this.mode === 'readonly'; }

  mount() {
    this.stateEl = h('span', { class: 'term-state' });
    this.infoEl = h('span', { class: 'term-info' });
    this.host = h('div', { class: 'term-host' });
    this.pane = h('div', { class: 'term-pane', dataset: { machine: this.machineId, session: this.session } },
      h('div', { class: 'term-bar' },
        this.stateEl, this.infoEl,
        h('span', { class: 'spacer' }),
        h('button', { class: 'small', onclick: () => this.reconnect(true) }, 'Reconnect'),
        this.mode === 'readonly' || this.mode === 'shared' ? null : h('button', {
          class: 'small', title: 'kill the shell and its programs', onclick: () => this.end(),
        }, 'End session'),
        h('button', { class: 'small', title: 'detach: the session keeps running', onclick: () => this.mgr.close(this) }, 'Close tab')),
      this.host);
    this.tabEl = h('button', { class: 'tab', title: `${this.label} — session ${this.session}`, onclick: () => this.mgr.activate(this) },
      h('span', { class: 'dot' }), ' ', this.label);
    // The tab and its close button side by side (a button inside a button is no button).
    this.tabBox = h('span', { class: 'tab-box' }, this.tabEl,
      h('button', { class: 'tab-x', title: 'close tab (the session keeps running)', 'aria-label': `close tab ${this.label}`, onclick: () => this.mgr.close(this) }, '×'));
    this.term = new Terminal({
      cursorBlink: true, scrollback: 5000, fontSize: 14,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
      disableStdin: this.readonly,
      // ANSI colours that keep 4.5:1 against the background (WCAG AA; xterm's default red,
      // blue and magenta do not, and kloud's own notices are red and yellow).
      theme: {
        background: '#14161a', foreground: '#e6e6e6',
        red: '#ff6b6b', green: '#5fd787', yellow: '#e5c07b', blue: '#6cb6ff', magenta: '#d78fff', cyan: '#56d4dd',
        brightRed: '#ff8f8f', brightGreen: '#87ffaf', brightYellow: '#ffd787', brightBlue: '#8fc8ff', brightMagenta: '#e5afff', brightCyan: '#87e7ee',
      },
    });
    this.fit = new FitAddon();
    this.term.loadAddon(this.fit);
    // Tab belongs to the shell (completion); Shift+Tab leaves the terminal for the buttons
    // above it, so that the keyboard is never trapped (docs/user-guide.md, "Keyboard").
    this.term.attachCustomKeyEventHandler((ev) => !(ev.key === 'Tab' && ev.shiftKey && !ev.ctrlKey && !ev.altKey && !ev.metaKey));
    this.term.onData((d) => this.sendInput(enc.encode(d)));
    this.term.onBinary((d) => this.sendInput(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
    this.term.onResize(({ cols, rows }) => this.sendResize(cols, rows));
    this.mgr.panes.append(this.pane);
    this.mgr.tabs.append(this.tabBox);
    this.term.open(this.host);
    this.resizeObs = new ResizeObserver(() => this.refit());
    this.resizeObs.observe(this.host);
    this.setState('connecting');
  }

  refit() {
    if (!this.pane.classList.contains('active') || this.host.clientWidth === 0) return;
    cancelAnimationFrame(this.fitFrame);
    this.fitFrame = requestAnimationFrame(() => {
      try { this.fit.fit(); } catch { /* not visible */ }
    });
  }

  setState(s, detail = '') {
    this.state = s;
    const text = {
      connecting: 'connecting…', connected: 'connected', reconnecting: 'reconnecting…', error: 'disconnected', closed: 'closed',
      unreachable: 'machine unreachable',
    }[s] || s;
    this.detail = detail;
    this.stateEl.textContent = text;
    this.stateEl.className = `term-state term-${s}`;
    this.tabEl.dataset.state = s;
    this.pane.dataset.state = s;
    clear(this.infoEl, `session ${this.session}`, this.readonly ? ' · read-only' : '', detail ? ` · ${detail}` : '', this.inputNote());
    this.mgr.changed();
  }

  connect() {
    if (this.closing) return;
    clearTimeout(this.retryTimer);
    const cols = this.term.cols, rows = this.term.rows;
    const q = new URLSearchParams({ session: this.session, mode: this.mode, cols: String(cols), rows: String(rows) });
    const url = `${wsBase()}/api/machines/${encodeURIComponent(this.machineId)}/terminal?${q}`;
    let ws;
    try {
      ws = new WebSocket(url);
    } catch (e) {
      this.retry(errorText(e));
      return;
    }
    ws.binaryType = 'arraybuffer';
    this.ws = ws;
    this.attached = false;
    this.unacked = [];
    this.sentTotal = 0;
    let opened = false;
    // "connected" only once kloud's attach notice came (onAttached): kloud accepts the
    // WebSocket before it reaches klient, and may hold it open while the machine is unreachable.
    ws.onopen = () => {
      if (ws !== this.ws) return;
      opened = true;
    };
    ws.onmessage = (ev) => {
      if (ws !== this.ws) return;
      if (typeof ev.data === 'string') {
        this.notice(ev.data);
        return;
      }
      if (!this.receivedAny || this.attempt) {
        // Output: klient accepted this attachment (kloud accepts the WebSocket before it asks
        // klient, so "open" alone proves nothing); back-off starts over.
        this.receivedAny = true;
        this.attempt = 0;
      }
      this.term.write(new Uint8Array(ev.data));
    };
    ws.onclose = (ev) => {
      if (ws !== this.ws) return;
      this.ws = null;
      this.lostConnection();
      if (this.closing) return;
      const why = ev.reason || (opened ? 'connection lost' : 'could not connect');
      this.onClosed(ev.code, why, opened);
    };
    ws.onerror = () => {};
  }

  // notice handles a text frame: JSON {session, mode, created} (attached: the name kloud gave
  // the session), {unreachable} (kloud waits for the machine's agent), {confirmed} (input bytes
  // klient has) or {error}.
  notice(text) {
    let m;
    try { m = JSON.parse(text); } catch { return; }
    if (m.session) {
      if (m.session !== this.session) {
        this.session = m.session;
        this.pane.dataset.session = m.session;
        this.mgr.save();
      }
      this.onAttached();
      return;
    }
    if (m.unreachable) this.setState('unreachable', m.unreachable);
    if (typeof m.confirmed === 'number') {
      while (this.unacked.length && this.unacked[0].end <= m.confirmed) this.unacked.shift();
    }
    if (m.error) this.setState(this.state, m.error);
  }

  // onAttached: kloud attached this connection to the session. The replay repaints the screen
  // (a reattach resets it first), and held input goes out.
  onAttached() {
    this.everOpen = true;
    this.attached = true;
    if (this.resetOnAttach) {
      this.resetOnAttach = false;
      this.term.reset();
    }
    // From now on a new connection rejoins this session.
    if (this.mode === 'create') {
      this.mode = 'attach';
      this.mgr.save();
    }
    const held = this.held;
    this.held = [];
    this.heldBytes = 0;
    this.refusedBytes = 0;
    this.setState('connected');
    this.sendResize(this.term.cols, this.term.rows);
    for (const b of held) this.sendInput(b);
  }

  // lostConnection: the connection closed. Input it carried that kloud had not confirmed goes
  // back in front of what is held, to be sent on the next attachment.
  lostConnection() {
    this.attached = false;
    if (this.unacked.length) {
      const back = this.unacked.map((u) => u.bytes);
      this.unacked = [];
      this.held = back.concat(this.held);
      this.heldBytes = this.held.reduce((n, b) => n + b.length, 0);
    }
    this.resetOnAttach = this.mode !== 'create';
  }

  // dropHeld refuses the held input: it was typed for a session that has ended, and goes to no
  // other (the status line counts it as not sent).
  dropHeld() {
    this.refusedBytes += this.heldBytes;
    this.held = [];
    this.heldBytes = 0;
  }

  // inputNote is the status line's word on input typed while not attached.
  inputNote() {
    if (this.readonly) return '';
    const parts = [];
    if (this.heldBytes) parts.push(` · ${this.heldBytes} bytes typed, held: sent when attached again`);
    if (this.refusedBytes) parts.push(` · ${this.refusedBytes} bytes typed NOT sent (more than ${HELD_MAX} held)`);
    return parts.join('');
  }

  // onClosed decides what to do after the connection closed with code.
  onClosed(code, why, opened) {
    switch (code) {
      case CloseUnshared:
        this.term.write(`\r\n\x1b[31m[kloud] ${why}]\x1b[0m\r\n`);
        this.setState('error', why);
        return;
      case CloseEnded:
        this.term.write(`\r\n\x1b[33m[kloud] session ended: ${why}; "Reconnect" starts a new one]\x1b[0m\r\n`);
        this.ended = true;
        this.dropHeld();
        this.setState('closed', 'session ended');
        return;
      case CloseBadMessage:
        this.setState('error', why);
        return;
      case CloseRefused:
        // klient's own verdict (no such session, limit, not shared): show it; "Reconnect" tries
        // again.
        this.term.write(`\r\n\x1b[31m[kloud] ${why}]\x1b[0m\r\n`);
        this.setState('error', why);
        return;
      case CloseTooSlow:
        this.retry(why);
        return;
      case CloseAgentGone:
        // kloud lost the machine (or waited for its agent in vain): say so, and ask again soon;
        // kloud holds the next request open until the agent is back.
        this.setState('unreachable', why);
        this.retryTimer = setTimeout(() => this.reconnect(false), 500 + Math.random() * 500);
        return;
    }
    if (!opened) this.afterFailedOpen(why);
    else this.retry(why);
  }

  // afterFailedOpen decides what a refused connection means: no such session any more (start
  // a new one), not allowed (stop), or kloud/the machine unreachable (retry).
  async afterFailedOpen(why) {
    const r = await sessionsOf(this.machineId);
    if (this.closing) return;
    if (r.ok) {
      const names = r.sessions.map(sessionID);
      if (this.mode === 'attach' && !names.includes(this.session)) {
        // The session ended (exit, kill, orphan timeout): start a fresh one.
        this.term.write('\r\n\x1b[33m[kloud] session ' + this.session + ' has ended; starting a new one]\x1b[0m\r\n');
        this.dropHeld();
        this.session = newSessionName();
        this.pane.dataset.session = this.session;
        this.mode = 'create';
        this.mgr.save();
        this.connect();
        return;
      }
      this.retry(why);
      return;
    }
    if (r.status === 401) {
      this.setState('error', 'your session expired: log in again');
      return;
    }
    if (r.status === 403 || r.status === 404) {
      this.setState('error', r.error || why);
      return;
    }
    this.retry(r.error || why);
  }

  retry(why) {
    if (this.closing) return;
    const base = Math.min(15000, 500 * 2 ** this.attempt);
    const delay = Math.round(base * (0.8 + Math.random() * 0.4));
    this.attempt++;
    this.setState('reconnecting', `${why}; retry ${this.attempt} in ${Math.max(1, Math.round(delay / 1000))} s`);
    this.retryTimer = setTimeout(() => this.reconnect(false), delay);
  }

  // reconnect opens a new connection to the same session; its replay repaints the screen.
  reconnect(manual) {
    if (this.closing) return;
    if (manual) this.attempt = 0;
    if (this.ended) {
      // The shell is gone: a new session in this tab.
      this.ended = false;
      this.session = newSessionName();
      this.pane.dataset.session = this.session;
      this.mode = this.mode === 'readonly' || this.mode === 'shared' ? this.mode : 'create';
      this.mgr.save();
      this.term.reset();
      this.setState('connecting');
      this.connect();
      return;
    }
    if (this.ws) {
      const old = this.ws;
      this.ws = null;
      this.lostConnection();
      old.close(1000, 'reconnecting');
    }
    // The screen stays until the new attachment's replay repaints it (onAttached).
    this.resetOnAttach = this.mode !== 'create';
    if (this.state !== 'unreachable' || manual) this.setState(this.everOpen ? 'reconnecting' : 'connecting');
    this.connect();
  }

  // end kills the session and closes the tab.
  async end() {
    if (!confirm(`End session ${this.session}? Its shell and programs are killed.`)) return;
    try {
      await killSession(this.machineId, this.session);
    } catch (e) {
      this.setState(this.state, errorText(e));
      return;
    }
    this.mgr.close(this);
  }

  sendInput(bytes) {
    if (this.readonly || bytes.length === 0) return;
    if (!this.attached || !this.ws || this.ws.readyState !== WebSocket.OPEN) {
      this.hold(bytes);
      return;
    }
    const f = new Uint8Array(bytes.length + 1);
    f[0] = 0;
    f.set(bytes, 1);
    this.ws.send(f);
    this.sentTotal += bytes.length;
    this.unacked.push({ end: this.sentTotal, bytes });
  }

  // hold keeps input typed while the tab is not attached, up to HELD_MAX bytes; the rest is
  // refused, and the status line says so.
  hold(bytes) {
    if (this.ended) {
      this.refusedBytes += bytes.length;
    } else if (this.heldBytes + bytes.length > HELD_MAX) {
      this.refusedBytes += bytes.length;
    } else {
      this.held.push(bytes);
      this.heldBytes += bytes.length;
    }
    this.setState(this.state, this.detail);
  }

  sendResize(cols, rows) {
    if (!this.attached || !this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    const j = enc.encode(JSON.stringify({ cols, rows }));
    const f = new Uint8Array(j.length + 1);
    f[0] = 1;
    f.set(j, 1);
    this.ws.send(f);
  }

  // text returns the terminal's buffer as lines (tests and debugging).
  text() {
    const b = this.term.buffer.active;
    const out = [];
    for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true));
    return out;
  }

  dispose() {
    this.closing = true;
    clearTimeout(this.retryTimer);
    if (this.ws) this.ws.close(1000, 'tab closed');
    this.resizeObs.disconnect();
    this.term.dispose();
    this.pane.remove();
    this.tabBox.remove();
  }
}

// Terminals is the set of open terminal tabs.
export class Terminals {
  constructor({ tabs, panes, empty }) {
    this.tabs = tabs;
    this.panes = panes;
    this.empty = empty;
    this.list = [];
    this.active = null;
    this.listeners = [];
  }

  onChange(fn) { this.listeners.push(fn); }

  changed() { for (const fn of this.listeners) fn(); }

  save() {
    const tabs = this.list.map((t) => ({ machineId: t.machineId, label: t.label, session: t.session, mode: t.mode }));
    sessionStorage.setItem(STORE, JSON.stringify({ tabs, active: this.active ? this.active.key : '' }));
  }

  // restore reopens the tabs of this browser tab's earlier page (after a reload): each
  // reattaches to its session.
  restore() {
    let st;
    try { st = JSON.parse(sessionStorage.getItem(STORE) || 'null'); } catch { st = null; }
    if (!st || !Array.isArray(st.tabs)) return;
    for (const t of st.tabs) {
      if (!t.machineId || !t.session) continue;
      // A session this page created is rejoined; shared and read-only views keep their mode.
      const mode = t.mode === 'create' ? 'attach' : (t.mode || 'attach');
      this._add({ ...t, mode });
    }
    const active = this.list.find((t) => t.key === st.active) || this.list[0];
    if (active) this.activate(active);
  }

  _add(opts) {
    const tab = new TermTab(this, opts);
    this.list.push(tab);
    tab.mount();
    this.empty.hidden = true;
    tab.connect();
    this.save();
    return tab;
  }

  // open shows a terminal on machine: the tab already open for it (or for that session), else
  // a new tab that starts (mode create) or joins (attach/shared/readonly) a session.
  open({ machineId, label, session, mode }) {
    let tab = this.list.find((t) => t.machineId === machineId && (!session || t.session === session));
    if (!tab) tab = this._add({ machineId, label, session, mode: mode || (session ? 'attach' : 'create') });
    this.activate(tab);
    return tab;
  }

  activate(tab) {
    this.active = tab;
    for (const t of this.list) {
      const on = t === tab;
      t.pane.classList.toggle('active', on);
      t.tabEl.classList.toggle('active', on);
      t.tabEl.setAttribute('aria-current', on ? 'true' : 'false');
    }
    this.save();
    if (location.hash !== `#/terminal/${encodeURIComponent(tab.machineId)}`) {
      history.replaceState(null, '', `#/terminal/${encodeURIComponent(tab.machineId)}`);
    }
    requestAnimationFrame(() => { tab.refit(); tab.term.focus(); });
  }

  // close detaches a tab; its session keeps running on the machine.
  close(tab) {
    tab.dispose();
    this.list = this.list.filter((t) => t !== tab);
    if (this.active === tab) this.active = null;
    this.empty.hidden = this.list.length > 0;
    if (!this.active && this.list.length) this.activate(this.list[this.list.length - 1]);
    this.save();
    this.changed();
  }

  refit() {
    if (this.active) this.active.refit();
  }

  closeAll() {
    for (const t of [...this.list]) t.dispose();
    this.list = [];
    this.active = null;
    sessionStorage.removeItem(STORE);
  }

  // reconnecting counts tabs that are not connected.
  summary() {
    return {
      open: this.list.length,
      down: this.list.filter((t) => t.state !== 'connected').length,
    };
  }
}
