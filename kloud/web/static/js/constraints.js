// constraints.js — a provider's constraints vocabulary (provider.describe's constraints) in a
// few words: "cores (cpus) 0.01–2 CPUs · mem (memory) 32–24105 MB · arch amd64".

export function constraintsSummary(vocab) {
  if (!Array.isArray(vocab) || !vocab.length) return '—';
  return vocab.map((c) => {
    const name = c.attribute && c.attribute !== c.name ? `${c.name} (${c.attribute})` : c.name;
    const unit = c.unit ? ` ${c.unit}` : '';
    let allowed = '';
    if (Array.isArray(c.values) && c.values.length) allowed = c.values.join('|');
    else if (c.min !== undefined && c.max !== undefined) allowed = `${c.min}–${c.max}${unit}`;
    else if (c.min !== undefined) allowed = `≥ ${c.min}${unit}`;
    else if (c.max !== undefined) allowed = `≤ ${c.max}${unit}`;
    return allowed ? `${name} ${allowed}` : name;
  }).join(' · ');
}
