// params.js — a template's typed parameters as a form (the New stack page): one labelled input
// per parameter (a select for choices, a checkbox for bool, a number input, a textarea of JSON
// for lists, maps and objects, a password field for sensitive ones), its description as help,
// required ones marked, and a preset picker that fills the form. kloud's refusal of a value
// (`parameter "NAME": message`) is shown next to its field. docs/user-guide.md "Parameters and
// presets".

import { h, clear } from '../ui.js';

const isJSONType = (t) => /^(list|map|set|object|tuple)\(/.test(t);
const show = (v) => (typeof v === 'string' ? v : JSON.stringify(v));

// paramsForm loads template.parameters of templateId into box and returns { values, showError,
// count }: values() gives { parameters, preset } for stack.create (it throws, marking the field,
// when a JSON field does not parse); showError(e) puts kloud's refusals next to their fields and
// says whether there was one; count is how many fields there are. With opts.current (a built
// stack's variables, in -var form) the form changes that stack (stack.update): filled with its
// values, no presets, no sensitive fields, and those that cannot change disabled.
export async function paramsForm(kite, templateId, box, opts = {}) {
  const res = await kite.call('template.parameters', { templateId, rev: opts.rev || undefined });
  const fields = {};
  const current = opts.current;
  const prefix = current ? 'update-param' : 'param';
  clear(box);
  if (current) {
    res.parameters = res.parameters.filter((p) => !p.sensitive);
    res.presets = [];
  }
  if (!res.parameters.length && !res.presets.length) return { values: () => ({}), showError: () => false, count: 0 };

  let presetSel = null;
  if (res.presets.length) {
    const def = res.presets.find((p) => p.default);
    presetSel = h('select', { id: 'stack-preset', 'aria-describedby': 'stack-preset-hint' },
      h('option', { value: '' }, '(none: the template\'s defaults)'),
      res.presets.map((p) => h('option', { value: p.name }, p.description ? `${p.name}: ${p.description}` : p.name)));
    presetSel.value = def ? def.name : '';
    box.append(h('div', { class: 'field' },
      h('label', { class: 'field-label', for: 'stack-preset' }, 'Preset'), presetSel,
      h('small', { class: 'hint', id: 'stack-preset-hint' }, 'Fills the form with the preset\'s values; what you change after wins.')));
  }

  for (const p of res.parameters) {
    const id = `${prefix}-${p.name}`;
    let def = p.default === undefined ? undefined : p.default;
    if (current && current[p.name] !== undefined) {
      const v = current[p.name];
      if (p.type === 'string' || p.type === 'any') def = v;
      else try { def = JSON.parse(v); } catch { def = v; }
    }
    let input;
    if (p.choices && p.choices.length) {
      input = h('select', { id }, p.required && def === undefined ? h('option', { value: '' }, '(choose)') : null,
        p.choices.map((c) => h('option', { value: JSON.stringify(c) }, show(c))));
      if (def !== undefined) input.value = JSON.stringify(def);
    } else if (p.type === 'bool') {
      input = h('input', { id, type: 'checkbox', checked: def === true });
    } else if (p.type === 'number') {
      input = h('input', { id, type: 'number', step: 'any', value: def === undefined ? '' : String(def) });
    } else if (isJSONType(p.type)) {
      input = h('textarea', { id, class: 'code', rows: 2, spellcheck: 'false', value: def === undefined ? '' : JSON.stringify(def) });
    } else {
      input = h('input', { id, type: p.sensitive ? 'password' : 'text', autocomplete: p.sensitive ? 'off' : null, value: def === undefined ? '' : show(def) });
    }
    input.dataset.param = p.name;
    if (p.required) { input.required = true; input.setAttribute('aria-required', 'true'); }
    if (current && !p.mutable) input.disabled = true;
    const hintId = `${id}-hint`;
    const errId = `${id}-error`;
    input.setAttribute('aria-describedby', `${hintId} ${errId}`);
    const err = h('small', { class: 'error-text field-error', id: errId });
    const help = [p.description, isJSONType(p.type) ? `JSON ${p.type}` : null, p.mutable ? null : 'cannot change after the stack is built']
      .filter(Boolean).join(' · ');
    const label = h('label', { class: 'field-label', for: id }, p.displayName || p.name, p.required ? h('span', { class: 'required', 'aria-hidden': 'true' }, ' *') : null,
      p.displayName ? h('span', { class: 'hint' }, ` (${p.name})`) : null);
    box.append(h('div', { class: 'field', dataset: { paramField: p.name } }, label, input, h('small', { class: 'hint', id: hintId }, help), err));
    fields[p.name] = { p, input, err };
  }

  const fill = (name) => {
    const pr = res.presets.find((x) => x.name === name);
    if (!pr) return;
    for (const [k, v] of Object.entries(pr.values || {})) {
      const f = fields[k];
      if (!f || f.p.sensitive) continue;
      if (f.input.type === 'checkbox') f.input.checked = v === true;
      else if (f.input.tagName === 'SELECT') f.input.value = JSON.stringify(v);
      else f.input.value = isJSONType(f.p.type) ? JSON.stringify(v) : show(v);
    }
  };
  if (presetSel) {
    fill(presetSel.value);
    presetSel.addEventListener('change', () => fill(presetSel.value));
  }

  const setError = (name, msg) => {
    const f = fields[name];
    if (!f) return false;
    f.err.textContent = msg;
    if (msg) f.input.setAttribute('aria-invalid', 'true'); else f.input.removeAttribute('aria-invalid');
    return true;
  };
  const values = () => {
    const parameters = {};
    for (const [name, f] of Object.entries(fields)) {
      setError(name, '');
      const { p, input } = f;
      if (input.disabled) continue;
      if (input.type === 'checkbox') { parameters[name] = input.checked; continue; }
      const v = input.value;
      if (v === '') continue; // its default (or, when required, kloud says a value is needed)
      if (input.tagName === 'SELECT') parameters[name] = JSON.parse(v);
      else if (p.type === 'number') parameters[name] = Number.isFinite(Number(v)) ? Number(v) : v;
      else if (isJSONType(p.type)) {
        try { parameters[name] = JSON.parse(v); } catch (e) {
          setError(name, `not JSON: ${e.message}`);
          input.focus();
          throw new Error(`${p.displayName || name}: not JSON (${p.type})`);
        }
      } else parameters[name] = v;
    }
    return { parameters, preset: presetSel ? presetSel.value : undefined };
  };
  const showError = (e) => {
    let any = false;
    const re = /parameter "([^"]+)": ([^\n]*?)(?:: invalid params)?$/gm;
    for (const m of String((e && e.message) || '').matchAll(re)) {
      if (setError(m[1], m[2])) {
        if (!any) fields[m[1]].input.focus();
        any = true;
      }
    }
    return any;
  };
  return { values, showError, count: Object.keys(fields).length };
}
