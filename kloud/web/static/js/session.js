// session.js — login state. POST /api/login returns a session JWT (and sets the HttpOnly
// kloud_session cookie the terminal WebSockets use); the JWT is kept in sessionStorage for the
// kite handshake, so a reload keeps the login and closing the tab forgets it. Without one,
// GET /api/session recovers it from the cookie.

const KEY = 'kloud.session';

export function getSession() {
  try {
    const s = JSON.parse(sessionStorage.getItem(KEY) || 'null');
    if (s && s.session && (!s.expiresAt || Date.parse(s.expiresAt) > Date.now())) return s;
  } catch { /* corrupt: drop it */ }
  sessionStorage.removeItem(KEY);
  return null;
}

function save(s) {
  sessionStorage.setItem(KEY, JSON.stringify({ session: s.session, username: s.username, admin: !!s.admin, expiresAt: s.expiresAt }));
}

async function errorOf(res) {
  try {
    const b = await res.json();
    if (b && b.error) return b.error;
  } catch { /* not JSON */ }
  return `${res.status} ${res.statusText}`;
}

// restoreSession returns the session, from sessionStorage or else from the cookie. A request
// that gets no answer within 10 s is given up and sent again (twice): the page shows "Loading…"
// until this returns.
export async function restoreSession() {
  const s = getSession();
  if (s) return s;
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const res = await fetch('/api/session', { credentials: 'same-origin', signal: AbortSignal.timeout(10000) });
      if (!res.ok) return null;
      const b = await res.json();
      save(b);
      return getSession();
    } catch (e) {
      if (!e || e.name !== 'TimeoutError') return null;
    }
  }
  return null;
}

// login checks the password with kloud; throws an Error with kloud's message.
export async function login(username, password) {
  const res = await fetch('/api/login', {
    method: 'POST', credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ username, password }),
  });
  if (!res.ok) {
    const msg = await errorOf(res);
    const e = new Error(msg);
    e.status = res.status;
    e.retryAfter = Number(res.headers.get('Retry-After') || 0);
    throw e;
  }
  const b = await res.json();
  save(b);
  return getSession();
}

// forget drops the stored session (it expired or was revoked).
export function forget() {
  sessionStorage.removeItem(KEY);
}

// logout revokes the session at kloud (its connections close) and forgets it.
export async function logout() {
  const s = getSession();
  forget();
  try {
    await fetch('/api/logout', {
      method: 'POST', credentials: 'same-origin',
      headers: s ? { Authorization: 'Bearer ' + s.session } : {},
    });
  } catch { /* offline: the cookie expires anyway */ }
}
