// machines.js — machines: state, agent status (connected / disconnected / never, last seen),
// IP and reason; start / stop with live progress; terminals (new session, or the machine's
// running sessions: attach, join, watch); and sharing (machine.share / unshare / shares) when
// this kloud offers it (kite.methods). Start and stop are offered only if the machine's provider
// has the capability (provider.describe, ../providers.js): otherwise the button is shown
// disabled, saying why.

import { h, clear, table, badge, busy, field, section, notice, fmtTime, ago, shortID, errorText, attrValue, errorDetail, reasonCell, isEmpty } from '../ui.js';
import { watchJob } from '../jobs.js';
import { live } from '../live.js';
import { sessionsOf, sessionID, sessionLabel, killSession } from '../terminal.js';
import { providers, can } from '../providers.js';
import { snapshotsSection } from './snapshots.js';
import { portsSection } from './ports.js';
import { idleCell, idleSection, idleText } from './idle.js';

const running = (m) => m.state === 'Running';
const canStart = (m) => m.state === 'Stopped';
const canStop = (m) => m.state === 'Running';

// myGrant is what the caller may do with m: "owner", or the grant of a share.
export function myGrant(ctx, m) {
  const me = ctx.session.username;
  if (m.owner === me) return 'owner';
  const s = (m.shares || []).find((x) => x.username === me);
  return s ? s.grant : (ctx.me && ctx.me.admin ? 'admin' : '');
}

export function agentCell(m) {
  const a = m.agent || {};
  const status = a.status || 'never';
  return h('span', { class: 'agent', title: a.version ? `klient ${a.version}` : '' },
    badge(status, `agent-${status}`),
    status === 'never' ? '' : h('small', { class: 'muted' }, ' last seen ', a.lastSeen ? ago(a.lastSeen) : 'never'));
}

// powerButton is the start or stop button of m (attrs: its class), disabled when m's provider
// lacks the capability.
export function powerButton(ctx, m, method, caps, attrs, jobsEl, onDone) {
  const label = method === 'start' ? 'Start' : 'Stop';
  if (!can(caps, m.provider, method)) {
    return h('button', { ...attrs, disabled: true, dataset: { unsupported: method }, title: `provider ${m.provider} does not support ${method}` }, label);
  }
  return h('button', { ...attrs, dataset: { power: method }, onclick: (ev) => busy(ev.target, () => power(ctx, m, method, jobsEl, onDone)) }, label);
}

async function power(ctx, m, method, jobsEl, onDone) {
  const r = await ctx.kite.call(`machine.${method}`, { machineId: m.id });
  return watchJob(ctx.kite, r.jobId, jobsEl, { title: `${method === 'start' ? 'Starting' : 'Stopping'} ${m.label}`, onDone });
}

// stackLink links to stack id by its title (its id's prefix when the title is not known).
function stackLink(id, title) {
  return h('a', { href: `#/stacks/${encodeURIComponent(id)}`, title: `stack ${id}` }, title || shortID(id));
}

