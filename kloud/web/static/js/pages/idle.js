// idle.js — a machine's idle stop (kloud/idle.go): what it does to the machine, as `kloud
// machine list` says it (the machines table's Idle column: "idle stop in 12m", "stopped: idle
// for 30m", "always on"), and, on the machine's page, its owner's and team admins' settings
// (machine.set: idle timeout, always on, autostart schedule).

import { h, clear, busy, section, notice } from '../ui.js';

// dur prints seconds as Go's kloud.ShortDuration does: "1h30m", "12m", "45s".
export function dur(seconds) {
  let s = Math.max(0, Math.round(seconds));
  const hours = Math.floor(s / 3600);
  s -= hours * 3600;
  const mins = Math.floor(s / 60);
  s -= mins * 60;
  let out = '';
  if (hours) out += `${hours}h`;
  if (mins || (hours && s)) out += `${mins}m`;
  if (s || !out) out += `${s}s`;
  return out;
}

// idleText says what the idle stop does to m at now (ms): why it stopped, the countdown, or
// the settings in force.
export function idleText(m, now = Date.now()) {
  const i = m.idle || {};
  if (m.state === 'Stopped' && (m.reason || '').startsWith('idle for ')) return `stopped: ${m.reason}`;
  if (i.effectiveAlwaysOn) return 'always on';
  if (!i.effectiveTimeoutSeconds) return 'never stopped';
  const after = dur(i.effectiveTimeoutSeconds);
  if (m.state === 'Running' && i.deadline) return `idle stop in ${dur((Date.parse(i.deadline) - now) / 1000)} (after ${after} idle)`;
  return `stops after ${after} idle`;
}

// autostartText describes m's start schedule and its next start ('' without one).
export function autostartText(m) {
  const a = m.autostart;
  if (!a) return '';
  let next = a.next;
  try {
    next = new Date(a.next).toLocaleString(undefined, { timeZone: a.tz, weekday: 'short', year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', timeZoneName: 'short' });
  } catch (e) { /* an unknown zone: the ISO time */ }
  return `${a.schedule} ${a.tz} (next start ${next})`;
}

export function idleCell(m) {
  return h('span', { class: 'idle', title: 'idle stop: kloud stops a Running machine without activity (terminals, port forwards, CPU)' }, idleText(m));
}

// idleSection is the idle stop on m's page; the owner and team admins change it.
export function idleSection(ctx, m, grant, onChange) {
  const i = m.idle || {};
  const parts = [h('p', { id: 'idle-status' }, idleText(m)),
    m.autostart ? h('p', { id: 'autostart-status' }, 'Autostart: ', autostartText(m)) : null];
  if (grant === 'owner' || grant === 'admin') {
    const timeout = h('input', { id: 'idle-timeout', 'aria-label': 'idle timeout', placeholder: i.timeoutSeconds != null ? dur(i.timeoutSeconds) : 'inherited', size: 10 });
    const always = h('select', { id: 'idle-always-on', 'aria-label': 'always on' },
      h('option', { value: '', selected: i.alwaysOn == null }, 'as the template says'),
      h('option', { value: 'true', selected: i.alwaysOn === true }, 'always on'),
      h('option', { value: 'false', selected: i.alwaysOn === false }, 'may be stopped'));
    const auto = h('input', { id: 'autostart', 'aria-label': 'autostart schedule', placeholder: m.autostart ? m.autostart.schedule : 'autostart: mon-fri 09:00', size: 22 });
    const tz = h('input', { id: 'autostart-tz', 'aria-label': 'autostart time zone', placeholder: m.autostart ? m.autostart.tz : 'UTC', size: 16 });
    const btn = h('button', { type: 'submit' }, 'Save');
    const form = h('form', { class: 'inline', id: 'idle-form' }, timeout, always, auto, tz, btn);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      busy(btn, async () => {
        const p = { machineId: m.id };
        if (timeout.value.trim()) p.idleTimeout = timeout.value.trim();
        if (always.value === '') p.resetAlwaysOn = true; else p.alwaysOn = always.value === 'true';
        if (auto.value.trim()) p.autostart = auto.value.trim();
        if (tz.value.trim() && p.autostart && p.autostart !== 'off') p.timezone = tz.value.trim();
        const nm = await ctx.kite.call('machine.set', p);
        notice(`Idle stop of ${m.label}: ${idleText(nm)}.`);
        if (onChange) onChange();
      });
    });
    parts.push(h('p', { class: 'muted' }, 'Idle timeout: a duration such as 30m or 1h, 0 for never, or "default" for the template\'s (else kloud\'s). Autostart: "DAYS HH:MM" (daily, weekdays, mon-fri, sat,sun) in a time zone, or "off".'), form);
  }
  const box = h('div', { id: 'idle' });
  clear(box, section('Idle stop', ...parts));
  return box;
}
