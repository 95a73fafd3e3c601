// audit.js — the audit log for kloud administrators (audit.list, audit.verify): who changed
// what, logins, terminals and port forwards, newest first, with filters; and a check of the
// log's hash chain.

import { h, clear, table, badge, busy, fmtTime, section } from '../ui.js';

const ErrPermission = -32002;

const periods = [['1h', 'last hour', 3600e3], ['24h', 'last 24 hours', 86400e3], ['7d', 'last 7 days', 7 * 86400e3], ['30d', 'last 30 days', 30 * 86400e3], ['', 'all kept', 0]];

function detail(e) {
  if (!e.durationMs && !e.bytes) return '';
  return `${(e.durationMs / 1000).toFixed(1)} s, ${e.bytes || 0} bytes`;
}

export async function list(ctx, el) {
  const { kite } = ctx;
  const user = h('input', { name: 'user', placeholder: 'user', 'aria-label': 'user' });
  const action = h('input', { name: 'action', placeholder: 'action (stack.apply, web.login, …)', 'aria-label': 'action' });
  const target = h('input', { name: 'target', placeholder: 'target id', 'aria-label': 'target id' });
  const since = h('select', { name: 'since', 'aria-label': 'period' }, periods.map(([v, label]) => h('option', { value: v, selected: v === '24h' }, label)));
  const show = h('button', { type: 'submit' }, 'Show');
  const form = h('form', { class: 'inline', id: 'audit-filter' }, user, action, target, since, show);
  const verifyBtn = h('button', { id: 'audit-verify', type: 'button' }, 'Verify chain');
  const verdict = h('p', { id: 'audit-verdict', class: 'muted' });
  const rows = h('div', { id: 'audit-entries' });

  const load = async () => {
    const p = { limit: 500 };
    if (user.value.trim()) p.user = user.value.trim();
    if (action.value.trim()) p.action = action.value.trim();
    if (target.value.trim()) p.target = target.value.trim();
    const period = periods.find(([v]) => v === since.value);
    if (period && period[2]) p.since = new Date(Date.now() - period[2]).toISOString();
    const res = await kite.call('audit.list', p);
    clear(rows, table([
      { title: 'Seq', render: (e) => String(e.seq) },
      { title: 'Time', render: (e) => fmtTime(e.time) },
      { title: 'User', render: (e) => e.user || '—' },
      { title: 'From', render: (e) => e.remote || '—' },
      { title: 'Action', render: (e) => h('code', {}, e.action) },
      { title: 'Target', render: (e) => e.target || '—' },
      { title: 'Result', class: 'status', render: (e) => e.result === 'ok' ? badge('ok', 'ok') : badge(`error ${e.code || ''}`.trim(), 'failed') },
      { title: 'Detail', render: (e) => detail(e) },
    ], res.entries, { empty: 'No entries match.', rowAttrs: (e) => ({ dataset: { seq: String(e.seq), action: e.action } }) }));
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(show, load);
  });
  verifyBtn.addEventListener('click', () => busy(verifyBtn, async () => {
    const v = await kite.call('audit.verify');
    verdict.className = v.ok ? 'ok' : 'error';
    verdict.textContent = v.ok
      ? `Chain ok: ${v.checked} entries verified${v.from ? ` from entry ${v.from + 1} (older ones pruned by retention)` : ''}; head ${v.head} ${v.headHash || ''}`
      : `Chain broken at entry ${v.badSeq}: ${v.problem}`;
  }));

  clear(el,
    h('h1', {}, 'Audit log'),
    section(null,
      h('p', { class: 'muted' }, 'Every change, login, terminal and port forward, newest first. Entries are hash-chained in the store: verifying finds an entry that was edited, removed or reordered.'),
      form, h('div', {}, verifyBtn), verdict),
    rows);
  try {
    await load();
  } catch (e) {
    if (e.code !== ErrPermission) throw e;
    clear(el, h('h1', {}, 'Audit log'), section(null, h('p', {}, 'The audit log is for kloud owners and auditors.')));
  }
}
