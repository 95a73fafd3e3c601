// kite.js — the kite protocol v1 client for the browser (docs/protocol.md): JSON-RPC 2.0 over
// a WebSocket at /kite with subprotocol kite.v1, kite.handshake with a session, calls with ids
// and timeouts (kite.cancel when one gives up), streams by subscription id, liveness pings, and
// reconnection with backoff. Listeners of "state" see connecting → open → reconnecting → open …,
// or "unauthorized" when the session is refused (the page must log in again).

export class KiteError extends Error {
  constructor({ code, message, data }) {
    super(message || 'kite error');
    this.code = code;
    this.data = data;
    this.type = (data && data.type) || '';
  }
}

// Codes of errors the client makes itself (not from the server).
export const ErrDisconnected = -32099;
export const ErrTimeout = -32006;
export const ErrAuth = -32001;

function randomID() {
  if (globalThis.crypto && crypto.randomUUID) return crypto.randomUUID();
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

// A Subscription is an open stream: events go to onEvent; end() stops it.
export class Subscription {
  constructor(kite, method, params, handlers) {
    this.kite = kite;
    this.method = method;
    this.params = params;
    this.handlers = handlers;
    this.id = null;
    this.closed = false;
    this.result = null;
  }

  // end stops the stream (kite.unsubscribe) and forgets it.
  end() {
    if (this.closed) return;
    this.closed = true;
    this.kite._dropSub(this);
    if (this.id && this.kite.state === 'open') {
      this.kite._notify('kite.unsubscribe', { subscription: this.id });
    }
  }
}

export class Kite extends EventTarget {
  // url: the /kite WebSocket URL; auth(): {type, key} for the handshake, or null when there is
  // no session (state becomes "unauthorized").
  // openTimeout: a WebSocket that has not opened by then is given up and tried again (a stalled
  // connection would otherwise leave the page "connecting" for good).
  constructor({ url, auth, backoffMin = 500, backoffMax = 15000, pingEvery = 20000, callTimeout = 60000, openTimeout = 10000 }) {
    super();
    this.url = url;
    this.auth = auth;
    this.openTimeout = openTimeout;
    this.backoffMin = backoffMin;
    this.backoffMax = backoffMax;
    this.pingEvery = pingEvery;
    this.callTimeout = callTimeout;
    this.identity = {
      username: '', environment: 'browser', name: 'kloud-web', version: '1',
      region: '', hostname: location.hostname, id: randomID(),
    };
    this.state = 'idle';
    this.ws = null;
    this.nextID = 1;
    this.pending = new Map(); // request id → {resolve, reject, timer, method}
    this.subs = new Map(); // subscription id → Subscription
    this.early = new Map(); // subscription id → [params] that came before the response
    this.active = new Set(); // Subscriptions to reopen after a reconnect
    this.waiters = []; // resolvers waiting for "open"
    this.attempt = 0;
    this.retryAt = 0;
    this.stopped = false;
    this.everOpen = false;
    this.username = '';
    this._onOnline = () => this._retryNow();
    window.addEventListener('online', this._onOnline);
  }

  _setState(s, detail = {}) {
    this.state = s;
    this.dispatchEvent(new CustomEvent('state', { detail: { state: s, ...detail } }));
  }

  // connect opens the connection (and keeps it open until close()).
  connect() {
    this.stopped = false;
    if (this.ws) return;
    const auth = this.auth();
    if (!auth) {
      this._setState('unauthorized', { error: new KiteError({ code: ErrAuth, message: 'not logged in' }) });
      return;
    }
    this._setState(this.everOpen ? 'reconnecting' : 'connecting', { attempt: this.attempt });
    let ws;
    try {
      ws = new WebSocket(this.url, 'kite.v1');
    } catch (e) {
      this._scheduleRetry();
      return;
    }
    this.ws = ws;
    const opening = setTimeout(() => {
      if (ws === this.ws && ws.readyState === WebSocket.CONNECTING) ws.close(); // onclose: retry
    }, this.openTimeout);
    ws.onopen = () => { clearTimeout(opening); this._handshake(ws, auth); };
    ws.onmessage = (ev) => {
      if (typeof ev.data !== 'string') return; // kite frames are text
      let msg;
      try { msg = JSON.parse(ev.data); } catch { return; }
      this._receive(msg);
    };
    ws.onclose = (ev) => { clearTimeout(opening); this._closed(ws, ev); };
    ws.onerror = () => {}; // onclose follows
  }

  async _handshake(ws, auth) {
    try {
      const res = await this._rawCall('kite.handshake', { kite: this.identity, auth }, 15000, true);
      if (ws !== this.ws) return;
      this.username = res.username;
      const wasOpen = this.everOpen;
      this.everOpen = true;
      this.attempt = 0;
      this._setState('open', { username: res.username, reconnected: wasOpen });
      for (const w of this.waiters.splice(0)) w.resolve();
      this._startPing();
      if (wasOpen) this._reopenStreams();
    } catch (e) {
      if (ws !== this.ws) return;
      if (e.code === ErrAuth) {
        this.stopped = true;
        this._setState('unauthorized', { error: e });
        for (const w of this.waiters.splice(0)) w.reject(e);
        ws.close(1000, 'unauthorized');
        return;
      }
      ws.close(4000, 'handshake failed');
    }
  }

  _startPing() {
    clearInterval(this.pingTimer);
    this.pingTimer = setInterval(async () => {
      const ws = this.ws;
      try {
        await this._rawCall('kite.ping', {}, 10000, true);
      } catch (e) {
        if (ws === this.ws && ws) ws.close(4001, 'no answer to ping'); // dead link: reconnect
      }
    }, this.pingEvery);
  }

  _closed(ws, ev) {
    if (ws !== this.ws) return;
    this.ws = null;
    clearInterval(this.pingTimer);
    const err = new KiteError({ code: ErrDisconnected, message: 'connection to kloud lost', data: { type: 'disconnected' } });
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(err);
      this.pending.delete(id);
    }
    // Streams of the old connection are gone; reopenable ones come back after the handshake.
    for (const s of this.subs.values()) {
      if (!this.active.has(s)) this._endSub(s, err);
    }
    this.subs.clear();
    this.early.clear();
    if (this.stopped) {
      if (this.state !== 'unauthorized') this._setState('closed');
      return;
    }
    this._scheduleRetry(ev && ev.reason);
  }

  _scheduleRetry(reason) {
    const base = Math.min(this.backoffMax, this.backoffMin * 2 ** this.attempt);
    const delay = Math.round(base * (0.8 + Math.random() * 0.4));
    this.attempt++;
    this.retryAt = Date.now() + delay;
    this._setState('reconnecting', { attempt: this.attempt, retryAt: this.retryAt, reason: reason || '' });
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  _retryNow() {
    if (this.stopped || this.ws) return;
    clearTimeout(this.retryTimer);
    this.connect();
  }

  // close stops the client for good (logout).
  close() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    clearInterval(this.pingTimer);
    window.removeEventListener('online', this._onOnline);
    for (const s of [...this.active]) s.end();
    if (this.ws) this.ws.close(1000, 'bye');
    else this._setState('closed');
  }

  // ready resolves once the connection is open (handshake done).
  ready(timeout = this.callTimeout) {
    if (this.state === 'open') return Promise.resolve();
    if (this.state === 'unauthorized') return Promise.reject(new KiteError({ code: ErrAuth, message: 'not logged in' }));
    return new Promise((resolve, reject) => {
      const w = { resolve: () => { clearTimeout(t); resolve(); }, reject: (e) => { clearTimeout(t); reject(e); } };
      const t = setTimeout(() => {
        this.waiters = this.waiters.filter((x) => x !== w);
        reject(new KiteError({ code: ErrDisconnected, message: 'kloud is not reachable (still reconnecting)', data: { type: 'disconnected' } }));
      }, timeout);
      this.waiters.push(w);
    });
  }

  // call sends a request once the connection is open and resolves with its result; a KiteError
  // carries the server's code and data.type.
  async call(method, params = {}, { timeout = this.callTimeout } = {}) {
    await this.ready(timeout);
    return this._rawCall(method, params, timeout, false);
  }

  _rawCall(method, params, timeout) {
    const ws = this.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN) {
      return Promise.reject(new KiteError({ code: ErrDisconnected, message: 'connection to kloud lost', data: { type: 'disconnected' } }));
    }
    const id = this.nextID++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        this._notify('kite.cancel', { id });
        reject(new KiteError({ code: ErrTimeout, message: `${method}: no answer within ${Math.round(timeout / 1000)} s`, data: { type: 'timeout' } }));
      }, timeout);
      this.pending.set(id, { resolve, reject, timer, method });
      ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
    });
  }

  _notify(method, params) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ jsonrpc: '2.0', method, params }));
    }
  }

  _receive(msg) {
    if (msg.id !== undefined && msg.id !== null && !msg.method) {
      const p = this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      clearTimeout(p.timer);
      if (msg.error) p.reject(new KiteError(msg.error));
      else p.resolve(msg.result);
      return;
    }
    if (!msg.method) return;
    const params = msg.params || {};
    if (msg.id !== undefined && msg.id !== null) {
      // The server calling us: we serve nothing.
      this.ws.send(JSON.stringify({ jsonrpc: '2.0', id: msg.id, error: { code: -32601, message: `${msg.method}: the browser serves no methods`, data: { type: 'methodNotFound' } } }));
      return;
    }
    const sid = params.subscription;
    if (!sid) return;
    const s = this.subs.get(sid);
    if (!s) {
      // May arrive before the response that carries the id: keep it (bounded).
      const q = this.early.get(sid) || [];
      if (q.length < 4096) q.push(params);
      this.early.set(sid, q);
      return;
    }
    this._deliver(s, params);
  }

  _deliver(s, params) {
    if (s.closed) return;
    if (params.end) {
      this.subs.delete(s.id);
      this.active.delete(s);
      s.closed = true;
      this._endSub(s, params.error ? new KiteError(params.error) : null);
      return;
    }
    try { s.handlers.onEvent && s.handlers.onEvent(params.data, s); } catch (e) { console.error(e); }
  }

  _endSub(s, err) {
    try { s.handlers.onEnd && s.handlers.onEnd(err, s); } catch (e) { console.error(e); }
  }

  _dropSub(s) {
    this.active.delete(s);
    if (s.id) this.subs.delete(s.id);
  }

  // subscribe calls a method that opens a stream (its result has `subscription`) and delivers
  // the stream's events to onEvent(data). With reopen, the call is made again after a
  // reconnect and onReopen(result) tells the caller to start over (a stream resends its state).
  // Resolves with the Subscription (its result is the call's result).
  async subscribe(method, params, { onEvent, onEnd, onReopen, reopen = false, timeout } = {}) {
    const s = new Subscription(this, method, params, { onEvent, onEnd, onReopen });
    s.reopen = reopen;
    if (reopen) this.active.add(s);
    try {
      await this._open(s, timeout);
    } catch (e) {
      this.active.delete(s);
      s.closed = true;
      throw e;
    }
    return s;
  }

  async _open(s, timeout) {
    const res = await this.call(s.method, s.params, { timeout });
    if (s.closed) {
      if (res && res.subscription) this._notify('kite.unsubscribe', { subscription: res.subscription });
      return;
    }
    s.result = res;
    s.id = res && res.subscription;
    if (!s.id) throw new KiteError({ code: -32603, message: `${s.method} opened no stream` });
    this.subs.set(s.id, s);
    const q = this.early.get(s.id) || [];
    this.early.delete(s.id);
    for (const p of q) this._deliver(s, p);
  }

  async _reopenStreams() {
    for (const s of [...this.active]) {
      if (s.closed) continue;
      s.id = null;
      try {
        await this._open(s);
        if (s.handlers.onReopen) s.handlers.onReopen(s.result, s);
      } catch (e) {
        this.active.delete(s);
        s.closed = true;
        this._endSub(s, e);
      }
    }
  }
}

// kiteURL is this page's /kite as a WebSocket URL.
export function kiteURL() {
  return (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/kite';
}
