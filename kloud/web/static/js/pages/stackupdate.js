// stackupdate.js — a stack's update and scale (issue 13 §1): the "Update available (rev N → M)"
// button, which shows stack.plan's per-machine diff before anything changes and runs
// stack.update once confirmed; and scaling a counted machine resource (stack.scale).

import { h, clear, table, badge, busy, field, section, errorText, attrInline, isEmpty } from '../ui.js';
import { planJob } from './templates.js';

const updatable = (st) => st.state === 'Initialized' || st.state === 'Failed';

// value shows a changed value: a text quoted (so an empty one shows), a map or list as values
// (attrInline), not JSON.
const value = (v) => (v !== null && typeof v === 'object' ? attrInline(v) : JSON.stringify(v ?? null));

function changeText(m) {
  if (m.action === 'add') {
    return Object.entries(m.attributes || {}).filter(([, v]) => !isEmpty(v) && v !== false && typeof v !== 'object')
      .map(([k, v]) => `${k}=${v}`).join(' ');
  }
  return (m.changes || []).map((c) => {
    if (c.hidden) return `${c.name} (hidden)`;
    const b = value(c.before);
    return c.unknown ? `${c.name}: ${b} → (known after apply)` : `${c.name}: ${b} → ${value(c.after)}`;
  }).join('; ');
}

// diffTable renders an update plan's machines.
export function diffTable(update) {
  return table([
    { title: 'Machine', render: (m) => m.label },
    { title: 'Action', render: (m) => badge(m.action, `update-${m.action}`) },
    { title: 'Changes', class: 'reason', render: (m) => changeText(m) },
  ], update.machines, { empty: 'No machines.', rowAttrs: (m) => ({ dataset: { machine: m.label, action: m.action } }) });
}

// showPlan plans the update of st to rev (0: the latest) into box, with buttons to apply it or
// to close the plan; onJob(jobId, title) follows the job started.
async function showPlan(ctx, st, rev, box, onJob) {
  clear(box, section('Update plan', h('p', { class: 'loading' }, 'terraform plan…')));
  let r;
  try {
    r = await planJob(ctx.kite, { stackId: st.id, rev: rev || undefined }, box); // templates.js: a stack.plan job
  } catch (e) {
    clear(box, section('Update plan failed', h('pre', { class: 'error-text' }, errorText(e)),
      h('div', { class: 'buttons' }, h('button', { onclick: () => clear(box) }, 'Close'))));
    return;
  }
  if (!r) { // the job's view, left in box, says why
    box.append(h('div', { class: 'buttons' }, h('button', { onclick: () => clear(box) }, 'Close')));
    return;
  }
  const u = r.update;
  const sum = ['add', 'change', 'replace', 'remove', 'keep'].filter((a) => u.summary[a]).map((a) => `${u.summary[a]} ${a}`).join(', ');
  const apply = h('button', {
    class: 'primary', id: 'stack-update-apply',
    onclick: (ev) => busy(ev.target, async () => {
      const j = await ctx.kite.call('stack.update', { stackId: st.id, templateRevision: r.rev }, { timeout: 10 * 60 * 1000 }); // it plans first
      clear(box);
      onJob(j.jobId, `Updating to revision ${r.rev}`);
    }),
  }, `Update to revision ${r.rev}`);
  clear(box, section(`Update plan: revision ${u.fromRev}${u.diverged ? ' (scaled)' : ''} → ${u.toRev}`,
    h('p', { id: 'stack-update-summary' }, sum),
    h('p', { class: 'hint' }, 'Machines kept or changed in place keep their disks, agents and terminal sessions; replaced machines are created again (their disks are lost).'),
    diffTable(u),
    h('div', { class: 'buttons' }, apply, h('button', { onclick: () => clear(box) }, 'Cancel'))));
}

// updateButton is the stack page's "Update available (rev N → M)" button (null when there is no
// newer revision or the stack cannot be updated now).
export function updateButton(ctx, st, box, onJob) {
  if (!st.updateAvailable || !updatable(st)) return null;
  return h('button', {
    class: 'primary', id: 'stack-update',
    onclick: (ev) => busy(ev.target, () => showPlan(ctx, st, 0, box, onJob)),
  }, `Update available (rev ${st.templateRev} → ${st.latestRev})`);
}

// scaleSection lets the owner set the count of a counted machine resource (stack.scale).
export function scaleSection(ctx, st, onJob) {
  const counts = {};
  for (const m of st.machineDocs || []) {
    if (m.index !== undefined && m.index !== null) counts[m.resource] = (counts[m.resource] || 0) + 1;
  }
  const names = Object.keys(counts).sort();
  if (!names.length || !updatable(st)) return null;
  const sel = h('select', { id: 'stack-scale-resource' }, names.map((n) => h('option', { value: n }, `${n} (${counts[n]} now)`)));
  const n = h('input', { id: 'stack-scale-count', type: 'number', min: 0, max: 100, value: counts[names[0]] });
  sel.addEventListener('change', () => { n.value = counts[sel.value]; });
  const btn = h('button', {
    id: 'stack-scale',
    onclick: (ev) => busy(ev.target, async () => {
      const count = Number(n.value);
      if (!confirm(`Set ${sel.value} to ${count} machine(s)? Machines above that count are destroyed with their disks.`)) return;
      const j = await ctx.kite.call('stack.scale', { stackId: st.id, resource: sel.value, count }, { timeout: 10 * 60 * 1000 }); // it plans first
      onJob(j.jobId, `Scaling ${sel.value} to ${count}`);
    }),
  }, 'Scale');
  return section('Scale',
    h('div', { class: 'stack-scale' }, field('Resource', sel), field('Machines', n), btn),
    st.diverged ? h('p', { class: 'hint' }, `This stack was scaled: its files differ from its template's revision ${st.templateRev}.`) : null);
}
