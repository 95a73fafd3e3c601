// login.js — the login form: POST /api/login, then the app connects with the session. When
// kloud has single sign-on (GET /api/login/methods names it), a "Sign in with SSO" link beside
// it goes to /api/oidc/login; kloud's callback sets the session cookie and sends the browser back
// to the UI, which recovers the session from it (session.js restoreSession).

import { h, clear, field } from '../ui.js';
import { login } from '../session.js';

// next is where to go after logging in: the page asked for, else the machines.
export function next(path) {
  return !path || path === '/' || path === '/login' ? '#/machines' : '#' + path;
}

export function render({ onLogin }, el) {
  const user = h('input', { name: 'username', id: 'login-username', autocomplete: 'username', required: true, autofocus: true });
  const pass = h('input', { name: 'password', id: 'login-password', type: 'password', autocomplete: 'current-password', required: true });
  const err = h('p', { class: 'form-error', id: 'login-error', role: 'alert' });
  const btn = h('button', { type: 'submit', class: 'primary', id: 'login-submit' }, 'Log in');
  const form = h('form', { class: 'login', id: 'login-form' },
    h('h1', {}, 'Log in to Kloud'),
    field('Username', user),
    field('Password', pass),
    err, btn);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    err.textContent = '';
    btn.disabled = true;
    try {
      const s = await login(user.value.trim(), pass.value);
      pass.value = '';
      onLogin(s);
    } catch (e) {
      err.textContent = e.message + (e.retryAfter ? ` (wait ${e.retryAfter} s)` : '');
      pass.select();
    } finally {
      btn.disabled = false;
    }
  });
  const sso = h('div', { class: 'login-sso', id: 'login-sso-box' });
  clear(el, h('section', { class: 'card narrow' }, form, sso));
  user.focus();
  loginMethods().then((m) => {
    if (!m || !m.sso) return;
    clear(sso,
      h('p', { class: 'muted' }, 'or'),
      h('a', { class: 'button primary', id: 'login-sso', href: m.sso.url, title: `OpenID provider ${m.sso.issuer}` }, 'Sign in with SSO'));
  });
}

// loginMethods asks kloud what the login page offers (null if it cannot say).
async function loginMethods() {
  try {
    const res = await fetch('/api/login/methods', { credentials: 'same-origin' });
    return res.ok ? await res.json() : null;
  } catch {
    return null;
  }
}
