// app.js — the UI's entry point: login state, the kite connection (with its "reconnecting"
// indicator), the hash router (#/machines, #/stacks/ID, #/terminal/MACHINE, …) and the
// terminal tabs, which stay connected while other pages are shown.
//
// A page is a module exporting `render(ctx, el)`; it may return a function that stops what it
// started (polls, job watches) when the page is left. ctx = {kite, session, me, features,
// terminals, navigate, params, refreshMe}.

import { Kite, kiteURL, ErrAuth } from './kite.js';
import { restoreSession, getSession, logout, forget } from './session.js';
import { h, clear, notice, errorText } from './ui.js';
import { Terminals } from './terminal.js';
import * as loginPage from './pages/login.js';
import * as teamsPage from './pages/teams.js';
import * as credentialsPage from './pages/credentials.js';
import * as templatesPage from './pages/templates.js';
import * as stacksPage from './pages/stacks.js';
import * as machinesPage from './pages/machines.js';
import * as providersPage from './pages/providers.js';
import * as auditPage from './pages/audit.js';
import * as quotaPage from './pages/quota.js';
import * as bucketsPage from './pages/buckets.js';

const routes = [
  ['/machines', machinesPage.list],
  ['/machines/:id', machinesPage.detail],
  ['/stacks', stacksPage.list],
  ['/stacks/new', stacksPage.create],
  ['/stacks/new/:template', stacksPage.create],
  ['/stacks/:id', stacksPage.detail],
  ['/buckets', bucketsPage.list],
  ['/templates', templatesPage.list],
  ['/templates/new', templatesPage.editor],
  ['/templates/:id', templatesPage.editor],
  ['/credentials', credentialsPage.list],
  ['/teams', teamsPage.list],
  ['/providers', providersPage.list],
  ['/audit', auditPage.list],
  ['/quota', quotaPage.list],
];

// roleLabel is what the header says after the username: the kloud-wide role but member's.
function roleLabel(me) {
  if (!me) return '';
  if (me.admin) return ' (admin)';
  return me.role && me.role !== 'member' ? ` (${me.role})` : '';
}

const nav = [
  ['#/machines', 'Machines'],
  ['#/stacks', 'Stacks'],
  ['#/buckets', 'Buckets'],
  ['#/templates', 'Templates'],
  ['#/credentials', 'Credentials'],
  ['#/teams', 'Teams'],
  ['#/providers', 'Providers'],
  ['#/quota', 'Quotas'],
];

// adminNav: pages for kloud administrators (owners) and auditors only.
const adminNav = [
  ['#/audit', 'Audit'],
];

function match(path) {
  for (const [pattern, page] of routes) {
    const pp = pattern.split('/'), xs = path.split('/');
    if (pp.length !== xs.length) continue;
    const params = {};
    let ok = true;
    for (let i = 0; i < pp.length; i++) {
      if (pp[i].startsWith(':')) params[pp[i].slice(1)] = decodeURIComponent(xs[i]);
      else if (pp[i] !== xs[i]) { ok = false; break; }
    }
    if (ok) return { page, params };
  }
  return null;
}

// focusHeading gives the focus to the page's heading when the focus was lost (the link or
// button pressed went away with the page or the header it was in): a keyboard user carries on
// from the page's top, and a screen reader reads the page's title. A page that focused a field
// of its own (the login form, the template editor) keeps it.
function focusHeading(main) {
  const a = document.activeElement;
  if (a && a !== document.body && a.isConnected) return;
  const h1 = main.querySelector('h1');
  if (!h1) return;
  h1.tabIndex = -1;
  h1.focus({ preventScroll: true });
}

class App {
  constructor() {
    this.main = document.getElementById('main');
    this.header = document.getElementById('header');
    this.termView = document.getElementById('terminals');
    this.terminals = new Terminals({
      tabs: document.getElementById('term-tabs'),
      panes: document.getElementById('term-panes'),
      empty: document.getElementById('term-empty'),
    });
    this.terminals.onChange(() => this.renderHeader());
    this.cleanup = null;
    this.kite = null;
    this.me = null;
    this.features = new Set();
    window.addEventListener('hashchange', () => this.route());
    window.addEventListener('resize', () => this.terminals.refit());
  }

