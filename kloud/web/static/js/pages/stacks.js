// stacks.js — stacks: the list, creating one from a template (credentials and variables, plan
// preview), and a stack's page with its machines and build / destroy, whose progress and log
// come live from job.watch.

import { live } from '../live.js';
import { h, clear, table, badge, busy, field, section, notice, fmtTime, shortID, errorText, errorDetail, reasonCell } from '../ui.js';
import { watchJob } from '../jobs.js';
import { planTable, planJob } from './templates.js';
import { machineTable } from './machines.js';
import { providers } from '../providers.js';
import { updateButton, scaleSection } from './stackupdate.js';
import { bucketsSection } from './buckets.js';
import { paramsForm } from './params.js';

// needsCredential says whether provider description d asks for a credential: it has a
// credential part (a schema), as kloud decides when it builds the template (kloud/stacks.go).
const needsCredential = (d) => !!((d.schemas && d.schemas.credential) || (d.credential && d.credential.length));

const canBuild = (st) => st.state === 'NotInitialized' || st.state === 'Failed';
const canDestroy = (st) => st.state !== 'Building' && st.state !== 'Destroying';

async function apply(ctx, st, destroy, jobsEl, onDone) {
  if (destroy && !confirm(`Destroy stack ${st.title}? Its machines and their disks are deleted.`)) return null;
  // A built stack's apply plans first (an update to its own files), as stack.update does.
  const r = await ctx.kite.call('stack.apply', { stackId: st.id, destroy }, { timeout: 10 * 60 * 1000 });
  return watchJob(ctx.kite, r.jobId, jobsEl, { title: `${destroy ? 'Destroying' : 'Building'} ${st.title}`, onDone });
}

// templateTitles returns the titles of the templates the caller sees, by id (a stack names its
// template by id; a template deleted since is not among them).
async function templateTitles(kite) {
  const res = await kite.call('template.list').catch(() => ({}));
  return Object.fromEntries((res.templates || []).map((t) => [t.id, t.title]));
}

// templateLink links to template id at revision rev by its title (its id's prefix when the
// template is gone or not visible).
function templateLink(id, rev, titles) {
  return h('a', { href: `#/templates/${encodeURIComponent(id)}`, class: 'template-link', title: `template ${id}` }, `${titles[id] || shortID(id)}, revision ${rev}`);
}

export async function list(ctx, el) {
  const jobs = h('div', { class: 'jobs' });
  const box = h('div', {});
  const watches = [];
  let lv = null;
  // reload refreshes the table only, so job views stay with their logs.
  const reload = async () => {
    const [res, titles] = await Promise.all([ctx.kite.call('stack.list'), templateTitles(ctx.kite)]);
    const act = (s, destroy) => (ev) => busy(ev.target, async () => {
      const w = await apply(ctx, s, destroy, jobs, () => lv.refresh().catch(() => {}));
      if (w) { watches.push(w); await lv.refresh(); }
    });
    clear(box, section(null, table([
      { title: 'Stack', render: (s) => h('a', { href: `#/stacks/${encodeURIComponent(s.id)}` }, s.title || shortID(s.id)) },
      { title: 'State', render: (s) => badge(s.state) },
      { title: 'Machines', render: (s) => String((s.machines || []).length) },
      {
        title: 'Template', render: (s) => [templateLink(s.templateId, s.templateRev, titles),
          s.updateAvailable ? [' ', h('a', { class: 'badge badge-update', href: `#/stacks/${encodeURIComponent(s.id)}` }, `update: rev ${s.latestRev}`)] : null],
      },
      { title: 'Team', render: (s) => s.team },
      { title: 'Created', render: (s) => fmtTime(s.createdAt) },
      { title: 'Reason', class: 'reason', render: (s) => reasonCell(s.reason) },
      {
        title: '', class: 'actions', render: (s) => [
          canBuild(s) ? h('button', { class: 'small', onclick: act(s, false) }, 'Build') : null,
          canDestroy(s) ? h('button', { class: 'small danger', onclick: act(s, true) }, 'Destroy') : null,
        ],
      },
    ], res.stacks, { empty: 'No stacks yet: create one from a template.', rowAttrs: (s) => ({ dataset: { stack: s.id, state: s.state } }) })));
  };
  clear(el,
    h('div', { class: 'title-row' }, h('h1', {}, 'Stacks'), h('a', { class: 'button primary', href: '#/stacks/new', id: 'stack-new' }, 'New stack')),
    jobs, box);
  // Kept current by kloud's events (live.js): a stack created, changed or deleted anywhere.
  lv = await live(ctx.kite, { topics: ['stacks'], refresh: reload });
  await lv.refresh();
  return () => { lv.stop(); watches.forEach((w) => w.stop()); };
}

