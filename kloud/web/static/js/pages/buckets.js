// buckets.js — object buckets that stacks claim (docs/buckets.md "Claims"): the Buckets card of a
// stack's page (bucketsSection: its claims, the caller's own key on request, grants, revoke,
// delete) and the Buckets page (#/buckets: every claim the caller sees, linking to the stacks).
// Keys come only from bucket.credentials, asked when the user opens "Show my key"; bucket.list
// never carries one.

import { h, clear, table, badge, busy, section, notice, shortID, errorText } from '../ui.js';

// grantList is a claim's grants as "user: access" words, the shares' marked as such.
function grantList(b) {
  const words = Object.entries(b.grants || {}).sort(([x], [y]) => x.localeCompare(y)).map(([u, a]) => `${u}: ${a}`);
  for (const [u, a] of Object.entries(b.shareGrants || {}).sort(([x], [y]) => x.localeCompare(y))) words.push(`${u}: ${a} (share)`);
  return words.length ? words.join(', ') : '—';
}

// shellQuote quotes s for a POSIX shell (as `kloud bucket credentials` prints it).
const shellQuote = (s) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(s) ? s : `'${String(s).replace(/'/g, `'\\''`)}'`);

// exportText is the key as `export AWS_…=` lines, ready to paste into a shell.
export function exportText(c) {
  return [['KLOUD_BUCKET', c.bucket], ['AWS_ENDPOINT_URL', c.endpoint], ['AWS_REGION', c.region],
    ['AWS_ACCESS_KEY_ID', c.accessKeyId], ['AWS_SECRET_ACCESS_KEY', c.secretAccessKey]]
    .map(([k, v]) => `export ${k}=${shellQuote(v || '')}`).join('\n') + '\n';
}

// keyDetails is "Show my key": a details block that asks bucket.credentials when first opened;
// the key is in the page only from then on.
function keyDetails(ctx, b) {
  const body = h('div', { class: 'bucket-key' });
  const d = h('details', { class: 'bucket-creds', dataset: { bucketKey: b.label } }, h('summary', {}, 'Show my key'), body);
  let asked = false;
  d.addEventListener('toggle', async () => {
    if (!d.open || asked) return;
    asked = true;
    clear(body, h('p', { class: 'loading' }, 'Asking kloud for your key…'));
    try {
      const c = await ctx.kite.call('bucket.credentials', { stackId: b.stackId, label: b.label });
      clear(body,
        h('dl', { class: 'kv' },
          h('dt', {}, 'Endpoint'), h('dd', {}, h('code', { class: 'key-endpoint' }, c.endpoint)),
          h('dt', {}, 'Bucket'), h('dd', {}, h('code', { class: 'key-bucket' }, c.bucket)),
          h('dt', {}, 'Region'), h('dd', {}, h('code', { class: 'key-region' }, c.region || '—')),
          h('dt', {}, 'Access'), h('dd', {}, c.access),
          h('dt', {}, 'Access key'), h('dd', {}, h('code', { class: 'key-id' }, c.accessKeyId)),
          h('dt', {}, 'Secret key'), h('dd', {}, h('code', { class: 'key-secret' }, c.secretAccessKey))),
        h('p', { class: 'muted' }, 'For a shell (the AWS CLI and SDKs read these):'),
        h('pre', { class: 'key-export' }, exportText(c)));
    } catch (e) {
      asked = false;
      clear(body, h('p', { class: 'error-text' }, errorText(e)));
    }
  });
  return d;
}

// mayManage says whether the caller may grant, revoke and delete: the stack's owner, or (the
// server decides) a team or kloud administrator, who sees a claim without a grant of their own.
function mayManage(ctx, b) {
  const me = ctx.session.username;
  if (b.owner === me || (ctx.me && ctx.me.admin)) return true;
  return !(b.grants || {})[me] && !(b.shareGrants || {})[me];
}

// bucketCard is one claim on the stack's page.
function bucketCard(ctx, b, reload) {
  const manage = mayManage(ctx, b);
  const call = async (method, params, done) => {
    await ctx.kite.call(method, { stackId: b.stackId, label: b.label, ...params });
    notice(done);
    await reload();
  };
  const grants = Object.entries(b.grants || {}).sort(([x], [y]) => x.localeCompare(y));
  const grantRows = table([
    { title: 'User', render: ([u]) => u },
    { title: 'Access', render: ([, a]) => a },
    {
      title: '', class: 'actions', render: ([u]) => (manage ? h('button', {
        class: 'small danger', dataset: { revoke: u },
        onclick: (ev) => busy(ev.target, () => call('bucket.revoke', { user: u }, `${u} no longer has a key to ${b.label}.`)),
      }, 'Revoke') : null),
    },
  ], grants, { empty: 'No grants: only the owner (and users of shared machines) have keys.', rowAttrs: ([u, a]) => ({ dataset: { grant: u, access: a } }) });
  const parts = [
    h('dl', { class: 'kv' },
      h('dt', {}, 'Bucket'), h('dd', {}, h('code', {}, b.bucket)),
      h('dt', {}, 'State'), h('dd', {}, badge(b.state)),
      h('dt', {}, 'Retain'), h('dd', {}, b.retain ? 'yes: destroying the stack keeps the data' : 'no: destroying the stack deletes the data'),
      h('dt', {}, 'Endpoint'), h('dd', {}, b.endpoint ? h('code', {}, b.endpoint) : '—'),
      h('dt', {}, 'Provider'), h('dd', {}, b.provider),
      Object.keys(b.shareGrants || {}).length ? [h('dt', {}, 'Through shares'), h('dd', {}, Object.entries(b.shareGrants).map(([u, a]) => `${u}: ${a}`).join(', '))] : null),
    b.state === 'ready' ? keyDetails(ctx, b) : null,
    h('h3', {}, 'Grants'), grantRows,
  ];
  if (manage) {
    const user = h('input', { class: 'grant-user', 'aria-label': `grant ${b.label} to username`, placeholder: 'username', required: true, size: 16 });
    const access = h('select', { class: 'grant-access', 'aria-label': 'access' }, h('option', { value: 'read' }, 'read'), h('option', { value: 'write' }, 'write'));
    const btn = h('button', { type: 'submit', class: 'small' }, 'Grant');
    const form = h('form', { class: 'inline grant-form' }, user, access, btn);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      busy(btn, () => call('bucket.grant', { user: user.value.trim(), access: access.value }, `${user.value.trim()} has ${access.value} access to ${b.label}.`));
    });
    const retain = h('input', { type: 'checkbox', class: 'delete-retain', checked: b.retain });
    const del = h('button', {
      type: 'button', class: 'small danger bucket-delete',
      onclick: (ev) => busy(ev.target, async () => {
        const what = retain.checked ? 'Every key is revoked; the bucket and its data stay on the server.' : 'The bucket and all its objects are deleted for good.';
        if (!confirm(`Delete bucket ${b.label} of this stack? ${what} The stack's next build claims it again while its template declares it.`)) return;
        await call('bucket.delete', { retain: retain.checked }, `Bucket ${b.label} deleted${retain.checked ? ' (data kept)' : ''}.`);
      }),
    }, 'Delete bucket');
    parts.push(form, h('div', { class: 'bucket-delete-row' }, h('label', {}, retain, ' keep the data'), del));
  }
  return h('div', { class: 'bucket', dataset: { bucket: b.label, state: b.state } }, h('h3', {}, b.label), ...parts);
}

