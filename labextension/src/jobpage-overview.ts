/**
 * The job page's Overview tab: the job's facts (status, queue position, estimated start and
 * why it waits while queued, times, limits, exit code, attempt, outputs, backend), where each
 * node runs, and the spec's fields that say something.
 */
import { h } from './dom';
import { dateTime, span } from './format';
import { elapsed, statusText } from './jobstate';
import { JobTab, type JobPage } from './jobpage-tab';
import type { Job } from './models';

/** A queued job's estimated start as the service predicts it, or why there is none. */
function estimate(job: Job): string {
  if (!job.estimated_start) {
    return 'unknown: a job it waits for has no duration (or it is far back in the queue)';
  }
  const at = new Date(job.estimated_start);
  const minutes = Math.max(0, Math.round((at.getTime() - Date.now()) / 60000));
  return `${dateTime(job.estimated_start)} (in about ${minutes < 1 ? 'a minute' : span(minutes * 60)})`;
}

/**
 * A node's exit code as the overview shows it: an auxiliary node (a parameter server, which
 * never ends by itself) stopped once the job succeeded has its stop's code (143), said so.
 */
function exitText(job: Job, node: NonNullable<Job['nodes']>[number]): string | null | undefined {
  const code = node.exit_code;
  if (job.status === 'succeeded' && node.primary === false && code !== null && code !== undefined && code !== 0) {
    return `${code} (stopped when the primary nodes had succeeded)`;
  }
  return code === null || code === undefined ? code : String(code);
}

/** A field left at nothing (null, [], {}, an object of nulls) says nothing: not shown. */
function empty(v: unknown): boolean {
  return (
    v === null ||
    v === undefined ||
    (Array.isArray(v) && v.length === 0) ||
    (typeof v === 'object' && !Array.isArray(v) && Object.values(v as object).every(empty))
  );
}

export class OverviewTab extends JobTab {
  readonly label = 'Overview';

  constructor(page: JobPage) {
    super('overview', page);
  }

  render(): void {
    const job = this.page.job;
    const spec = job.spec;
    const row = (label: string, value: unknown) =>
      h(
        'tr',
        {},
        h('th', {}, label),
        h('td', {}, value === null || value === undefined || value === '' ? '—' : String(value))
      );
    const facts = h(
      'table',
      { class: 'ma-facts ma-overview-facts' },
      row('Status', statusText(job)),
      row('Reason', job.reason),
      spec.devenv_of ? row('Dev environment of', `job ${spec.devenv_of.job_id}, node ${spec.devenv_of.node}`) : null,
      job.status === 'queued' ? row('Queue position', (job.queue_position ?? 0) + 1) : null,
      job.status === 'queued' ? row('Estimated start', estimate(job)) : null,
      job.status === 'queued' ? row('Why it waits', this.page.prediction || 'waiting for the next admission pass') : null,
      row('Created', dateTime(job.created_at)),
      row('Started', dateTime(job.started_at)),
      row('Finished', dateTime(job.finished_at)),
      row('Elapsed', elapsed(job)),
      row('Duration limit', spec.duration ? span(spec.duration) : 'none'),
      row('Exit code', job.exit_code),
      row('Attempt', job.attempt),
      row('Restarts / resumes', job.restarts),
      row('Spec chosen', job.chosen_spec),
      row('Outputs folder', job.outputs_folder ?? spec.outputs),
      row('Isolation', job.workspace_isolation),
      row('Backend', job.backend)
    );
    const nodes = h(
      'table',
      { class: 'ma-facts ma-nodes-table' },
      h('tr', {}, ...['Node', 'Runs on', 'Hostname', 'Address', 'State', 'Exit code', 'Ranks'].map(t => h('th', {}, t))),
      ...(job.nodes ?? []).map(n =>
        h(
          'tr',
          { 'data-node': n.name },
          ...[n.name, n.host, n.hostname, n.address, n.state, exitText(job, n), (n.ranks ?? []).join(', ')].map(v =>
            h('td', {}, v === null || v === undefined || v === '' ? '—' : String(v))
          )
        )
      )
    );
    const specRows = Object.entries(spec)
      .filter(([, v]) => !empty(v))
      .map(([key, value]) =>
        h(
          'tr',
          { 'data-field': key },
          h('th', {}, key),
          h('td', {}, h('code', {}, typeof value === 'object' ? JSON.stringify(value) : String(value)))
        )
      );
    this.section.replaceChildren(
      h(
        'div',
        { class: 'ma-overview' },
        h('div', { class: 'ma-overview-col' }, h('h3', {}, 'Job'), facts),
        h(
          'div',
          { class: 'ma-overview-col' },
          h('h3', {}, 'Where each node runs'),
          (job.nodes ?? []).length ? nodes : h('p', { class: 'ma-muted' }, 'Not placed yet.'),
          h('h3', {}, 'Spec'),
          h('table', { class: 'ma-facts ma-spec-table' }, ...specRows)
        )
      )
    );
  }
}
