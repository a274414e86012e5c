/**
 * The job page's Overview tab: the job's facts (status, queue position, estimated start and
 * why it waits while queued, times, limits, exit code, attempt, outputs, backend), where each
 * node runs, and what it runs, in words (`table.ma-spec-table`, a row per `data-field`):
 *
 * 1. The code folder is the user's (`algorithm_origin`, the folder the client shipped), not the
 *    snapshot the job runs from, which is named in its tooltip; fields the service fills in for
 *    itself (`algorithm_digest`, `creator`) are not rows.
 * 2. A field left at its default or at nothing is not a row; a secret's value is never shown.
 * 3. The whole spec stays one click away, folded (`details.ma-spec-raw`, the secrets as ***).
 */
import { h } from './dom';
import { dateTime, span } from './format';
import { elapsed, statusText } from './jobstate';
import { JobTab, type JobPage } from './jobpage-tab';
import type { Job, JobSpec } from './models';

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

/** The secrets' names, each value as `***`. */
function hideSecrets(secrets: Record<string, string> | undefined): Record<string, string> | undefined {
  return secrets && Object.fromEntries(Object.keys(secrets).map(k => [k, '***']));
}

/** What the spec says the job runs, a row per field that says something (rules 1 and 2). */
function specOverview(spec: JobSpec): HTMLElement[] {
  const rows: HTMLElement[] = [];
  const add = (field: string, label: string, value: unknown, title?: string) => {
    if (empty(value) || value === '' || value === false) {
      return;
    }
    const text = Array.isArray(value) ? value.join('\n') : String(value);
    rows.push(
      h('tr', { 'data-field': field }, h('th', {}, label), h('td', title ? { title } : {}, h('code', {}, text)))
    );
  };
  const snapshot = spec.algorithm_origin && spec.algorithm && spec.algorithm !== spec.algorithm_origin;
  add(
    'algorithm',
    'Code folder',
    spec.algorithm
      ? `${spec.algorithm_origin ?? spec.algorithm}${spec.algorithm_read_only === false ? ' (writable)' : ''}`
      : null,
    snapshot ? `runs from a snapshot of it taken at submission: ${spec.algorithm}` : undefined
  );
  add('command', 'Command', spec.command);
  add('tasks', 'Batch tasks', (spec.tasks ?? []).map(t => (t.algorithm ? `${t.algorithm}: ${t.command}` : t.command)));
  add('workdir', 'Working directory', spec.workdir);
  add('specs', 'Specs', (spec.specs ?? []).join(', '));
  const mode = `${spec.mode ?? 'single'} × ${spec.nodes ?? 1} node${(spec.nodes ?? 1) === 1 ? '' : 's'}`;
  add(
    'mode',
    'Mode',
    mode + (spec.ps ? `, ${spec.ps} parameter server(s)` : '') + (spec.chief ? ', a chief' : '')
  );
  add('node_name', 'On node', spec.node_name);
  add('outputs', 'Outputs folder', spec.outputs);
  const mounts = (list: Array<{ name: string; path: string; version?: string | null }> | undefined) =>
    (list ?? []).map(m => `${m.name}${m.version ? `@${m.version}` : ''} = ${m.path}`);
  add('datasets', 'Datasets', mounts(spec.datasets));
  add('models', 'Models', mounts(spec.models));
  add('volumes', 'Volumes', mounts(spec.volumes));
  add('annotations', 'Annotations', mounts(spec.annotations));
  const image = spec.image ?? {};
  add('image', 'Interpreter', [image.name && `registered image ${image.name}`, image.python, image.venv && `venv ${image.venv}`, image.conda_env && `conda ${image.conda_env}`].filter(Boolean).join(', '));
  add('env', 'Environment', Object.entries(spec.env ?? {}).map(([k, v]) => `${k}=${v}`));
  add('secret_env', 'Secret environment', Object.keys(spec.secret_env ?? {}).map(k => `${k}=***`));
  add('priority', 'Priority', spec.priority !== 'normal' ? spec.priority : null);
  add('type', 'Type', spec.type !== 'regular' ? spec.type : null);
  add('access', 'Other users may', { rw: 'read and change it', ro: 'read it', none: 'not see it' }[spec.access ?? 'ro']);
  add('fault_restart', 'Restart on failure', spec.fault_restart ? `up to ${spec.fault_restart.max_restarts ?? 3} times` : null);
  add(
    'checkpoint_resume',
    'Resume from checkpoint',
    spec.checkpoint_resume ? `up to ${spec.checkpoint_resume.max_resumes ?? 3} times` : null
  );
  add('lifecycle', 'On start / on stop', [spec.lifecycle?.on_start, spec.lifecycle?.on_stop].map(c => c ?? '—').join(' / ').replace(/^— \/ —$/, ''));
  add('debug_terminal', 'Debug terminal', spec.debug_terminal ? 'kept' : null);
  add('data_preparation', 'Prepares data first', spec.data_preparation ? 'yes' : null);
  return rows;
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
    const specRows = specOverview(spec);
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
          h('h3', {}, 'What it runs'),
          h('table', { class: 'ma-facts ma-spec-table' }, ...specRows),
          h(
            'details',
            { class: 'ma-spec-raw' },
            h('summary', {}, 'Whole spec (JSON)'),
            h('pre', {}, JSON.stringify({ ...spec, secret_env: hideSecrets(spec.secret_env) }, null, 2))
          )
        )
      )
    );
  }
}