  async start() {
    const s = await restoreSession();
    if (s) this.connect(s);
    this.route();
  }

  connect(s) {
    this.session = s;
    this.kite = new Kite({ url: kiteURL(), auth: () => { const x = getSession(); return x ? { type: 'session', key: x.session } : null; } });
    this.kite.addEventListener('state', (ev) => this.onKiteState(ev.detail));
    this.kite.connect();
    this.terminals.restore();
  }

  async onKiteState(d) {
    this.renderHeader();
    if (d.state === 'open') {
      if (d.reconnected) notice('Reconnected to kloud.', 'info', 3000);
      try {
        const [me, methods] = await Promise.all([this.kite.call('user.whoami'), this.kite.call('kite.methods')]);
        this.me = me;
        this.features = new Set(Array.isArray(methods) ? methods : (methods && methods.methods) || []);
        this.renderHeader();
        // A page shown before the user was known (what an administrator may do: the Quotas
        // page's form, a stack's owner controls) is shown again now.
        if (this.shownWithoutMe) this.route();
      } catch (e) {
        notice(`whoami: ${errorText(e)}`, 'error');
      }
    }
    if (d.state === 'unauthorized') {
      forget();
      this.kite = null;
      this.me = null;
      this.terminals.closeAll();
      notice(d.error && d.error.code === ErrAuth ? `Please log in again (${errorText(d.error)}).` : 'Please log in.', 'info');
      location.hash = '#/login';
      this.route();
    }
  }

  renderHeader() {
    const k = this.kite;
    let conn = null;
    if (k) {
      const label = {
        idle: 'connecting…', connecting: 'connecting…', open: 'connected', reconnecting: 'reconnecting…', closed: 'offline', unauthorized: 'logged out',
      }[k.state] || k.state;
      let extra = '';
      if (k.state === 'reconnecting' && k.retryAt > Date.now()) extra = ` (retry in ${Math.ceil((k.retryAt - Date.now()) / 1000)} s)`;
      conn = h('span', { id: 'conn', class: `conn conn-${k.state}`, title: 'connection to kloud', 'aria-live': 'polite' }, h('span', { class: 'dot' }), ' ', label + extra);
      if (k.state === 'reconnecting') {
        clearTimeout(this.headerTimer);
        this.headerTimer = setTimeout(() => this.renderHeader(), 1000);
      }
    }
    const ts = this.terminals.summary();
    const user = this.session && getSession();
    clear(this.header,
      h('a', { class: 'brand', href: '#/machines' }, 'Kloud'),
      user ? h('nav', {}, [...nav, ...(this.me && (this.me.admin || this.me.role === 'auditor') ? adminNav : [])].map(([href, text]) => h('a', { href, class: location.hash.startsWith(href) ? 'active' : '' }, text)),
        h('a', { href: this.terminals.active ? `#/terminal/${encodeURIComponent(this.terminals.active.machineId)}` : '#/terminal', class: location.hash.startsWith('#/terminal') ? 'active' : '' },
          'Terminals', ts.open ? h('span', { class: `count ${ts.down ? 'count-warn' : ''}` }, String(ts.open)) : null)) : null,
      h('span', { class: 'spacer' }),
      conn,
      user ? h('span', { class: 'user', title: this.me && this.me.role ? `kloud role: ${this.me.role}` : '' }, user.username, roleLabel(this.me)) : null,
      user ? h('button', { class: 'small', id: 'logout', onclick: () => this.logout() }, 'Log out') : null);
  }

  async logout() {
    this.terminals.closeAll();
    if (this.kite) this.kite.close();
    this.kite = null;
    this.me = null;
    this.session = null;
    await logout();
    location.hash = '#/login';
    this.route();
  }

  navigate(hash) {
    if (location.hash === hash) this.route();
    else location.hash = hash;
  }