// machineTable lists machines with their actions; jobs show in jobsEl. caps is what
// providers() returned (the providers' capabilities).
// stackTitles (machine.list's) names the stacks of the Stack column (showStack).
export function machineTable(ctx, machines, { onChange, jobsEl, showStack = false, stackTitles = {}, caps = {} } = {}) {
  const me = ctx.session.username;
  return table([
    { title: 'Machine', render: (m) => h('a', { href: `#/machines/${encodeURIComponent(m.id)}`, class: 'machine-label' }, m.label) },
    showStack ? { title: 'Stack', class: 'stack', render: (m) => stackLink(m.stackId, stackTitles[m.stackId]) } : null,
    { title: 'Owner', render: (m) => (m.owner === me ? 'you' : [m.owner, ' ', badge(`shared: ${myGrant(ctx, m)}`, 'shared')]) },
    { title: 'State', class: 'state', render: (m) => badge(m.state) },
    { title: 'Agent', class: 'agent-cell', render: agentCell },
    { title: 'IP', render: (m) => m.ipAddress || '—' },
    { title: 'Reason', class: 'reason', render: (m) => reasonCell(m.reason) },
    { title: 'Idle', class: 'idle-cell', render: idleCell }, // idle.js
    {
      title: '', class: 'actions', render: (m) => {
        const g = myGrant(ctx, m);
        const mayPower = g === 'owner' || g === 'full' || g === 'admin';
        return [
          running(m) && g !== '' && g !== 'readonly' ? h('button', {
            class: 'small primary term-open', onclick: () => ctx.openTerminal({ machineId: m.id, label: m.label }),
          }, 'Terminal') : null,
          // A read-only share watches a running session: they are listed on the machine's page.
          running(m) && g === 'readonly' ? h('a', { class: 'button small', href: `#/machines/${encodeURIComponent(m.id)}` }, 'Watch…') : null,
          mayPower && canStart(m) ? powerButton(ctx, m, 'start', caps, { class: 'small' }, jobsEl, onChange) : null,
          mayPower && canStop(m) ? powerButton(ctx, m, 'stop', caps, { class: 'small' }, jobsEl, onChange) : null,
        ];
      },
    },
  ].filter(Boolean), machines, { empty: 'No machines.', rowAttrs: (m) => ({ dataset: { machine: m.id, label: m.label, state: m.state, agent: (m.agent && m.agent.status) || 'never', updated: m.updatedAt || '' } }) });
}

export async function list(ctx, el) {
  const jobs = h('div', { class: 'jobs', id: 'machine-jobs' });
  const box = h('div', {});
  let lv = null;
  const reread = () => (lv ? lv.refresh().catch(() => {}) : null);
  let shown = null; // what the last read answered
  const render = () => {
    const { res, caps } = shown;
    clear(box, section(null, machineTable(ctx, res.machines, { onChange: reread, jobsEl: jobs, showStack: true, stackTitles: res.stackTitles || {}, caps })));
  };
  const refresh = async () => {
    const [res, caps] = await Promise.all([ctx.kite.call('machine.list'), providers(ctx.kite).catch(() => ({}))]);
    shown = { res, caps };
    render();
  };
  clear(el, h('div', { class: 'title-row' }, h('h1', {}, 'Machines'), h('a', { class: 'button', href: '#/stacks/new' }, 'New stack')), jobs, box);
  // Kept current by kloud's events (live.js): a machine's state, agent, shares or idle countdown
  // changing. A running countdown's text ("idle stop in 12m") is drawn again every 30 s from
  // what was read, without a request.
  lv = await live(ctx.kite, { topics: ['machines'], refresh });
  await lv.refresh();
  const counting = () => shown && shown.res.machines.some((m) => m.state === 'Running' && m.idle && m.idle.deadline);
  const tick = setInterval(() => { if (counting()) render(); }, 30000);
  return () => { lv.stop(); clearInterval(tick); };
}

function sharesSection(ctx, m, grant) {
  const box = h('div', { id: 'shares' });
  const load = async () => {
    let res;
    try {
      res = await ctx.kite.call('machine.shares', { machineId: m.id });
    } catch (e) {
      clear(box, h('p', { class: 'error-text' }, errorText(e)));
      return;
    }
    const shares = Array.isArray(res) ? res : (res.shares || []);
    const mayShare = grant === 'owner' || grant === 'admin';
    clear(box, table([
      { title: 'User', render: (s) => s.username },
      { title: 'Grant', render: (s) => badge(s.grant, 'shared') },
      {
        title: '', class: 'actions', render: (s) => mayShare ? h('button', {
          class: 'small danger', onclick: (ev) => busy(ev.target, async () => {
            await ctx.kite.call('machine.unshare', { machineId: m.id, username: s.username });
            notice(`${s.username} no longer has access; their terminals were closed.`);
            load();
          }),
        }, 'Unshare') : '',
      },
    ], shares, { empty: 'Not shared with anyone.' }));
    if (mayShare) {
      const user = h('input', { id: 'share-username', placeholder: 'username', 'aria-label': 'share with username', required: true });
      const g = h('select', { id: 'share-grant', 'aria-label': 'grant' },
        h('option', { value: 'readonly' }, 'readonly — watch terminals, cannot type'),
        h('option', { value: 'terminal' }, 'terminal — a shell as their own account (no sudo)'),
        h('option', { value: 'full' }, 'full — can do anything the owner can do on this machine'));
      const btn = h('button', { type: 'submit' }, 'Share');
      const form = h('form', { class: 'inline', id: 'share-form' }, user, g, btn);
      form.addEventListener('submit', (ev) => {
        ev.preventDefault();
        busy(btn, async () => {
          await ctx.kite.call('machine.share', { machineId: m.id, username: user.value.trim(), grant: g.value });
          notice(`Shared with ${user.value.trim()} (${g.value}).`);
          load();
        });
      });
      box.append(form);
    }
  };
  load();
  return section('Sharing', box);
}