// parseVars reads KEY=VALUE lines.
function parseVars(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const l = line.trim();
    if (!l || l.startsWith('#')) continue;
    const i = l.indexOf('=');
    if (i <= 0) throw new Error(`variables: "${l}" is not KEY=VALUE`);
    out[l.slice(0, i).trim()] = l.slice(i + 1).trim();
  }
  return out;
}

export async function create(ctx, el) {
  const { kite } = ctx;
  const res = await kite.call('template.list');
  const templates = res.templates || [];
  if (!templates.length) {
    clear(el, h('h1', {}, 'New stack'), section(null, h('p', {}, 'There is no template yet: ', h('a', { href: '#/templates/new' }, 'write one'), ' first.')));
    return;
  }
  const tplSel = h('select', { id: 'stack-template' }, templates.map((t) => h('option', { value: t.id }, `${t.title} (rev ${t.rev}, ${t.team})`)));
  if (ctx.params.template) tplSel.value = ctx.params.template;
  const title = h('input', { id: 'stack-title', placeholder: '(default: the template title)' });
  const credBox = h('div', {});
  const vars = h('textarea', { id: 'stack-variables', class: 'code', rows: 3, placeholder: 'KEY=VALUE per line (optional)' });
  const planBox = h('div', {});
  let credSels = {};
  // params.js: the template's typed parameters and presets.
  const paramBox = h('div', { id: 'stack-params' });
  let pform = { values: () => ({}), showError: () => false };
  const loadParams = async () => {
    pform = { values: () => ({}), showError: () => false };
    pform = await paramsForm(kite, tplSel.value, paramBox).catch((e) => {
      clear(paramBox, h('p', { class: 'error-text' }, `Parameters: ${errorText(e)}`));
      return pform;
    });
  };

  const loadCreds = async () => {
    const t = templates.find((x) => x.id === tplSel.value);
    credSels = {};
    clear(credBox);
    const described = await providers(kite).catch(() => ({}));
    for (const p of (t && t.providers) || []) {
      const r = await kite.call('credential.list', { provider: p, team: t.team });
      const cs = r.credentials || [];
      if (cs.length === 0) {
        // A provider without a credential part builds without one: nothing to say. One that
        // needs a credential (or one this page does not know) says where to add it.
        const d = described[p];
        if (d && !needsCredential(d)) continue;
        credBox.append(h('p', { class: 'hint', dataset: { needsCredential: p } }, `Provider ${p} needs a credential and team ${t.team} has none yet: `, h('a', { href: '#/credentials' }, 'add one'), '.'));
        continue;
      }
      // Credentials by title; the owner (or the id) tells apart those of the same title.
      const same = (c) => cs.filter((x) => x.title === c.title);
      const name = (c) => (same(c).length < 2 ? c.title : `${c.title} (${same(c).filter((x) => x.owner === c.owner).length < 2 ? c.owner : shortID(c.id)})`);
      const sel = h('select', { id: `stack-cred-${p}` }, cs.map((c) => h('option', { value: c.id }, name(c))));
      credSels[p] = sel;
      credBox.append(field(`Credential for ${p}`, sel));
    }
  };
  tplSel.addEventListener('change', () => { clear(planBox); loadCreds(); loadParams(); });
  await Promise.all([loadCreds(), loadParams()]);

  const params = () => {
    const credentials = {};
    for (const [p, sel] of Object.entries(credSels)) credentials[p] = sel.value;
    const variables = parseVars(vars.value);
    const { parameters, preset } = pform.values();
    return {
      templateId: tplSel.value,
      parameters: parameters && Object.keys(parameters).length ? parameters : undefined,
      preset,
      credentials: Object.keys(credentials).length ? credentials : undefined,
      variables: Object.keys(variables).length ? variables : undefined,
    };
  };
  const planBtn = h('button', { type: 'button', id: 'stack-plan' }, 'Plan');
  const createBtn = h('button', { type: 'submit', class: 'primary', id: 'stack-create' }, 'Create stack');
  planBtn.addEventListener('click', () => busy(planBtn, async () => {
    clear(planBox, section('Plan', h('p', { class: 'loading' }, 'terraform plan…')));
    try {
      const r = await planJob(kite, params(), planBox);
      if (r) clear(planBox, section(`Plan: ${r.machines.length} machine(s)`, planTable(r.machines, (templates.find((x) => x.id === tplSel.value) || {}).files)));
    } catch (e) {
      pform.showError(e);
      clear(planBox, section('Plan failed', h('pre', { class: 'error-text' }, errorText(e))));
    }
  }));
  const form = h('form', { class: 'stack-form', id: 'stack-form' },
    field('Template', tplSel), field('Title', title), credBox, paramBox, field('Other variables', vars, 'KEY=VALUE lines for variables the form does not show'),
    h('div', { class: 'buttons' }, planBtn, createBtn));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(createBtn, async () => {
      const r = await kite.call('stack.create', { ...params(), title: title.value.trim() || undefined }, { timeout: 10 * 60 * 1000 })
        .catch((e) => { pform.showError(e); throw e; });
      notice(`Stack created with ${r.machines.length} machine(s); build it to start them.`);
      ctx.navigate(`#/stacks/${encodeURIComponent(r.stack.id)}`);
    });
  });
  clear(el, h('h1', {}, 'New stack'), section(null, form), planBox);
}