  async route() {
    if (this.cleanup) {
      try { this.cleanup(); } catch (e) { console.error(e); }
      this.cleanup = null;
    }
    let path = location.hash.replace(/^#/, '') || '/';
    const s = getSession();
    if (!s || !this.kite) {
      if (s && !this.kite) {
        this.connect(s);
      } else {
        this.showMain();
        this.renderHeader();
        loginPage.render({ onLogin: (sess) => { this.connect(sess); this.navigate(loginPage.next(path)); } }, this.main);
        return;
      }
    }
    if (path === '/' || path === '/login') {
      this.navigate('#/machines');
      return;
    }
    this.renderHeader();
    if (path.startsWith('/terminal')) {
      this.showTerminals(path.split('/')[2]);
      return;
    }
    this.showMain();
    const m = match(path);
    if (!m) {
      clear(this.main, h('section', { class: 'card' }, h('h2', {}, 'Not found'), h('p', {}, 'No page at ', h('code', {}, path), '.')));
      return;
    }
    clear(this.main, h('p', { class: 'loading' }, 'Loading…'));
    this.shownWithoutMe = !this.me;
    const ctx = this.ctx(m.params);
    try {
      const stop = await m.page(ctx, this.main);
      if (typeof stop === 'function') this.cleanup = stop;
      focusHeading(this.main);
    } catch (e) {
      clear(this.main, h('section', { class: 'card error' }, h('h2', {}, 'Could not load this page'), h('p', {}, errorText(e))));
    }
  }

  // loadFeatures returns the methods this kloud serves (machine.share tells whether sharing
  // exists), asking once per connection.
  async loadFeatures() {
    if (!this.features.size) {
      const methods = await this.kite.call('kite.methods');
      this.features = new Set(Array.isArray(methods) ? methods : (methods && methods.methods) || []);
    }
    return this.features;
  }

  ctx(params) {
    const app = this;
    return {
      kite: this.kite,
      session: getSession(),
      get me() { return app.me; },
      get features() { return app.features; },
      loadFeatures: () => this.loadFeatures(),
      terminals: this.terminals,
      params,
      navigate: (hash) => this.navigate(hash),
      openTerminal: (opts) => { this.terminals.open(opts); this.navigate(`#/terminal/${encodeURIComponent(opts.machineId)}`); },
      whoami: async () => (this.me = await this.kite.call('user.whoami')),
    };
  }

  showMain() {
    this.main.hidden = false;
    this.termView.hidden = true;
  }

  showTerminals(machineId) {
    this.main.hidden = true;
    this.termView.hidden = false;
    if (machineId) {
      const id = decodeURIComponent(machineId);
      const tab = this.terminals.list.find((t) => t.machineId === id);
      if (tab) {
        if (this.terminals.active !== tab) this.terminals.activate(tab);
      } else {
        this.openTerminalByID(id);
      }
    }
    this.terminals.refit();
  }

  // openTerminalByID opens a tab for a machine known only by id (a link or a typed URL).
  async openTerminalByID(id) {
    try {
      const m = await this.kite.call('machine.info', { machineId: id });
      this.terminals.open({ machineId: id, label: m.label });
    } catch (e) {
      notice(`terminal: ${errorText(e)}`, 'error');
    }
  }
}

// The modules loaded: boot.js's watch ends, and its count of tries starts again.
window.kloudBooted = true;
sessionStorage.removeItem('kloud.bootTries');

const app = new App();
// Read-only hooks for tests and debugging: the open terminals' text.
window.kloudDebug = {
  terminals: () => app.terminals.list.map((t) => ({ machineId: t.machineId, session: t.session, mode: t.mode, state: t.state })),
  termText: (machineId) => {
    const t = app.terminals.list.find((x) => !machineId || x.machineId === machineId);
    return t ? t.text() : null;
  },
  kiteState: () => (app.kite ? app.kite.state : 'none'),
  // dropConnection closes the kite connection as a network blip would: the page reconnects,
  // reopens its event streams and reads again (live.js).
  dropConnection: () => { if (app.kite && app.kite.ws) app.kite.ws.close(); },
};
app.start();