function sessionsSection(ctx, m, grant) {
  const box = h('div', { id: 'term-sessions' });
  const load = async () => {
    const r = await sessionsOf(m.id);
    if (!r.ok) {
      clear(box, h('p', { class: 'muted' }, r.status === 404 ? 'This kloud has no terminal service for this machine.' : `Sessions: ${r.error}`));
      return;
    }
    const mine = grant === 'owner' || grant === 'admin';
    // Who may type into a session: the owner and full shares into any; a terminal share only
    // into sessions that run as its own account (klient names that account after the user).
    const mayJoin = (s) => mine || grant === 'full' || (grant === 'terminal' && s.runAs === ctx.session.username);
    clear(box, table([
      { title: 'Session', render: (s) => [h('code', {}, sessionID(s)), sessionLabel(s) !== sessionID(s) ? ` ${sessionLabel(s)}` : ''] },
      { title: 'Started by', render: (s) => s.createdBy || '—' },
      { title: 'Runs as', render: (s) => s.runAs || '—' },
      { title: 'Size', render: (s) => (s.cols && s.rows ? `${s.cols}×${s.rows}` : '—') },
      {
        title: 'Viewers', render: (s) => (Array.isArray(s.viewers)
          ? (s.viewers.length ? s.viewers.map((v) => `${v.user} (${v.mode})`).join(', ') : 'none')
          : '—'),
      },
      { title: 'Started', render: (s) => fmtTime(s.createdAt || s.startedAt) },
      {
        title: '', class: 'actions', render: (s) => [
          mayJoin(s) ? h('button', { class: 'small', onclick: () => ctx.openTerminal({ machineId: m.id, label: m.label, session: sessionID(s), mode: mine ? 'attach' : 'shared' }) }, mine ? 'Attach' : 'Join') : null,
          h('button', { class: 'small', onclick: () => ctx.openTerminal({ machineId: m.id, label: `${m.label} (watch)`, session: sessionID(s), mode: 'readonly' }) }, 'Watch'),
          mine ? h('button', {
            class: 'small danger', onclick: (ev) => busy(ev.target, async () => {
              if (!confirm(`End session ${sessionID(s)}? Its shell and programs are killed.`)) return;
              await killSession(m.id, sessionID(s));
              load();
            }),
          }, 'End') : null,
        ],
      },
    ], r.sessions, { empty: 'No terminal session is running.' }));
  };
  load();
  return section('Terminal sessions', box, h('button', { class: 'small', onclick: load }, 'Refresh'));
}

// attributesSection shows the provider's attributes of a machine ([name, value], none empty);
// many of them (a docker container has dozens, mostly defaults) are folded.
function attributesSection(attrs) {
  const list = h('dl', { class: 'kv' }, attrs.map(([k, v]) => [h('dt', {}, k), h('dd', { dataset: { attr: k } }, attrValue(v))]));
  if (attrs.length <= 12) return section('Attributes', list);
  return section('Attributes', h('details', { class: 'attrs' }, h('summary', {}, `all ${attrs.length} attributes the provider reports`), list));
}

