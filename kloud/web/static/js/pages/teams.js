// teams.js — your teams and their members (team.list), creating a team, adding and removing
// members (team admins), and changing your password (user.setPassword).

import { h, clear, table, badge, busy, field, section, notice } from '../ui.js';

export async function list(ctx, el) {
  const { kite } = ctx;
  const res = await kite.call('team.list');
  const me = ctx.session.username;
  const isAdmin = (t) => t.role === 'admin' || (ctx.me && ctx.me.admin);

  const teamCard = (t) => {
    const user = h('input', { placeholder: 'username', 'aria-label': `username to add to ${t.slug}`, required: true, name: 'username' });
    const role = h('select', { name: 'role', 'aria-label': 'role' }, h('option', { value: 'member' }, 'member'), h('option', { value: 'admin' }, 'admin'));
    const add = h('button', { type: 'submit' }, 'Add member');
    const form = isAdmin(t) ? h('form', { class: 'inline' }, user, role, add) : null;
    if (form) {
      form.addEventListener('submit', (ev) => {
        ev.preventDefault();
        busy(add, async () => {
          await kite.call('team.addMember', { team: t.slug, username: user.value.trim(), role: role.value });
          notice(`${user.value.trim()} is now ${role.value} of ${t.slug}.`);
          ctx.navigate('#/teams');
        });
      });
    }
    const members = table([
      { title: 'User', render: (m) => m.username + (m.username === me ? ' (you)' : '') },
      { title: 'Role', render: (m) => badge(m.role) },
      {
        title: '', class: 'actions', render: (m) => (isAdmin(t) || m.username === me)
          ? h('button', {
            class: 'small danger', onclick: (ev) => busy(ev.target, async () => {
              if (!confirm(`Remove ${m.username} from ${t.slug}?`)) return;
              await kite.call('team.removeMember', { team: t.slug, username: m.username });
              ctx.navigate('#/teams');
            }),
          }, m.username === me ? 'Leave' : 'Remove') : '',
      },
    ], t.members || []);
    return section(null,
      h('h2', {}, t.title || t.slug, ' ', h('small', { class: 'muted' }, t.slug), ' ', t.role ? badge(`you: ${t.role}`, t.role) : null),
      members, form);
  };

  const slug = h('input', { placeholder: 'slug (a-z, 0-9, -)', 'aria-label': 'team slug', required: true, name: 'slug' });
  const title = h('input', { placeholder: 'title (optional)', 'aria-label': 'team title', name: 'title' });
  const create = h('button', { type: 'submit' }, 'Create team');
  const createForm = h('form', { class: 'inline' }, slug, title, create);
  createForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(create, async () => {
      await kite.call('team.create', { slug: slug.value.trim(), title: title.value.trim() || undefined });
      await ctx.whoami();
      ctx.navigate('#/teams');
    });
  });

  const pw1 = h('input', { type: 'password', autocomplete: 'new-password', required: true, minlength: 8 });
  const pw2 = h('input', { type: 'password', autocomplete: 'new-password', required: true, minlength: 8 });
  const pwBtn = h('button', { type: 'submit' }, 'Change password');
  const pwForm = h('form', { class: 'stack-form' }, field('New password', pw1), field('Again', pw2), pwBtn);
  pwForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (pw1.value !== pw2.value) {
      notice('The passwords differ.', 'error');
      return;
    }
    busy(pwBtn, async () => {
      await kite.call('user.setPassword', { password: pw1.value });
      pw1.value = pw2.value = '';
      notice('Password changed.');
    });
  });

  clear(el,
    h('h1', {}, 'Teams'),
    res.teams.length ? res.teams.map(teamCard) : h('p', { class: 'empty' }, 'You are in no team yet.'),
    section('New team', createForm),
    section(`Your account: ${me}`, pwForm));
}
