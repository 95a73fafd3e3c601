// templates.js — stack templates (Terraform HCL or JSON): the list, and an editor for a
// template's files (create / update with revisions) with a plan preview (stack.plan: the
// machines the template would make).

import { h, clear, table, busy, field, section, notice, fmtTime, errorText, attrInline, isEmpty } from '../ui.js';
import { watchJob } from '../jobs.js';

export async function list(ctx, el) {
  const res = await ctx.kite.call('template.list');
  clear(el,
    h('div', { class: 'title-row' }, h('h1', {}, 'Templates'), h('a', { class: 'button primary', href: '#/templates/new', id: 'template-new' }, 'New template')),
    section(null, table([
      { title: 'Title', render: (t) => h('a', { href: `#/templates/${encodeURIComponent(t.id)}` }, t.title) },
      { title: 'Team', render: (t) => t.team },
      { title: 'Owner', render: (t) => t.owner },
      { title: 'Revision', render: (t) => String(t.rev) },
      { title: 'Providers', render: (t) => (t.providers || []).join(', ') || '—' },
      {
        title: '', class: 'actions', render: (t) => [
          h('a', { class: 'button small', href: `#/stacks/new/${encodeURIComponent(t.id)}` }, 'Create stack'),
          h('button', {
            class: 'small danger', onclick: (ev) => busy(ev.target, async () => {
              if (!confirm(`Delete template ${t.title}? Stacks made from it keep their copy.`)) return;
              await ctx.kite.call('template.delete', { id: t.id });
              ctx.navigate('#/templates');
            }),
          }, 'Delete'),
        ],
      },
    ], res.templates, { empty: 'No templates yet.' })));
}

// planJob plans as a job (stack.planJob) shown in box with its progress and terraform's lines
// (jobs.js), and returns the plan (stack.plan's answer); null if the job failed or was cancelled
// (its view, left in box, says why).
export async function planJob(kite, params, box) {
  const { jobId } = await kite.call('stack.planJob', params);
  clear(box, section('Plan'));
  const view = watchJob(kite, jobId, box.firstChild || box, { title: 'terraform plan' });
  const ev = await view.done;
  return ev.status === 'succeeded' ? ev.result : null;
}

// planTable shows stack.plan's machines. The attributes the template sets (the plan's
// `configured`; for an older kloud, guessed from the template's files) come first and the rest
// (the provider's defaults: a docker container has many) are folded under "+N more".
export function planTable(machines, files = []) {
  const text = (files || []).map((f) => f.content || '').join('\n');
  const setHere = (k) => new RegExp(`(^|[\\s{,;])${k.replace(/[^\w]/g, '\\$&')}\\s*=`, 'm').test(text);
  const line = (a, keys) => keys.map((k) => `${k}=${attrInline(a[k])}`).join(' ');
  return table([
    { title: 'Machine', render: (m) => h('strong', {}, m.label) },
    { title: 'Provider', render: (m) => m.provider },
    { title: 'Resource', render: (m) => m.resource },
    {
      title: 'Attributes', class: 'plan-attrs', render: (m) => {
        const a = m.attributes || {};
        // What says something: not empty, not false (a provider's defaults are mostly those).
        const keys = Object.keys(a).filter((k) => !isEmpty(a[k]) && a[k] !== false && !/user_data|^input$|^output$/.test(k)).sort();
        if (!keys.length) return '—';
        const mine = m.configured ? keys.filter((k) => m.configured.includes(k)) : text ? keys.filter(setHere) : [];
        const rest = keys.filter((k) => !mine.includes(k));
        if (!mine.length || !rest.length) return h('code', { class: 'attrs' }, line(a, keys));
        return [h('code', { class: 'attrs' }, line(a, mine)),
          h('details', { class: 'plan-more' }, h('summary', {}, `+${rest.length} more`), h('code', { class: 'attrs' }, line(a, rest)))];
      },
    },
  ], machines, { empty: 'The template declares no machines.' });
}

function starter(providers) {
  const p = providers.find((x) => x.available) || providers[0];
  if (!p) return '';
  return `# A stack template is Terraform (HCL or JSON). Each resource of type
# ${p.resourceType} (provider ${p.name}) becomes a machine; use count for several.
resource "${p.resourceType}" "vm" {
}
`;
}

