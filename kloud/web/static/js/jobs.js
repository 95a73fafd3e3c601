// jobs.js — a live view of one durable job (stack build/destroy, machine start/stop, credential
// bootstrap): a progress bar with the job's stage and message, and a scrolling log, fed by
// job.watch events. The stream is reopened after a reconnect (it resends the whole log, so the
// view starts over).

import { h, clear, errorText } from './ui.js';

// JobView renders into its element `el`; done resolves with the final event.
export class JobView {
  constructor(kite, jobId, { title = 'Job', onDone } = {}) {
    this.kite = kite;
    this.jobId = jobId;
    this.onDone = onDone;
    this.bar = h('div', { class: 'progress-bar', role: 'progressbar', 'aria-label': `${title}: progress`, 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': 0 });
    this.pct = h('span', { class: 'progress-pct' }, '0%');
    this.status = h('span', { class: 'job-status' }, 'waiting');
    this.message = h('span', { class: 'job-message' }, '');
    this.log = h('pre', { class: 'job-log', role: 'log', 'aria-label': `${title}: log`, tabindex: 0 }); // focusable: the keyboard scrolls it
    this.el = h('div', { class: 'job', dataset: { job: jobId, status: 'queued' } },
      h('div', { class: 'job-head' }, h('strong', {}, title), ' ', this.status, ' ', this.message),
      h('div', { class: 'progress' }, this.bar, this.pct),
      this.log);
    this.done = new Promise((resolve) => { this._resolve = resolve; });
    this.finished = false;
  }

  async start() {
    try {
      this.sub = await this.kite.subscribe('job.watch', { jobId: this.jobId }, {
        reopen: true,
        onEvent: (ev) => this.update(ev),
        onReopen: () => { if (!this.finished) clear(this.log); },
        onEnd: (err) => {
          if (err && !this.finished) this.fail(`watch ended: ${errorText(err)}`);
        },
      });
      const j = this.sub.result && this.sub.result.job;
      if (j && !this.seen) this.update({ status: j.status, percentage: j.percentage, stage: j.stage, message: j.message, error: j.error, result: j.result });
    } catch (e) {
      this.fail(`cannot watch job ${this.jobId}: ${errorText(e)}`);
    }
    return this;
  }

  update(ev) {
    this.seen = true;
    const pct = Math.max(0, Math.min(100, ev.percentage || 0));
    this.bar.style.width = pct + '%';
    this.bar.setAttribute('aria-valuenow', String(pct));
    this.pct.textContent = pct + '%';
    if (ev.status) {
      this.status.textContent = ev.status;
      this.status.className = `job-status badge badge-${ev.status === 'running' ? 'running-job' : ev.status}`;
      this.el.dataset.status = ev.status;
    }
    this.message.textContent = ev.message || ev.stage || '';
    if (ev.log && ev.log.length) {
      const atBottom = this.log.scrollTop + this.log.clientHeight >= this.log.scrollHeight - 4;
      this.log.append(ev.log.join('\n') + '\n');
      if (atBottom) this.log.scrollTop = this.log.scrollHeight;
    }
    if (ev.error) {
      this.el.classList.add('failed');
      this.message.textContent = ev.error;
    }
    if (['succeeded', 'failed', 'cancelled'].includes(ev.status) && !this.finished) {
      this.finished = true;
      this.el.classList.add(ev.status === 'succeeded' ? 'ok' : 'failed');
      if (this.sub) this.sub.end();
      if (this.onDone) this.onDone(ev);
      this._resolve(ev);
    }
  }

  fail(msg) {
    this.el.classList.add('failed');
    this.message.textContent = msg;
    if (!this.finished) {
      this.finished = true;
      this._resolve({ status: 'failed', error: msg });
    }
  }

  stop() {
    if (this.sub) this.sub.end();
  }
}

// watchJob starts a JobView in container (appended) and returns it.
export function watchJob(kite, jobId, container, opts) {
  const v = new JobView(kite, jobId, opts);
  container.append(v.el);
  v.start();
  return v;
}
