// providers.js — every provider this kloud offers (provider.list): built in or plugin, its
// version, where it runs, whether it is connected, what it can do and its last error. Refreshed
// every 5 s while shown.

import { h, clear, table, badge, fmtTime } from '../ui.js';
import { providers } from '../providers.js';
import { constraintsSummary } from '../constraints.js';

export async function list(ctx, el) {
  const { kite } = ctx;
  let described = {}; // provider.describe by name: the constraints vocabularies
  const draw = (res) => clear(el,
    h('h1', {}, 'Providers'),
    table([
      { title: 'Name', render: (p) => h('strong', {}, p.name) },
      { title: 'Kind', render: (p) => badge(p.kind, p.kind === 'plugin' ? 'shared' : 'member') },
      { title: 'Version', render: (p) => p.version || '—' },
      { title: 'Where', render: (p) => p.where },
      {
        title: 'Connected', render: (p) => h('span', { title: p.connected ? `since ${fmtTime(p.connectedAt)}` : (p.disconnectedAt ? `since ${fmtTime(p.disconnectedAt)}` : '') },
          badge(p.connected ? 'connected' : 'not connected', p.connected ? 'agent-connected' : 'agent-disconnected')),
      },
      { title: 'Capabilities', render: (p) => (p.capabilities || []).join(', ') || '—' },
      { title: 'Constraints', render: (p) => h('span', { class: 'muted', dataset: { constraints: p.name } }, constraintsSummary(described[p.name] && described[p.name].constraints)) },
      { title: 'Last error', render: (p) => p.lastError ? h('span', { class: 'error-text' }, p.lastError) : '—' },
    ], res.providers, { empty: 'This kloud offers no providers.', rowAttrs: (p) => ({ dataset: { provider: p.name } }) }),
    h('p', { class: 'muted' }, 'Install a provider plugin with ', h('code', {}, 'kloud provider install PATH'), ' on the kloud host.'));
  try { described = await providers(kite); } catch { /* the table shows the rest */ }
  draw(await kite.call('provider.list'));
  const timer = setInterval(async () => {
    try { described = await providers(kite); draw(await kite.call('provider.list')); } catch { /* the connection indicator says why */ }
  }, 5000);
  return () => clearInterval(timer);
}
