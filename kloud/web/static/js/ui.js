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
    // A column without a title (the actions) is named for screen readers all the same.
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', { class: c.class }, c.title || h('span', { class: 'visually-hidden' }, 'actions'))))),
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

// errorText is the message of error e as a user reads it. kloud's invalid-params errors end in
// the code's own words (": invalid params"), which say nothing the sentence before did not.
export function errorText(e) {
  if (!e) return '';
  if (e.message) return e.type === 'invalidParams' ? e.message.replace(/: invalid params$/, '') : e.message;
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

// parsedJSON returns the object or array a string holds as JSON (terraform state keeps some
// map attributes, such as tags, as JSON strings), else the string itself.
function parsedJSON(v) {
  if (typeof v !== 'string' || !/^\s*[[{]/.test(v)) return v;
  try { return JSON.parse(v); } catch { return v; }
}

// isEmpty reports whether an attribute's value says nothing: null, "", [] or {} (also as JSON).
export function isEmpty(v) {
  v = parsedJSON(v);
  if (v === null || v === undefined || v === '') return true;
  if (Array.isArray(v)) return v.length === 0;
  return typeof v === 'object' && Object.keys(v).length === 0;
}

// asMap turns a list of {label|key|name, value} pairs (how some providers keep labels) into a
// map; anything else is returned as it is.
function asMap(v) {
  if (!Array.isArray(v) || !v.length) return v;
  const keyOf = (x) => ['label', 'key', 'name'].find((k) => typeof x[k] === 'string');
  if (!v.every((x) => x && typeof x === 'object' && !Array.isArray(x) && 'value' in x && Object.keys(x).length === 2 && keyOf(x))) return v;
  return Object.fromEntries(v.map((x) => [x[keyOf(x)], x.value]));
}

// attrInline is an attribute's value on one line: maps as {key=value, …} without kloud's own
// tags (kloud_*, counted), lists as [a, b], texts cut at their first line.
export function attrInline(v) {
  v = asMap(parsedJSON(v));
  if (v === null || v === undefined) return '—';
  if (Array.isArray(v)) return `[${v.map(attrInline).join(', ')}]`;
  if (typeof v === 'object') {
    const keys = Object.keys(v).sort();
    const own = keys.filter((k) => k.startsWith('kloud_')).length;
    const parts = keys.filter((k) => !k.startsWith('kloud_')).map((k) => `${k}=${attrInline(v[k])}`);
    if (own) parts.push(`${own} kloud tags`);
    return `{${parts.join(', ')}}`;
  }
  const str = String(v);
  return str.includes('\n') ? `${str.split('\n')[0]} …` : str;
}

// attrValue shows an attribute's value as a user reads it: a map as key/value rows (the keys
// kloud set itself, kloud_*, folded into a "kloud tags" detail), a list of words as a list,
// a multi-line text folded, anything else as code.
export function attrValue(v) {
  v = asMap(parsedJSON(v));
  if (v === null || v === undefined) return h('span', { class: 'muted' }, '—');
  if (Array.isArray(v)) {
    if (!v.length) return h('span', { class: 'muted' }, 'none');
    if (v.every((x) => x === null || typeof x !== 'object')) return h('code', {}, v.map(String).join(', '));
    return h('div', { class: 'attr-list' }, v.map((x) => attrValue(x)));
  }
  if (typeof v === 'object') {
    const entries = Object.entries(v).filter(([, x]) => !isEmpty(x)).sort(([a], [b]) => a.localeCompare(b));
    if (!entries.length) return h('span', { class: 'muted' }, 'none');
    const rows = (es) => h('dl', { class: 'kv attr-map' }, es.map(([k, x]) => [h('dt', {}, k), h('dd', {}, attrValue(x))]));
    const own = entries.filter(([k]) => k.startsWith('kloud_'));
    const theirs = entries.filter(([k]) => !k.startsWith('kloud_'));
    return h('div', { class: 'attr-obj' },
      theirs.length ? rows(theirs) : null,
      own.length ? h('details', { class: 'kloud-tags' }, h('summary', {}, `kloud tags (${own.length})`), rows(own)) : null);
  }
  const s = String(v);
  if (s.includes('\n')) {
    const lines = s.replace(/\n$/, '').split('\n').length;
    return h('details', { class: 'attr-text' }, h('summary', {}, `${lines} lines`), h('pre', { tabindex: 0 }, s)); // focusable: the keyboard scrolls it
  }
  return h('code', {}, s);
}

// shortError is the line of error text a user reads first: its first line, without the
// hints in parentheses and the causes wrapped after its second ": " ("unavailable on this
// host: no Docker daemon answers at unix:///var/run/docker.sock (install …): Cannot connect
// …" → "unavailable on this host: no Docker daemon answers at unix:///var/run/docker.sock").
export function shortError(text) {
  let s = String(text || '').trim().split('\n')[0];
  s = s.replace(/\s*\([^()]*\)/g, '');
  return s.split(': ').slice(0, 2).join(': ').trim();
}

// firstLine is text's first line, cut to about max characters, with " …" when there is more.
export function firstLine(text, max = 160) {
  const all = String(text || '').trim();
  let l = all.split('\n')[0];
  if (l.length > max) l = l.slice(0, max).replace(/\s+\S*$/, '');
  return l === all ? l : `${l.replace(/[\s:;,]+$/, '')} …`;
}

// errorDetail shows error text whole when it is short (a few lines), else as a short line (by
// default its first line) with the whole text folded under "details".
export function errorDetail(text, { short, cls = 'error-short' } = {}) {
  const full = String(text || '').trim();
  if (!full) return '—';
  if (short === undefined) {
    if (full.split('\n').length <= 6 && full.length <= 500) return h('span', { class: cls }, full);
    short = firstLine(full);
  }
  if (short === full) return h('span', { class: cls }, full);
  return h('span', { class: cls },
    h('span', { class: 'error-summary' }, short),
    h('details', { class: 'error-detail' }, h('summary', {}, 'details'), h('pre', { tabindex: 0 }, full))); // focusable: the keyboard scrolls it
}

// reasonCell is a reason in a table cell: its first line, the whole text in the tooltip (the
// row's own page shows it all).
export function reasonCell(text) {
  if (!text) return '';
  const short = firstLine(text, 120);
  return short === String(text).trim() ? short : h('span', { title: String(text).trim() }, short);
}
