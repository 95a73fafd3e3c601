// credentials.js — your teams' provider credentials: list, add (a form built from the
// provider's credential JSON Schema in provider.describe: an input per type, a select for an
// enum, a password input for a secret, required, bounds, defaults; see ../providers.js),
// describe and update (the same form: secrets left empty keep their value, immutable fields
// cannot change), authenticate, bootstrap (a job, shown live) and remove.

import { h, clear, table, badge, busy, field, section, notice, fmtTime } from '../ui.js';
import { watchJob } from '../jobs.js';
import { schemaFields, inputFor, valueOf, hintFor } from '../providers.js';

// credentialFields lists the credential fields of provider description p (its schema).
const credentialFields = (p) => schemaFields(p && p.schemas && p.schemas.credential, p && p.credential);

function verifiedBadge(c) {
  if (c.verifyError) return h('span', { title: c.verifyError }, badge('rejected', 'failed'));
  return c.verified ? badge('verified', 'ok') : badge('unchecked', 'never');
}

export async function list(ctx, el) {
  const { kite } = ctx;
  const [creds, provs, me] = await Promise.all([kite.call('credential.list'), kite.call('provider.describe'), ctx.whoami()]);
  const providers = provs.providers || [];
  const byName = Object.fromEntries(providers.map((p) => [p.name, p]));
  const jobs = h('div', { class: 'jobs' });
  const details = h('div', {});
  const watches = [];

  // updateForm edits credential v: only the fields changed are sent (credential.update).
  const updateForm = (v) => {
    const fields = credentialFields(byName[v.provider]);
    if (!fields.length) return null;
    const current = Object.fromEntries((v.fields || []).map((f) => [f.name, f.value]));
    const inputs = fields.map((f) => [f, inputFor(h, f, { idPrefix: 'cred-upd-', current: current[f.name], update: true })]);
    const btn = h('button', { type: 'submit', id: 'cred-update' }, 'Update credential');
    const form = h('form', { class: 'stack-form', id: 'cred-update-form' },
      inputs.map(([f, input]) => field(f.title, input, [hintFor(f), f.secret ? 'leave empty to keep it' : ''].filter(Boolean).join(' · '))), btn);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      busy(btn, async () => {
        const data = {};
        for (const [f, input] of inputs) {
          if (f.immutable) continue;
          const nv = valueOf(f, input);
          if (f.secret) {
            if (nv !== undefined) data[f.name] = nv;
          } else if (nv === undefined ? current[f.name] !== undefined && current[f.name] !== null : nv !== current[f.name]) {
            data[f.name] = nv === undefined ? null : nv;
          }
        }
        if (!Object.keys(data).length) {
          notice('Nothing changed.');
          return;
        }
        const r = await kite.call('credential.update', { credentialId: v.id, data });
        notice(`Credential ${v.title} updated (${(r.changed || []).join(', ') || 'no change'}); authenticate it again.`);
        await reload();
        await describe(v);
      });
    });
    return h('details', { class: 'update' }, h('summary', {}, 'Update fields'), form);
  };

  const describe = async (c) => {
    const v = await kite.call('credential.describe', { id: c.id });
    const mayChange = v.owner === ctx.session.username || (me.teams || []).some((t) => t.slug === v.team && t.role === 'admin') || (me && me.admin);
    clear(details, section(`Credential ${v.title}`,
      h('dl', { class: 'kv' },
        h('dt', {}, 'ID'), h('dd', {}, h('code', {}, v.id)),
        h('dt', {}, 'Provider'), h('dd', {}, v.provider),
        h('dt', {}, 'Team'), h('dd', {}, v.team),
        h('dt', {}, 'Owner'), h('dd', {}, v.owner),
        h('dt', {}, 'Verified'), h('dd', {}, verifiedBadge(v), v.verifyError ? ' ' + v.verifyError : ''),
        h('dt', {}, 'Bootstrap'), h('dd', {}, v.bootstrap ? [badge(v.bootstrap.status), v.bootstrap.error ? ' ' + v.bootstrap.error : '', (v.bootstrap.outputs || []).length ? ` outputs: ${v.bootstrap.outputs.join(', ')}` : ''] : 'none'),
        h('dt', {}, 'Created'), h('dd', {}, fmtTime(v.createdAt))),
      table([
        { title: 'Field', render: (f) => f.label || f.name },
        { title: 'Value', render: (f) => (f.secret ? (f.set ? '•••• (secret, set)' : '(not set)') : (f.value === undefined ? '' : String(f.value))) },
      ], v.fields || []),
      mayChange ? updateForm(v) : null));
    details.scrollIntoView({ behavior: 'smooth' });
  };

  const tableBox = h('div', {});
  const renderTable = (rows) => clear(tableBox, table([
    { title: 'Title', render: (c) => h('button', { class: 'link', onclick: () => describe(c) }, c.title) },
    { title: 'Provider', render: (c) => c.provider },
    { title: 'Team', render: (c) => c.team },
    { title: 'Owner', render: (c) => c.owner },
    { title: 'Verified', render: verifiedBadge },
    { title: 'Bootstrap', render: (c) => (c.bootstrap ? badge(c.bootstrap.status) : '—') },
    {
      title: '', class: 'actions', render: (c) => [
        h('button', {
          class: 'small', onclick: (ev) => busy(ev.target, async () => {
            const r = await kite.call('credential.authenticate', { id: c.id });
            notice(r.verified ? `${c.title}: the provider accepted it.` : `${c.title}: rejected: ${r.error || 'no reason given'}`, r.verified ? 'info' : 'error');
            await reload();
          }),
        }, 'Authenticate'),
        (byName[c.provider] && ((byName[c.provider].capabilities || []).includes('bootstrap') || (byName[c.provider].bootstrap || []).length)) ? h('button', {
          class: 'small', onclick: (ev) => busy(ev.target, async () => {
            const r = await kite.call('credential.bootstrap', { id: c.id });
            if (r.alreadyDone) {
              notice(`${c.title} is already bootstrapped.`);
              return;
            }
            clear(jobs);
            watches.push(watchJob(kite, r.jobId, jobs, { title: `Bootstrap ${c.title}`, onDone: () => reload() }));
            await reload();
          }),
        }, 'Bootstrap') : null,
        h('button', {
          class: 'small danger', onclick: (ev) => busy(ev.target, async () => {
            if (!confirm(`Remove credential ${c.title}?`)) return;
            await kite.call('credential.remove', { id: c.id });
            await reload();
          }),
        }, 'Remove'),
      ],
    },
  ], rows, { empty: 'No credentials yet: add one below.', rowAttrs: (c) => ({ dataset: { credential: c.id } }) }));
  // reload refreshes the table only: job views and the form stay as they are.
  const reload = async () => renderTable((await kite.call('credential.list')).credentials || []);
  renderTable(creds.credentials || []);

  // The add form, rebuilt for the chosen provider.
  const provSel = h('select', { name: 'provider', id: 'cred-provider' },
    providers.map((p) => h('option', { value: p.name, disabled: !p.available }, p.name + (p.available ? '' : ' (unavailable here)'))));
  const title = h('input', { name: 'title', id: 'cred-title', required: true, placeholder: 'e.g. my account' });
  const teams = (me.teams || []);
  const teamSel = h('select', { name: 'team', id: 'cred-team' }, teams.map((t) => h('option', { value: t.slug }, t.title ? `${t.title} (${t.slug})` : t.slug)));
  const fieldsBox = h('div', { class: 'fields' });
  const addBtn = h('button', { type: 'submit', class: 'primary', id: 'cred-add' }, 'Add credential');
  const provInfo = h('p', { class: 'hint' });
  let inputs = [];
  const build = () => {
    const p = byName[provSel.value];
    inputs = [];
    if (!p) { clear(fieldsBox); return; }
    clear(provInfo, p.description || '', p.available ? '' : ` — unavailable: ${p.unavailable || ''}`);
    const fields = credentialFields(p);
    clear(fieldsBox, fields.map((f) => {
      const input = inputFor(h, f);
      inputs.push([f, input]);
      return field(f.title, input, hintFor(f));
    }));
    // kloud refuses a credential for a provider without a credential part (credential.add).
    const takesNone = !(p.schemas && p.schemas.credential) && !(p.credential || []).length;
    if (takesNone) fieldsBox.append(h('p', { class: 'hint', id: 'cred-none' }, `Provider ${p.name} needs no credential: its stacks build without one.`));
    else if (!fields.length) fieldsBox.append(h('p', { class: 'hint' }, 'This provider needs no credential fields.'));
    addBtn.disabled = takesNone;
    title.disabled = takesNone;
  };
  provSel.addEventListener('change', build);
  const first = providers.find((p) => p.available);
  if (first) provSel.value = first.name;
  build();
  const form = h('form', { class: 'stack-form', id: 'cred-form' },
    field('Provider', provSel), provInfo, field('Title', title), teams.length > 1 ? field('Team', teamSel) : null, fieldsBox, addBtn);
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(addBtn, async () => {
      const data = {};
      for (const [f, input] of inputs) {
        const v = valueOf(f, input);
        if (v !== undefined) data[f.name] = v;
      }
      await kite.call('credential.add', { provider: provSel.value, title: title.value.trim(), team: teams.length > 1 ? teamSel.value : undefined, data });
      notice(`Credential ${title.value.trim()} added.`);
      title.value = '';
      build();
      await reload();
    });
  });

  clear(el, h('h1', {}, 'Credentials'), section(null, tableBox), jobs, details, section('Add a credential', form));
  return () => watches.forEach((w) => w.stop());
}
