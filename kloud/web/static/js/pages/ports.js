// ports.js — a machine's ports on its page: open a port's web app in the browser (through kloud,
// on the app's own origin: GET /api/machines/ID/ports/PORT/open; the owner and terminal or full
// shares), and its firewall (machine.ports.list/open/close) when the machine's provider has the
// "firewall" capability: who may connect from other machines.

import { h, clear, table, busy, section, notice, errorText } from '../ui.js';
import { can } from '../providers.js';

export function portsSection(ctx, m, grant, caps) {
  const parts = [];
  if (m.state === 'Running' && ['owner', 'terminal', 'full'].includes(grant)) {
    const port = h('input', { id: 'app-port', 'aria-label': 'port of the web app', type: 'number', min: 1, max: 65535, placeholder: '8000', required: true });
    const form = h('form', { class: 'inline', id: 'app-form' }, port, h('button', { type: 'submit' }, 'Open in browser'));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      window.open(`/api/machines/${encodeURIComponent(m.id)}/ports/${Number(port.value)}/open`, '_blank', 'noopener');
    });
    parts.push(h('p', { class: 'muted' }, 'A web server listening in the machine opens on its own origin, through kloud (nothing of the machine is exposed).'), form);
  }
  if (can(caps, m.provider, 'firewall') && ctx.features.has('machine.ports.list')) {
    const box = h('div', { id: 'firewall' });
    const mayChange = ['owner', 'full', 'admin'].includes(grant);
    const load = async () => {
      let res;
      try {
        res = await ctx.kite.call('machine.ports.list', { machineId: m.id });
      } catch (e) {
        clear(box, h('p', { class: 'error-text' }, errorText(e)));
        return;
      }
      clear(box, table([
        { title: 'Port', render: (r) => String(r.port) },
        { title: 'Protocol', render: (r) => r.protocol },
        { title: 'From', render: (r) => r.from },
        {
          title: '', class: 'actions', render: (r) => mayChange ? h('button', {
            class: 'small danger', onclick: (ev) => busy(ev.target, async () => {
              await ctx.kite.call('machine.ports.close', { machineId: m.id, rules: [r] });
              load();
            }),
          }, 'Close') : '',
        },
      ], res.rules || [], { empty: 'No rules: kloud and the owner\'s machines only.' }));
      if (mayChange) {
        const port = h('input', { id: 'fw-port', 'aria-label': 'port to open', type: 'number', min: 1, max: 65535, placeholder: 'port', required: true });
        const proto = h('select', { id: 'fw-proto', 'aria-label': 'protocol' }, h('option', { value: 'tcp' }, 'tcp'), h('option', { value: 'udp' }, 'udp'));
        const from = h('input', { id: 'fw-from', 'aria-label': 'open to', placeholder: 'any, team or a CIDR', value: 'any' });
        const btn = h('button', { type: 'submit' }, 'Open port');
        const form = h('form', { class: 'inline', id: 'fw-form' }, port, proto, from, btn);
        form.addEventListener('submit', (ev) => {
          ev.preventDefault();
          busy(btn, async () => {
            await ctx.kite.call('machine.ports.open', { machineId: m.id, rules: [{ port: Number(port.value), protocol: proto.value, from: from.value.trim() }] });
            notice(`Port ${port.value}/${proto.value} open to ${from.value.trim()}.`);
            load();
          });
        });
        box.append(form);
      }
    };
    load();
    parts.push(h('h3', {}, 'Firewall'), box);
  }
  return parts.length ? section('Ports', ...parts) : null;
}
