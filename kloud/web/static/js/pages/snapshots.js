// snapshots.js — the Snapshots section of a machine's page (machine.snapshot, machine.snapshots,
// machine.restore, snapshot.delete): take a snapshot of this machine (a running machine is
// stopped, saved and started again), list its snapshots with status, size and time, restore one
// (or another of yours of the same provider) into this machine, delete them; the caller's quota.
// Shown only when this kloud serves machine.snapshot (kite.methods); the buttons are disabled,
// saying why, when the machine's provider lacks the snapshot capability (provider.describe).

import { h, clear, table, badge, busy, section, notice, fmtTime, errorText } from '../ui.js';
import { watchJob } from '../jobs.js';
import { providers, can } from '../providers.js';

export function fmtSize(n) {
  if (!n) return '0 B';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${u[i]}`;
}

// snapshotsSection renders the section for machine m; grant is the caller's (myGrant), onDone
// what to refresh when a job ends. Its jobs show in the section, under the button that started
// them (the page's job list is above, out of sight of this section).
export function snapshotsSection(ctx, m, grant, onDone) {
  const box = h('div', { id: 'snapshots' });
  const jobsEl = h('div', { class: 'jobs', id: 'snapshot-jobs' });
  const mayManage = grant === 'owner' || grant === 'full' || grant === 'admin';
  const done = () => { load(); if (onDone) onDone(); };
  const restore = async (s, into) => {
    const where = into.id === s.machineId ? into.label : `${into.label} (taken of ${s.machineLabel})`;
    if (!confirm(`Restore "${s.name}" into ${where}? Its disk is replaced by the snapshot's; a running machine is stopped and started again.`)) return;
    const r = await ctx.kite.call('machine.restore', { snapshotId: s.id, machineId: into.id });
    watchJob(ctx.kite, r.jobId, jobsEl, { title: `Restoring ${where} from "${s.name}"`, onDone: done });
  };
  const load = async () => {
    let res, caps;
    try {
      [res, caps] = await Promise.all([ctx.kite.call('machine.snapshots', {}), providers(ctx.kite).catch(() => ({}))]);
    } catch (e) {
      clear(box, h('p', { class: 'error-text' }, errorText(e)));
      return;
    }
    const capable = can(caps, m.provider, 'snapshot');
    const why = capable ? '' : `provider ${m.provider} does not support snapshots`;
    const all = res.snapshots || [];
    const mine = all.filter((s) => s.machineId === m.id);
    const others = all.filter((s) => s.machineId !== m.id && s.provider === m.provider && s.status === 'ready');
    const q = res.quota || {};
    const used = res.used || {};
    const quota = h('p', { class: 'muted', id: 'snapshot-quota' },
      `Your snapshots: ${used.count || 0} of ${q.count ? q.count : 'unlimited'}, ${fmtSize(used.bytes || 0)} of ${q.bytes ? fmtSize(q.bytes) : 'unlimited'}.`);
    const rows = table([
      { title: 'Name', render: (s) => s.name },
      { title: 'Status', render: (s) => [badge(s.status), s.error ? h('small', { class: 'error-text' }, ` ${s.error}`) : ''] },
      { title: 'Size', render: (s) => (s.status === 'ready' ? fmtSize(s.size) : '—') },
      { title: 'Taken', render: (s) => fmtTime(s.createdAt) },
      {
        title: '', class: 'actions', render: (s) => [
          mayManage && s.status === 'ready' ? h('button', {
            class: 'small', dataset: { restore: s.id }, disabled: !capable, title: why,
            onclick: (ev) => busy(ev.target, () => restore(s, m)),
          }, 'Restore') : null,
          s.status !== 'creating' ? h('button', {
            class: 'small danger', dataset: { deleteSnapshot: s.id },
            onclick: (ev) => busy(ev.target, async () => {
              if (!confirm(`Delete snapshot "${s.name}"? Its data is gone for good.`)) return;
              await ctx.kite.call('snapshot.delete', { snapshotId: s.id });
              notice(`Snapshot "${s.name}" deleted.`);
              load();
            }),
          }, 'Delete') : null,
        ],
      },
    ], mine, { empty: 'No snapshot of this machine.', rowAttrs: (s) => ({ dataset: { snapshot: s.id, status: s.status } }) });
    const parts = [quota, rows];
    if (mayManage) {
      // Wide enough for its placeholder (kloud names a snapshot without one "LABEL DATE TIME").
      const hint = `name (default: ${m.label} + time)`;
      const name = h('input', { id: 'snapshot-name', 'aria-label': 'snapshot name', placeholder: hint, title: hint, size: Math.max(20, hint.length + 4), maxlength: 100 });
      const btn = h('button', { type: 'submit', id: 'snapshot-take', disabled: !capable, title: why || (m.state === 'Running' ? 'the machine is stopped while its disk is saved, then started again' : '') }, 'Take snapshot');
      const form = h('form', { class: 'inline', id: 'snapshot-form' }, name, btn);
      form.addEventListener('submit', (ev) => {
        ev.preventDefault();
        busy(btn, async () => {
          const r = await ctx.kite.call('machine.snapshot', { machineId: m.id, name: name.value.trim() });
          name.value = '';
          watchJob(ctx.kite, r.jobId, jobsEl, { title: `Snapshot of ${m.label}`, onDone: done });
          load();
        });
      });
      parts.push(form);
      if (others.length) {
        const pick = h('select', { id: 'snapshot-other', 'aria-label': 'another of your snapshots' }, others.map((s) => h('option', { value: s.id }, `${s.name} (of ${s.machineLabel}, ${fmtSize(s.size)}, ${fmtTime(s.createdAt)})`)));
        const rb = h('button', { type: 'button', class: 'small', disabled: !capable, title: why }, 'Restore into this machine');
        rb.addEventListener('click', () => busy(rb, () => restore(others.find((s) => s.id === pick.value), m)));
        parts.push(h('div', { class: 'inline' }, h('span', {}, 'Another of your snapshots: '), pick, rb));
      }
    }
    clear(box, ...parts);
  };
  load();
  return section('Snapshots', box, jobsEl, h('button', { class: 'small', onclick: load }, 'Refresh'));
}
