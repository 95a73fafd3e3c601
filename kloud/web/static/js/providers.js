// providers.js — what provider.describe says, cached briefly: each provider's capabilities
// (which machine actions to offer) and the JSON Schemas (2020-12) of its parts, from which the
// credential form is built (schemaFields, inputFor, valueOf).

const cache = new WeakMap(); // kite → {at, byName}
const maxAge = 15000; // plugins come and go: ask again after a while

// providers returns {name: description} of every provider kloud offers.
export async function providers(kite) {
  const c = cache.get(kite);
  if (c && Date.now() - c.at < maxAge) return c.byName;
  const res = await kite.call('provider.describe');
  const byName = Object.fromEntries((res.providers || []).map((p) => [p.name, p]));
  cache.set(kite, { at: Date.now(), byName });
  return byName;
}

// can reports whether provider name has capability cap ("start", "stop", …). A provider this
// page does not know (or an older kloud without capabilities) is given the benefit of the doubt:
// kloud refuses what it cannot do with a clear error.
export function can(byName, name, cap) {
  const p = byName && byName[name];
  if (!p || !Array.isArray(p.capabilities)) return true;
  return p.capabilities.includes(cap);
}

// schemaFields lists the fields of an object schema in their order (propertyOrder):
// {name, type, title, description, required, secret (writeOnly), immutable, default, enum,
// minimum, maximum, minLength, maxLength}. Without a schema, the older field list (legacy) is
// used.
export function schemaFields(schema, legacy = []) {
  if (!schema || typeof schema !== 'object' || !schema.properties) {
    return (legacy || []).map((f) => ({
      name: f.name, type: f.type, title: f.label || f.name, description: f.description || '', required: !!f.required,
      secret: !!f.secret, immutable: !!f.immutable, default: f.default === undefined || f.default === '' ? undefined : f.default,
      enum: f.enum,
    }));
  }
  const required = new Set(schema.required || []);
  // Fields in their "propertyOrder" (object keys may have been reordered on the way).
  const entries = Object.entries(schema.properties).map((e, i) => [e, typeof e[1].propertyOrder === 'number' ? e[1].propertyOrder : 1e9 + i]);
  entries.sort((a, b) => a[1] - b[1]);
  return entries.map(([[name, p]]) => ({
    name,
    type: p.type || 'string',
    title: p.title || name,
    description: p.description || '',
    required: required.has(name),
    secret: !!p.writeOnly,
    immutable: !!p.immutable,
    default: p.default,
    enum: Array.isArray(p.enum) ? p.enum : undefined,
    minimum: p.minimum, maximum: p.maximum, minLength: p.minLength, maxLength: p.maxLength,
  }));
}

// inputFor makes the input of field f (from schemaFields): a select for an enum, a checkbox for
// a boolean, a number input with its bounds for numbers, a password input for a secret, text
// otherwise, with the schema's rules as the browser's own validation (required, min, max,
// minlength, maxlength). With current (an update form), non-secret inputs start at the stored
// value, secrets start empty (empty keeps them), and immutable fields are disabled.
export function inputFor(h, f, { idPrefix = 'cred-', current, update = false } = {}) {
  const id = `${idPrefix}${f.name}`;
  const start = update ? current : f.default;
  const attrs = { name: f.name, id, required: f.required && !update, disabled: update && f.immutable, title: f.description || null, dataset: { type: f.type } };
  if (f.enum) {
    const opts = f.enum.map((v) => h('option', { value: String(v) }, String(v)));
    if (!f.required || update) opts.unshift(h('option', { value: '' }, f.default !== undefined ? `(default: ${f.default})` : '(none)'));
    const sel = h('select', attrs, opts);
    sel.value = start === undefined || start === null ? '' : String(start);
    return sel;
  }
  switch (f.type) {
    case 'boolean':
      return h('input', { ...attrs, type: 'checkbox', required: false, checked: start === true || start === 'true' });
    case 'integer':
    case 'number':
      return h('input', {
        ...attrs, type: 'number', step: f.type === 'integer' ? '1' : 'any', min: f.minimum ?? null, max: f.maximum ?? null,
        value: start === undefined || start === null ? '' : String(start),
      });
    default:
      return h('input', {
        ...attrs, type: f.secret ? 'password' : 'text', minlength: f.minLength ?? null, maxlength: f.maxLength ?? null,
        value: f.secret || start === undefined || start === null ? '' : String(start),
        autocomplete: f.secret ? 'new-password' : 'off',
        placeholder: f.secret && update ? '(unchanged)' : (f.secret && f.default !== undefined ? '(default set)' : ''),
      });
  }
}

// valueOf reads an input back as the field's JSON type (undefined: leave it out).
export function valueOf(f, input) {
  if (f.type === 'boolean' && !f.enum) return input.checked;
  const v = input.value;
  if (v === '') return undefined;
  if (f.type === 'integer') return parseInt(v, 10);
  if (f.type === 'number') return Number(v);
  if (f.type === 'boolean') return v === 'true';
  return v;
}

// hintFor says what the form cannot show by itself.
export function hintFor(f) {
  const bounds = [];
  if (f.minimum !== undefined && f.maximum !== undefined) bounds.push(`${f.minimum}–${f.maximum}`);
  else if (f.minimum !== undefined) bounds.push(`at least ${f.minimum}`);
  else if (f.maximum !== undefined) bounds.push(`at most ${f.maximum}`);
  return [
    f.description,
    f.required ? 'required' : 'optional',
    f.secret ? 'secret: stored encrypted, never shown again' : '',
    f.immutable ? 'cannot change once added' : '',
    f.default !== undefined && f.default !== '' ? `default ${f.default}` : '',
    ...bounds,
  ].filter(Boolean).join(' · ');
}