export async function detail(ctx, el) {
  const { kite } = ctx;
  const id = ctx.params.id;
  const jobs = h('div', { class: 'jobs' });
  const box = h('div', {});
  const extra = h('div', {});
  let first = true;
  const refresh = async () => {
    const [m, caps] = await Promise.all([kite.call('machine.info', { machineId: id }), providers(kite).catch(() => ({}))]);
    const grant = myGrant(ctx, m);
    const mayPower = grant === 'owner' || grant === 'full' || grant === 'admin';
    const attrs = Object.entries(m.attributes || {}).filter(([, v]) => !isEmpty(v)).sort(([a], [b]) => a.localeCompare(b));
    clear(box,
      h('div', { class: 'title-row' }, h('h1', {}, `Machine ${m.label}`), badge(m.state), h('span', { class: 'spacer' }),
        running(m) && grant !== 'readonly' ? h('button', { class: 'primary', id: 'machine-terminal', onclick: () => ctx.openTerminal({ machineId: m.id, label: m.label }) }, 'New terminal') : null,
        mayPower && canStart(m) ? powerButton(ctx, m, 'start', caps, {}, jobs, refresh) : null,
        mayPower && canStop(m) ? powerButton(ctx, m, 'stop', caps, {}, jobs, refresh) : null),
      section(null, h('dl', { class: 'kv' },
        h('dt', {}, 'ID'), h('dd', {}, h('code', {}, m.id)),
        h('dt', {}, 'Stack'), h('dd', { id: 'machine-stack' }, stackLink(m.stackId, m.stackTitle)),
        h('dt', {}, 'Owner'), h('dd', {}, m.owner, grant !== 'owner' ? [' ', badge(`you: ${grant || 'none'}`, 'shared')] : ''),
        h('dt', {}, 'Provider'), h('dd', {}, m.provider),
        h('dt', {}, 'State'), h('dd', {}, badge(m.state), m.infraState && m.infraState !== m.state ? ` (provider says ${m.infraState})` : '', m.infoError ? h('span', { class: 'error-text' }, ` provider: ${m.infoError}`) : ''),
        h('dt', {}, 'Agent'), h('dd', {}, agentCell(m), m.agent && m.agent.version ? h('small', { class: 'muted' }, ` klient ${m.agent.version}`) : ''),
        h('dt', {}, 'Kite'), h('dd', {}, h('code', {}, m.kiteId || '—')),
        h('dt', {}, 'IP address'), h('dd', {}, m.ipAddress || '—'),
        // OpenSSH, scp, rsync, VS Code and JetBrains through kloud (kloud config-ssh writes the host).
        m.sshHostKey && ['owner', 'full', 'terminal'].includes(grant) ? [h('dt', {}, 'SSH'), h('dd', { id: 'machine-ssh' },
          h('code', {}, 'kloud config-ssh'), ' once, then ', h('code', {}, `ssh kloud--${m.label}`),
          ' (the host name config-ssh prints; also scp, rsync, git, VS Code Remote-SSH, JetBrains Gateway)')] : null,
        m.reason ? [h('dt', {}, 'Reason'), h('dd', { class: 'reason' }, errorDetail(m.reason))] : null,
        h('dt', {}, 'Idle stop'), h('dd', { id: 'machine-idle' }, idleText(m)), // idle.js
        h('dt', {}, 'Updated'), h('dd', {}, fmtTime(m.updatedAt)))),
      attrs.length ? attributesSection(attrs) : null,
      ctx.features.has('machine.set') ? idleSection(ctx, m, grant, refresh) : null); // idle.js
    if (first) {
      first = false;
      clear(extra,
        running(m) ? sessionsSection(ctx, m, grant) : null,
        ctx.features.has('machine.share') ? sharesSection(ctx, m, grant) : null,
        ctx.features.has('machine.snapshot') && grant ? snapshotsSection(ctx, m, grant, refresh) : null, // snapshots.js
        portsSection(ctx, m, grant, caps)); // ports.js
    }
  };
  clear(el, jobs, box, extra);
  await ctx.loadFeatures().catch(() => {});
  // Kept current by kloud's events of this machine (live.js): its state, agent, shares.
  const lv = await live(kite, { topics: ['machines'], refresh, onEvent: (ev) => ev.id === id });
  await lv.refresh();
  return () => lv.stop();
}
