// quota.js — quotas (kloud/quota.go): your own quota and your teams' with what their stacks hold
// (quota.show), and, for kloud administrators, any user's or team's quota shown and set
// (quota.set: the whole quota; an empty field is no limit).

import { h, clear, table, busy, field, section, notice } from '../ui.js';

const rows = [
  ['machines', 'Machines', ''],
  ['cores', 'Cores', ''],
  ['memoryMB', 'Memory', ' MB'],
  ['diskMB', 'Disk', ' MB'],
  ['buckets', 'Buckets', ''],
  ['bucketMB', 'Bucket size', ' MB'],
];

// quotaTable shows a quota.show answer: one row per resource with its limit, use and what is left.
export function quotaTable(st) {
  const lim = st.limit || {}, used = st.used || {}, left = st.left || {};
  const none = (k) => !lim[k];
  return table([
    { title: 'Resource', render: (r) => r[1] },
    { title: 'Limit', render: (r) => (none(r[0]) ? 'no limit' : `${lim[r[0]]}${r[2]}`) },
    { title: 'In use', render: (r) => `${used[r[0]] || 0}${r[2]}` },
    { title: 'Left', render: (r) => (none(r[0]) ? '—' : `${left[r[0]] || 0}${r[2]}`) },
  ], rows, { rowAttrs: (r) => ({ dataset: { resource: r[0] } }) });
}

// subjectName is "user alice" or "team dev" of a quota subject ("user/alice").
function subjectName(subject) {
  const [kind, name] = String(subject || '').split('/');
  return `${kind} ${name}`;
}

export async function list(ctx, el) {
  const { kite } = ctx;
  const me = ctx.me || {};
  const mine = await kite.call('quota.show', {});
  const teams = [];
  for (const t of me.teams || []) {
    teams.push(await kite.call('quota.show', { team: t.slug }));
  }
  const cards = [section('Your quota', h('div', { id: 'quota-mine', dataset: { subject: mine.subject } }, quotaTable(mine)))];
  for (const st of teams) {
    cards.push(section(`Team ${st.subject.split('/')[1]}`, h('div', { class: 'quota-team', dataset: { subject: st.subject } }, quotaTable(st))));
  }
  cards.push(h('p', { class: 'muted' }, 'The use is what your built stacks hold (or your team\'s); a build, update or scale beyond a limit is refused before it starts.'));
  if (me.admin) cards.push(adminCard(kite));
  clear(el, h('h1', {}, 'Quotas'), ...cards);
}

// adminCard shows and sets any user's or team's quota.
function adminCard(kite) {
  const kind = h('select', { id: 'quota-kind' }, h('option', { value: 'user' }, 'user'), h('option', { value: 'team' }, 'team'));
  const name = h('input', { id: 'quota-name', required: true, placeholder: 'username or team slug' });
  const num = (id, step) => h('input', { id, type: 'number', min: 0, step, placeholder: 'no limit' });
  const machines = num('quota-machines', 1), cores = num('quota-cores', 'any'), memory = num('quota-memory', 1), disk = num('quota-disk', 1);
  const buckets = num('quota-buckets', 1), bucketMB = num('quota-bucket-mb', 1);
  const show = h('button', { type: 'button', id: 'quota-show' }, 'Show');
  const set = h('button', { type: 'submit', class: 'primary', id: 'quota-set' }, 'Set quota');
  const out = h('div', { id: 'quota-result' });
  const subject = () => ({ [kind.value]: name.value.trim() });
  const render = (st) => {
    const l = st.limit || {};
    machines.value = l.machines || '';
    cores.value = l.cores || '';
    memory.value = l.memoryMB || '';
    disk.value = l.diskMB || '';
    buckets.value = l.buckets || '';
    bucketMB.value = l.bucketMB || '';
    clear(out, h('h3', {}, `Quota of ${subjectName(st.subject)}`), h('div', { dataset: { subject: st.subject } }, quotaTable(st)));
  };
  show.addEventListener('click', () => busy(show, async () => render(await kite.call('quota.show', subject()))));
  const form = h('form', { class: 'quota-form', id: 'quota-form' },
    field('Of', h('span', { class: 'inline' }, kind, name)),
    field('Machines', machines), field('Cores', cores), field('Memory (MB)', memory), field('Disk (MB)', disk),
    field('Buckets', buckets), field('Bucket size (MB, all buckets)', bucketMB),
    h('div', { class: 'buttons' }, show, set));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(set, async () => {
      const limit = {
        machines: Number(machines.value) || 0, cores: Number(cores.value) || 0,
        memoryMB: Number(memory.value) || 0, diskMB: Number(disk.value) || 0,
        buckets: Number(buckets.value) || 0, bucketMB: Number(bucketMB.value) || 0,
      };
      const st = await kite.call('quota.set', { ...subject(), limit });
      render(st);
      notice(`Quota of ${subjectName(st.subject)} set.`);
    });
  });
  return section('Set a quota (kloud administrators)', form,
    h('p', { class: 'muted' }, 'Every limit is set at once; an empty field is no limit, all empty removes the quota.'), out);
}