// bucketsSection is the Buckets card of stack st's page; nothing when the stack claims none (or
// this kloud has no buckets).
export function bucketsSection(ctx, st) {
  const box = h('div', { id: 'stack-buckets' });
  const load = async () => {
    let res;
    try {
      res = await ctx.kite.call('bucket.list', { stackId: st.id });
    } catch (e) {
      if (e.type === 'methodNotFound') { clear(box); return; }
      clear(box, section('Buckets', h('p', { class: 'error-text' }, errorText(e))));
      return;
    }
    const bs = res.buckets || [];
    if (!bs.length) { clear(box); return; }
    clear(box, section('Buckets', bs.map((b) => bucketCard(ctx, b, load))));
  };
  load();
  return box;
}

// list is the Buckets page: every claim the caller sees.
export async function list(ctx, el) {
  const [res, stacks] = await Promise.all([ctx.kite.call('bucket.list', {}), ctx.kite.call('stack.list').catch(() => ({}))]);
  const titles = Object.fromEntries((stacks.stacks || []).map((s) => [s.id, s.title]));
  clear(el, h('h1', {}, 'Buckets'),
    h('p', { class: 'muted' }, 'Object buckets your stacks claim with kloud_bucket blocks, and those shared with you. Open a stack for keys and grants.'),
    section(null, table([
      { title: 'Stack', render: (b) => h('a', { href: `#/stacks/${encodeURIComponent(b.stackId)}` }, titles[b.stackId] || shortID(b.stackId)) },
      { title: 'Label', render: (b) => b.label },
      { title: 'Bucket', render: (b) => h('code', {}, b.bucket) },
      { title: 'Owner', render: (b) => b.owner },
      { title: 'State', render: (b) => badge(b.state) },
      { title: 'Retain', render: (b) => (b.retain ? 'yes' : 'no') },
      { title: 'Endpoint', render: (b) => b.endpoint || '—' },
      { title: 'Grants', render: grantList },
    ], res.buckets, { empty: 'No buckets: a template declares them with resource "kloud_bucket" blocks.', rowAttrs: (b) => ({ dataset: { bucket: `${b.stackId}/${b.label}` } }) })));
}