export async function detail(ctx, el) {
  const { kite } = ctx;
  const id = ctx.params.id;
  const head = h('div', {});
  const machines = h('div', {});
  const jobs = h('div', { class: 'jobs', id: 'stack-jobs' });
  const updateBox = h('div', { id: 'stack-update-box' }); // stackupdate.js: the plan before an update
  const scaleBox = h('div', { id: 'stack-scale-box' }); // stackupdate.js: the Scale card
  const bucketsBox = h('div', {}); // buckets.js: the Buckets card
  const paramsBox = h('div', { id: 'stack-params-card' }); // params.js: change parameters
  let paramsState = null; // the stack's state and revision when the Parameters card was loaded
  let watch = null;
  let lv = null; // live.js: the stack, its machines and jobs from kloud's events
  let st = null;
  let bucketsState = null; // the stack's state when the Buckets card was loaded

  const refresh = async () => {
    let titles;
    try {
      [st, titles] = await Promise.all([kite.call('stack.describe', { id }), templateTitles(kite)]);
    } catch (e) {
      if (e.type === 'notFound') {
        clear(head, h('h1', {}, 'Stack gone'), h('p', {}, 'This stack does not exist (any more). ', h('a', { href: '#/stacks' }, 'All stacks')));
        clear(machines);
        return false;
      }
      throw e;
    }
    const buildBtn = canBuild(st) ? h('button', { class: 'primary', id: 'stack-build', onclick: (ev) => busy(ev.target, () => start(false)) }, st.state === 'Failed' ? 'Build again' : 'Build') : null;
    const destroyBtn = canDestroy(st) ? h('button', { class: 'danger', id: 'stack-destroy', onclick: (ev) => busy(ev.target, () => start(true)) }, 'Destroy') : null;
    const onJob = (jobId, title) => { follow(jobId, title); reread(); };
    const updBtn = updateButton(ctx, st, updateBox, onJob);
    clear(scaleBox, scaleSection(ctx, st, onJob));
    clear(head,
      h('div', { class: 'title-row' }, h('h1', {}, `Stack ${st.title || shortID(st.id)}`), badge(st.state), h('span', { class: 'spacer' }), updBtn, buildBtn, destroyBtn),
      h('dl', { class: 'kv' },
        h('dt', {}, 'ID'), h('dd', {}, h('code', {}, st.id)),
        h('dt', {}, 'Owner / team'), h('dd', {}, `${st.owner} / ${st.team}`),
        h('dt', {}, 'Template'), h('dd', { id: 'stack-template-link' }, templateLink(st.templateId, st.templateRev, titles),
          st.latestRev > st.templateRev ? ` (latest: ${st.latestRev})` : null, st.diverged ? ' (scaled)' : null),
        st.reason ? [h('dt', {}, 'Reason'), h('dd', { class: 'reason' }, errorDetail(st.reason))] : null,
        // params.js: the values the stack was given (sensitive ones are never sent).
        st.preset || (st.variables && Object.keys(st.variables).length) ? [h('dt', {}, 'Parameters'), h('dd', { id: 'stack-parameters' },
          st.preset ? `preset ${st.preset}` : null, st.preset && st.variables ? '; ' : null,
          Object.entries(st.variables || {}).map(([k, v]) => `${k} = ${v}`).join(', '))] : null,
        h('dt', {}, 'Updated'), h('dd', {}, fmtTime(st.updatedAt))));
    const caps = await providers(kite).catch(() => ({}));
    clear(machines, section('Machines', machineTable(ctx, st.machineDocs || [], { onChange: reread, jobsEl: jobs, caps })));
    // The Buckets card loads again only when the stack's state changed (a build made or a
    // destroy ended its claims): the 2 s refresh during a job must not close an opened key or
    // clear a grant form being typed.
    if (bucketsState !== st.state) {
      bucketsState = st.state;
      clear(bucketsBox, bucketsSection(ctx, st));
    }
    // Likewise the Parameters card (a built stack's mutable parameters, stack.update).
    if (paramsState !== `${st.state} ${st.templateRev} ${JSON.stringify(st.variables || {})}`) {
      paramsState = `${st.state} ${st.templateRev} ${JSON.stringify(st.variables || {})}`;
      await paramsCard(st).catch(() => clear(paramsBox));
    }
    return true;
  };

  // paramsCard shows the stack's parameters as a form that changes the mutable ones, keeping
  // the stack's template revision (stack.update); only for a built stack.
  const paramsCard = async (s) => {
    clear(paramsBox);
    if (s.state !== 'Initialized' && s.state !== 'Failed') return;
    const inner = h('div', {});
    const pf = await paramsForm(kite, s.templateId, inner, { current: s.variables || {}, rev: s.templateRev });
    if (!pf.count) return;
    const btn = h('button', { type: 'submit', id: 'stack-params-update' }, 'Update parameters');
    const form = h('form', { id: 'stack-params-form' }, inner, h('div', { class: 'buttons' }, btn));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      busy(btn, async () => {
        const { parameters } = pf.values();
        const j = await kite.call('stack.update', { stackId: s.id, templateRevision: s.templateRev, parameters }, { timeout: 10 * 60 * 1000 })
          .catch((e) => { pf.showError(e); throw e; });
        follow(j.jobId, `Updating the parameters of ${s.title}`);
        reread();
      });
    });
    clear(paramsBox, section('Parameters', form));
  };

  const reread = () => (lv ? lv.refresh().catch(() => {}) : refresh());
  const follow = (jobId, title) => {
    if (watch && watch.jobId === jobId) return;
    if (watch) watch.stop();
    clear(jobs);
    // The job's progress and log (job.watch); machines' states changing meanwhile come as
    // events (live below).
    watch = watchJob(kite, jobId, jobs, { title, onDone: () => reread() });
  };

  const start = async (destroy) => {
    if (destroy && !confirm(`Destroy stack ${st.title}? Its machines are deleted.`)) return;
    const r = await kite.call('stack.apply', { stackId: st.id, destroy }, { timeout: 10 * 60 * 1000 }); // a built stack's plans first
    follow(r.jobId, destroy ? 'Destroying' : 'Building');
    await reread();
  };

  clear(el, head, updateBox, jobs, machines, bucketsBox, paramsBox, scaleBox);
  // Kept current by kloud's events of this stack (live.js): the stack, its machines and their
  // agents; a job of the stack started elsewhere (the CLI, another tab) is followed here.
  lv = await live(kite, {
    topics: ['stacks', 'machines', 'jobs'], stackId: id, refresh,
    onEvent: (ev) => {
      if (ev.kind !== 'job') return true;
      const j = ev.job || {};
      if (!['succeeded', 'failed', 'cancelled'].includes(j.status) && (!watch || watch.jobId !== ev.id)) {
        follow(ev.id, j.stage === 'Destroying' ? 'Destroying' : 'Job');
      }
      return false; // its progress shows in the job view; the stack's own event re-reads
    },
  });
  if (await lv.refresh() && st.jobId) {
    // The stack's last job: live if it still runs, else its final state and log.
    follow(st.jobId, st.state === 'Destroying' ? 'Destroying' : st.state === 'Building' ? 'Building' : 'Last job');
  }
  return () => {
    if (lv) lv.stop();
    if (watch) watch.stop();
  };
}
