// ui.js — small DOM helpers shared by the pages: element builder, tables, badges, times,
// notices, and error text from kite errors.

// h builds an element: h('button', {class: 'x', onclick: fn}, 'text', child, …). Attributes
// starting with "on" are listeners; `dataset` and `style` objects are merged; null children are
// skipped.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'style' && typeof v === 'object') Object.assign(el.style, v);
    else if (k === 'value') el.value = v;
    else if (k === 'checked') el.checked = !!v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// table renders rows with columns [{title, render(row) → node|string, class}].
export function table(columns, rows, { empty = 'Nothing here yet.', rowAttrs } = {}) {
  if (!rows || rows.length === 0) return h('p', { class: 'empty' }, empty);
  return h('table', { class: 'grid' },
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', { class: c.class }, c.title)))),
    h('tbody', {}, rows.map((r) => h('tr', rowAttrs ? rowAttrs(r) : {}, columns.map((c) => h('td', { class: c.class }, c.render(r)))))));
}

// badge shows a state word with a color class derived from it.
export function badge(text, kind) {
  const k = kind || String(text || '').toLowerCase();
  return h('span', { class: `badge badge-${k}` }, text || '—');
}

export function fmtTime(t) {
  if (!t) return '—';
  const d = new Date(t);
  if (isNaN(d) || d.getFullYear() < 2000) return '—';
  return d.toLocaleString();
}

// ago says how long ago t was ("12 s ago").
export function ago(t) {
  if (!t) return 'never';
  const d = Date.parse(t);
  if (isNaN(d) || d < Date.UTC(2000, 0)) return 'never';
  const s = Math.max(0, Math.round((Date.now() - d) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export function errorText(e) {
  if (!e) return '';
  if (e.message) return e.message;
  return String(e);
}

// notice shows a message at the top of the page for a while.
export function notice(msg, kind = 'info', ms = 6000) {
  const box = document.getElementById('notices');
  if (!box) return;
  const n = h('div', { class: `notice notice-${kind}`, role: kind === 'error' ? 'alert' : 'status' },
    h('span', {}, msg), h('button', { class: 'link', onclick: () => n.remove(), 'aria-label': 'dismiss' }, '×'));
  box.append(n);
  if (ms) setTimeout(() => n.remove(), ms);
}

// busy disables a button while fn runs, and reports fn's error.
export async function busy(btn, fn) {
  const was = btn.disabled;
  btn.disabled = true;
  btn.classList.add('busy');
  try {
    return await fn();
  } catch (e) {
    notice(errorText(e), 'error', 12000);
    return undefined;
  } finally {
    btn.disabled = was;
    btn.classList.remove('busy');
  }
}

export function field(label, input, hint) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label' }, label), input, hint ? h('small', { class: 'hint' }, hint) : null);
}

export function section(title, ...children) {
  return h('section', { class: 'card' }, title ? h('h2', {}, title) : null, ...children);
}

export function shortID(id) {
  return id ? String(id).slice(0, 8) : '';
}
