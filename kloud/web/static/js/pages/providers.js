// providers.js — every provider this kloud offers (provider.list): built in or plugin, its
// version, where it runs, whether it is connected, what it can do and its last error. Kept
// current by kloud's events (topic providers) while shown.

import { h, clear, table, badge, fmtTime, shortError, errorDetail } from '../ui.js';
import { providers } from '../providers.js';
import { constraintsSummary } from '../constraints.js';
import { live } from '../live.js';

// lastError is a provider's last error as a short line (a builtin's "unavailable on this
// host: " prefix is what its badge says already), the whole text folded under it.
function lastError(p) {
  if (!p.lastError) return '—';
  const short = shortError(p.lastError).replace(/^unavailable on this host: /, '');
  return errorDetail(p.lastError, { short });
}

export async function list(ctx, el) {
  const { kite } = ctx;
  let described = {}; // provider.describe by name: the constraints vocabularies
  // draw renders the page again; the error details a user opened stay open.
  const draw = (res) => {
    const open = new Set([...el.querySelectorAll('tr[data-provider] details[open]')].map((d) => d.closest('tr').dataset.provider));
    render(res);
    for (const d of el.querySelectorAll('tr[data-provider] details')) d.open = open.has(d.closest('tr').dataset.provider);
  };
  const render = (res) => clear(el,
    h('h1', {}, 'Providers'),
    table([
      { title: 'Name', render: (p) => h('strong', {}, p.name) },
      { title: 'Kind', render: (p) => badge(p.kind, p.kind === 'plugin' ? 'shared' : 'member') },
      { title: 'Version', render: (p) => p.version || '—' },
      { title: 'Where', render: (p) => p.where },
      {
        title: 'Connected', class: 'status', render: (p) => h('span', { title: p.connected ? `since ${fmtTime(p.connectedAt)}` : (p.disconnectedAt ? `since ${fmtTime(p.disconnectedAt)}` : '') },
          p.connected ? badge('connected', 'agent-connected')
            : badge(p.kind === 'builtin' ? 'unavailable' : 'not connected', 'agent-disconnected')),
      },
      { title: 'Capabilities', render: (p) => (p.capabilities || []).join(', ') || '—' },
      { title: 'Constraints', render: (p) => h('span', { class: 'muted', dataset: { constraints: p.name } }, constraintsSummary(described[p.name] && described[p.name].constraints)) },
      { title: 'Last error', class: 'last-error', render: (p) => lastError(p) },
    ], res.providers, { empty: 'This kloud offers no providers.', rowAttrs: (p) => ({ dataset: { provider: p.name } }) }),
    h('p', { class: 'muted' }, 'Install a provider plugin with ', h('code', {}, 'kloud provider install PATH'), ' on the kloud host.'));
  const refresh = async () => {
    try { described = await providers(kite); } catch { /* the table shows the rest */ }
    draw(await kite.call('provider.list'));
  };
  // Kept current by kloud's events (live.js): kloud looks at the providers' status and says
  // when what provider.list shows changed.
  const lv = await live(kite, { topics: ['providers'], refresh });
  await lv.refresh();
  return () => lv.stop();
}