export async function editor(ctx, el) {
  const { kite } = ctx;
  const id = ctx.params.id;
  const [tpl, me, provs] = await Promise.all([
    id ? kite.call('template.get', { id }) : null,
    ctx.whoami(),
    kite.call('provider.describe'),
  ]);
  let files = tpl ? tpl.files.map((f) => ({ name: f.name, content: f.content })) : [{ name: 'main.tf', content: starter(provs.providers || []) }];
  let cur = 0;
  let dirty = false;

  const title = h('input', { id: 'template-title', required: true, value: tpl ? tpl.title : '', placeholder: 'e.g. dev box' });
  const desc = h('input', { id: 'template-description', value: tpl ? tpl.description || '' : '' });
  const teams = me.teams || [];
  const teamSel = h('select', { id: 'template-team' }, teams.map((t) => h('option', { value: t.slug }, t.slug)));
  const fileTabs = h('div', { class: 'file-tabs', role: 'group', 'aria-label': 'files' });
  const fileName = h('input', { id: 'template-filename', class: 'mono', placeholder: 'main.tf' });
  const text = h('textarea', { id: 'template-file', class: 'code', spellcheck: 'false', rows: 22, wrap: 'off', 'aria-label': 'file contents (Tab indents, Shift+Tab leaves)' });
  const planBox = h('div', { id: 'plan' });

  const renderTabs = () => {
    clear(fileTabs, files.map((f, i) => h('button', {
      type: 'button', class: `tab ${i === cur ? 'active' : ''}`, 'aria-current': i === cur ? 'true' : null, onclick: () => { cur = i; load(); },
    }, f.name || '(unnamed)')),
    h('button', { type: 'button', class: 'small', onclick: () => { files.push({ name: `file${files.length + 1}.tf`, content: '' }); cur = files.length - 1; dirty = true; load(); } }, '+ file'),
    files.length > 1 ? h('button', { type: 'button', class: 'small danger', onclick: () => { files.splice(cur, 1); cur = 0; dirty = true; load(); } }, 'Remove this file') : null);
  };
  const load = () => {
    fileName.value = files[cur].name;
    text.value = files[cur].content;
    renderTabs();
  };
  fileName.addEventListener('input', () => { files[cur].name = fileName.value.trim(); dirty = true; renderTabs(); });
  text.addEventListener('input', () => { files[cur].content = text.value; dirty = true; });
  text.addEventListener('keydown', (ev) => {
    if (ev.key === 'Tab' && !ev.shiftKey && !ev.ctrlKey && !ev.metaKey) { // indent instead of leaving the editor
      ev.preventDefault();
      text.setRangeText('  ', text.selectionStart, text.selectionEnd, 'end');
      files[cur].content = text.value;
      dirty = true;
    }
  });
  load();

  const save = h('button', { type: 'submit', class: 'primary', id: 'template-save' }, tpl ? 'Save new revision' : 'Create template');
  const plan = h('button', { type: 'button', id: 'template-plan', disabled: !tpl }, 'Plan');
  const mkStack = tpl ? h('a', { class: 'button', href: `#/stacks/new/${encodeURIComponent(tpl.id)}`, id: 'template-create-stack' }, 'Create stack from it') : null;
  const form = h('form', { class: 'stack-form wide', id: 'template-form' },
    field('Title', title), field('Description', desc),
    !tpl && teams.length > 1 ? field('Team', teamSel) : null,
    h('div', { class: 'file-editor' }, fileTabs, field('File name', fileName), text),
    h('div', { class: 'buttons' }, save, plan, mkStack));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(save, async () => {
      const fm = {};
      for (const f of files) {
        if (!f.name) throw new Error('every file needs a name');
        if (fm[f.name] !== undefined) throw new Error(`two files are named ${f.name}`);
        fm[f.name] = f.content;
      }
      if (tpl) {
        const t = await kite.call('template.update', { id: tpl.id, title: title.value.trim(), description: desc.value, files: fm });
        notice(`Saved revision ${t.rev}.`);
        dirty = false;
        ctx.navigate(`#/templates/${encodeURIComponent(t.id)}`);
      } else {
        const t = await kite.call('template.create', { title: title.value.trim(), description: desc.value || undefined, team: teams.length > 1 ? teamSel.value : undefined, files: fm });
        notice(`Template ${t.title} created.`);
        dirty = false;
        ctx.navigate(`#/templates/${encodeURIComponent(t.id)}`);
      }
    });
  });
  plan.addEventListener('click', () => busy(plan, async () => {
    if (dirty) notice('The plan is of the saved revision; save to plan your changes.', 'info');
    clear(planBox, section('Plan', h('p', { class: 'loading' }, 'terraform plan…')));
    try {
      // Any credential of the team will do to see the machines: the first of each provider.
      const credentials = {};
      for (const p of tpl.providers || []) {
        const cs = (await kite.call('credential.list', { provider: p, team: tpl.team })).credentials || [];
        if (cs.length > 1) credentials[p] = cs[0].id;
      }
      const r = await planJob(kite, { templateId: tpl.id, credentials }, planBox);
      if (r) clear(planBox, section(`Plan of revision ${r.rev}: ${r.machines.length} machine(s)`, planTable(r.machines, tpl.files)));
    } catch (e) {
      clear(planBox, section('Plan failed', h('pre', { class: 'error-text' }, errorText(e))));
    }
  }));

  const revs = tpl && (tpl.revisions || []).length ? section('Earlier revisions', table([
    { title: 'Revision', render: (r) => String(r.rev) },
    { title: 'Author', render: (r) => r.author },
    { title: 'Saved', render: (r) => fmtTime(r.createdAt) },
    { title: 'Files', render: (r) => (r.files || []).map((f) => f.name).join(', ') },
  ], tpl.revisions)) : null;

  clear(el,
    h('div', { class: 'title-row' }, h('h1', {}, tpl ? `Template ${tpl.title}` : 'New template'),
      tpl ? h('span', { class: 'muted' }, `revision ${tpl.rev} · team ${tpl.team} · owner ${tpl.owner}`) : null),
    section(null, form), planBox, revs);
  title.focus();
}
