/**
 * One job in the main area (`data-ma-view="job"`, `data-job-id`), one tab per job: the
 * operations bar, then the Overview, Logs, Events, Resources, TensorBoard and Outputs sections.
 *
 * 1. The job and its new events are polled every `POLL_MS` until it ends; each operation's
 *    button is disabled, with the reason as its tooltip, when the caller's access (the job's
 *    `allowed`, as the service answers it) or the job's state does not allow it; the service
 *    still checks each request, and a refusal is shown as the message.
 * 2. Logs follow one stream (node, or node and rank) by byte offset (logfollower.ts), or, as
 *    the default of a multi-node job, "All nodes": every node's log, lines in arrival order,
 *    each prefixed `[node] `, nodes that appear later included; a large log from its last
 *    `LOG_TAIL_BYTES`, only the newest part kept in the page, scrolled to the newest line
 *    while "follow" is ticked; search shows the matching lines of what is kept; Download
 *    saves the whole stream (all nodes: each node's log in turn, prefixed).
 * 3. Resources reads the service's samples (`GET /jobs/{id}/resources`), newer ones only after
 *    the first read, and draws CPU and memory per node as SVG (and cards' use when the backend
 *    reads it; cards it cannot read are listed as held).
 * 4. TensorBoard is embedded through the Jupyter server's proxy (`/ma-jupyter/tensorboard/<id>/`).
 * 5. Terminal (a job submitted with a debug terminal, running or failed) opens a JupyterLab
 *    terminal tab inside a node's sandbox (debugterminal.ts).
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, InputDialog, showDialog } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { ApiError, api, tensorboardRuns } from './api';
import { lineChart } from './chart';
import { openDebugTerminal } from './debugterminal';
import { dateTime, errorText, h, statusBadge } from './dom';
import { elapsed, span, statusText } from './jobstable';
import { AllNodesFollower, LOG_TAIL_BYTES, LogFollower, isTerminal } from './logfollower';
import type { Event, Job, JobSpec, LogStream, ResourceSample, ResourceUsage } from './models';

/** The log pane's choice of every node's lines, each prefixed with its node. */
const ALL_NODES = '*';

const POLL_MS = 1500;
const RESOURCES_MS = 2000;
const TABS = ['overview', 'logs', 'events', 'resources', 'tensorboard', 'outputs'] as const;
type Tab = (typeof TABS)[number];

/** What the page needs from the rest of the extension. */
export interface JobPageHost {
  app: JupyterFrontEnd;
  /** open the create form filled with `spec` */
  clone: (spec: JobSpec) => void;
}

/** The Lab root as a host folder, or null when the server does not say. */
function labRoot(): string | null {
  const root = PageConfig.getOption('serverRoot');
  return root ? root.replace(/\/+$/, '') : null;
}

/** `folder` relative to the Lab root, or null when it lies outside it. */
export function underLabRoot(folder: string): string | null {
  const root = labRoot();
  if (!root) {
    return null;
  }
  const clean = folder.replace(/\/+$/, '');
  if (clean === root) {
    return '';
  }
  return clean.startsWith(root + '/') ? clean.slice(root.length + 1) : null;
}

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

function megabytes(bytes: number): string {
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

export class JobPageWidget extends Widget {
  job: Job;
  private bar: HTMLElement;
  private message: HTMLElement;
  private sections = new Map<Tab, HTMLElement>();
  private tabButtons = new Map<Tab, HTMLButtonElement>();
  private current: Tab = 'overview';
  private buttons: Record<string, HTMLButtonElement> = {};
  private prediction = '';
  private lastSeq = 0;
  private events: Event[] = [];
  private timer: number | null = null;
  // logs
  private streamSelect: HTMLSelectElement;
  private logPre: HTMLElement;
  private searchPre: HTMLElement;
  private logNote: HTMLElement;
  private tailNote: HTMLElement;
  private search: HTMLInputElement;
  private wrap: HTMLInputElement;
  private followBox: HTMLInputElement;
  private streams: LogStream[] = [];
  private follower: LogFollower | AllNodesFollower | null = null;
  // resources
  private samples: ResourceSample[] = [];
  private usage: ResourceUsage | null = null;
  private resourcesTimer: number | null = null;
  private tensorboardLoaded = false;

  constructor(
    job: Job,
    private readonly host: JobPageHost
  ) {
    super();
    this.job = job;
    this.id = `ma-jupyter-job-${job.id}`;
    this.title.label = job.spec.name;
    this.title.caption = `Training job ${job.id}`;
    this.title.closable = true;
    this.addClass('ma-main');
    this.addClass('ma-job-page');
    this.node.dataset.maView = 'job';
    this.node.dataset.jobId = job.id;
    this.bar = h('div', { class: 'ma-job-head' });
    this.message = h('div', { class: 'ma-message' });
    const op = (key: string, label: string, run: () => Promise<void>, cls = '') => {
      const button = h(
        'button',
        {
          class: `jp-Button jp-mod-styled ma-op ma-op-${key} ${cls}`,
          'data-op': key,
          onclick: () => void this.act(run)
        },
        label
      );
      this.buttons[key] = button;
      return button;
    };
    const ops = h(
      'div',
      { class: 'ma-ops' },
      op('stop', 'Stop', () => this.stop(), 'jp-mod-warn'),
      op('delete', 'Delete', () => this.remove(), 'jp-mod-warn'),
      op('clone', 'Clone', async () => this.host.clone(this.job.spec)),
      op('priority', 'Change priority', () => this.changePriority()),
      op('duration', 'Change duration', () => this.changeDuration()),
      op('devenv', 'Create dev environment', () => this.devenv()),
      op('tensorboard', 'Open TensorBoard', async () => this.showTab('tensorboard')),
      op('terminal', 'Terminal', () => this.terminal())
    );
    const tabs = h('div', { class: 'ma-tabs', role: 'tablist' });
    for (const tab of TABS) {
      const button = h(
        'button',
        { class: 'ma-tab', role: 'tab', 'data-tab': tab, onclick: () => this.showTab(tab) },
        tab === 'tensorboard' ? 'TensorBoard' : tab[0].toUpperCase() + tab.slice(1)
      );
      this.tabButtons.set(tab, button);
      tabs.append(button);
      this.sections.set(tab, h('section', { class: `ma-section ma-section-${tab}`, 'data-section': tab }));
    }
    // logs
    this.streamSelect = h('select', {
      class: 'jp-mod-styled ma-log-stream',
      'aria-label': 'Node and rank',
      onchange: () => this.follow(this.streamSelect.value)
    });
    this.logPre = h('pre', { class: 'ma-log ma-log-main' });
    this.searchPre = h('pre', { class: 'ma-log ma-log-search', hidden: true });
    this.logNote = h('span', { class: 'ma-log-note' });
    this.tailNote = h('span', { class: 'ma-log-note ma-log-tail-note' });
    this.search = h('input', {
      type: 'search',
      class: 'jp-mod-styled ma-log-search-input',
      placeholder: 'Search the log',
      oninput: () => this.applySearch()
    });
    this.wrap = h('input', { type: 'checkbox', class: 'ma-log-wrap', onchange: () => this.applyWrap() });
    this.followBox = h('input', {
      type: 'checkbox',
      class: 'ma-log-follow',
      checked: true,
      onchange: () => {
        if (this.followBox.checked) {
          this.logPre.scrollTop = this.logPre.scrollHeight;
        }
      }
    });
    this.sections.get('logs')!.append(
      h(
        'div',
        { class: 'ma-toolbar' },
        this.streamSelect,
        this.search,
        h('label', { title: 'Keep the newest line in view' }, this.followBox, 'follow'),
        h('label', { title: 'Wrap long lines' }, this.wrap, 'wrap'),
        h('button', { class: 'jp-Button jp-mod-styled ma-log-download', onclick: () => void this.act(() => this.download()) }, 'Download'),
        this.logNote,
        this.tailNote
      ),
      this.logPre,
      this.searchPre
    );
    this.applyWrap();
    this.node.append(this.bar, ops, this.message, tabs, ...this.sections.values());
    this.render();
    this.showTab('overview');
    void this.poll();
    this.timer = window.setInterval(() => void this.poll(), POLL_MS);
  }

  /** Show one section (and start what it needs). */
  showTab(tab: Tab): void {
    this.current = tab;
    for (const [key, section] of this.sections) {
      section.hidden = key !== tab;
      this.tabButtons.get(key)!.classList.toggle('ma-tab-current', key === tab);
      this.tabButtons.get(key)!.setAttribute('aria-selected', String(key === tab));
    }
    if (tab === 'logs' && this.follower === null) {
      void this.updateStreams();
    }
    if (tab === 'resources') {
      void this.loadResources();
      if (this.resourcesTimer === null) {
        this.resourcesTimer = window.setInterval(() => {
          if (this.current === 'resources' && this.isVisible) {
            void this.loadResources();
          }
        }, RESOURCES_MS);
      }
    }
    if (tab === 'tensorboard') {
      void this.act(() => this.loadTensorboard());
    }
    if (tab === 'outputs') {
      void this.act(() => this.loadOutputs());
    }
  }

  private async act(action: () => Promise<void>): Promise<void> {
    this.message.textContent = '';
    this.message.classList.remove('ma-error');
    try {
      await action();
    } catch (error) {
      this.message.textContent = errorText(error);
      this.message.classList.add('ma-error');
    }
  }

  // ------------------------------------------------------------------ polling and overview

  private async poll(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    try {
      const [job, events] = await Promise.all([api.job(this.job.id), api.events(this.job.id, this.lastSeq)]);
      if (this.isDisposed) {
        return;
      }
      this.job = job;
      if (events.length) {
        this.events.push(...events);
        this.lastSeq = events[events.length - 1].seq ?? this.lastSeq;
        const waiting = [...this.events].reverse().find(e => e.status === 'queued' && e.reason);
        this.prediction = waiting?.reason ?? '';
      }
      this.render();
      if (this.current === 'logs') {
        await this.updateStreams();
      }
      if (isTerminal(job) && this.timer !== null) {
        window.clearInterval(this.timer);
        this.timer = null;
      }
    } catch (error) {
      if (error instanceof ApiError && error.kind === 'not_found') {
        this.message.textContent = 'This job no longer exists.';
        this.node.dataset.gone = 'true';
        if (this.timer !== null) {
          window.clearInterval(this.timer);
          this.timer = null;
        }
        return;
      }
      this.message.textContent = errorText(error);
      this.message.classList.add('ma-error');
    }
  }

  private render(): void {
    const job = this.job;
    const status = job.status ?? 'queued';
    this.node.dataset.status = status;
    this.bar.replaceChildren(
      h('h2', { class: 'ma-job-title' }, job.spec.name),
      statusBadge(status),
      h('span', { class: 'ma-job-id' }, job.id),
      h('span', { class: 'ma-job-when' }, elapsed(job) ? `ran ${elapsed(job)}` : statusText(job))
    );
    // the caller's access first (the service says what it may do), then the job's state
    const allowed = new Set(job.allowed ?? []);
    const owner = job.spec.creator ? `${job.spec.creator}’s` : 'another user’s';
    const disable = (key: string, reason: string | null, op: string | null = key) => {
      if (op !== null && job.allowed?.length && !allowed.has(op)) {
        reason =
          op === 'shell'
            ? `a debug terminal is for the job’s owner or an admin (this is ${owner} job)`
            : `this is ${owner} job and it allows others ${job.spec.access ?? 'ro'} access: ask its owner`;
      }
      this.buttons[key].disabled = reason !== null;
      this.buttons[key].title = reason ?? '';
    };
    const ended = isTerminal(job);
    disable('stop', ended ? `the job has ended (${status})` : null);
    disable('delete', null);
    disable('clone', null, 'view');
    disable('priority', status === 'queued' ? null : 'only a queued job’s priority can change');
    disable('duration', ended ? 'only a queued or running job’s duration can change' : null);
    disable('devenv', null, 'view');
    disable('tensorboard', job.outputs_folder || job.spec.outputs ? null : 'the job has no outputs folder');
    disable(
      'terminal',
      !job.spec.debug_terminal
        ? 'the job was submitted without a debug terminal (--debug-terminal)'
        : status === 'running' || status === 'error'
          ? null
          : 'a debug terminal opens while the job runs (or while a failed node keeps its sandbox)',
      'shell'
    );
    if (!this.buttons.delete.disabled) {
      this.buttons.delete.title = ended ? '' : 'Stops the job first, then deletes it';
    }
    this.renderOverview();
    this.renderEvents();
  }

  private renderOverview(): void {
    const job = this.job;
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
      job.status === 'queued' ? row('Queue position', (job.queue_position ?? 0) + 1) : null,
      job.status === 'queued' ? row('Estimated start', estimate(job)) : null,
      job.status === 'queued' ? row('Why it waits', this.prediction || 'waiting for the next admission pass') : null,
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
    // a field left at nothing (null, [], {}, an object of nulls) says nothing: not shown
    const empty = (v: unknown): boolean =>
      v === null ||
      v === undefined ||
      (Array.isArray(v) && v.length === 0) ||
      (typeof v === 'object' && !Array.isArray(v) && Object.values(v as object).every(empty));
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
    this.sections.get('overview')!.replaceChildren(
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

  private renderEvents(): void {
    const section = this.sections.get('events')!;
    if (section.childElementCount === this.events.length + 1) {
      return; // nothing new
    }
    section.replaceChildren(
      h(
        'table',
        { class: 'ma-facts ma-events-table' },
        h('tr', {}, ...['#', 'Time', 'Status', 'Node', 'By', 'Reason'].map(t => h('th', {}, t)))
      ),
      ...[]
    );
    const table = section.firstElementChild as HTMLElement;
    for (const e of this.events) {
      const where = e.node ? (e.rank !== null && e.rank !== undefined ? `${e.node}/rank-${e.rank}` : e.node) : '';
      table.append(
        h(
          'tr',
          { class: e.alert ? 'ma-event-alert' : '' },
          ...[e.seq, dateTime(e.time), e.status, where, e.by ?? '', (e.alert ? 'ALERT: ' : '') + (e.reason ?? '')].map(v =>
            h('td', {}, String(v ?? ''))
          )
        )
      );
    }
  }

  // --------------------------------------------------------------------------------- logs

  private streamKey(s: LogStream): string {
    return s.rank === null || s.rank === undefined ? s.node : `${s.node}/rank-${s.rank}`;
  }

  /** The node logs of the streams (rank null), in the service's order. */
  private nodeNames(): string[] {
    return this.streams.filter(s => s.rank === null || s.rank === undefined).map(s => s.node);
  }

  private async updateStreams(): Promise<void> {
    let streams: LogStream[];
    try {
      streams = await api.logStreams(this.job.id);
    } catch {
      return;
    }
    const key = (s: LogStream) => this.streamKey(s);
    const keys = streams.map(key);
    const changed = keys.join('|') !== this.streams.map(key).join('|');
    this.streams = streams; // their sizes too: a stream chosen later starts at its tail
    // a job of several nodes opens on every node's lines, each prefixed with its node
    const several = this.nodeNames().length > 1 || (this.job.nodes ?? []).length > 1;
    const options = several ? [ALL_NODES, ...keys] : keys;
    if (changed) {
      const chosen = this.streamSelect.value;
      this.streamSelect.replaceChildren(
        ...(several ? [h('option', { value: ALL_NODES }, 'All nodes')] : []),
        ...streams.map(s =>
          h('option', { value: key(s) }, s.rank === null || s.rank === undefined ? `${s.node} (all ranks)` : `${s.node} · rank ${s.rank}`)
        )
      );
      if (options.includes(chosen)) {
        this.streamSelect.value = chosen;
      }
    }
    if (this.follower instanceof AllNodesFollower) {
      for (const node of this.nodeNames()) {
        this.follower.addNode(node); // a node that appeared later, from its start
      }
    }
    if (this.follower === null && options.length) {
      this.follow(this.streamSelect.value || options[0]);
    } else if (!options.length) {
      this.logNote.textContent = 'no log yet: the job has not started';
    }
  }

  /** Where a stream of the page starts: a large log at its tail (Download has the rest). */
  private startAt(key: string): number {
    const size = this.streams.find(s => this.streamKey(s) === key)?.size ?? 0;
    return size > LOG_TAIL_BYTES ? size - LOG_TAIL_BYTES : 0;
  }

  private follow(key: string): void {
    this.follower?.cancel();
    this.logPre.textContent = '';
    this.logPre.dataset.stream = key;
    delete this.logPre.dataset.eof;
    const options = {
      stick: () => this.followBox.checked,
      onProblem: (text: string) => {
        this.logNote.textContent = text;
      },
      onUpdate: () => {
        if (this.search.value) {
          this.applySearch();
        }
      }
    };
    if (key === ALL_NODES) {
      const nodes = this.nodeNames().map(node => ({ node, startAt: this.startAt(node) }));
      this.logPre.dataset.startAt = String(Math.max(0, ...nodes.map(n => n.startAt)));
      this.tailNote.textContent = nodes.some(n => n.startAt)
        ? 'showing the end of large logs: Download saves all of a node\'s log'
        : '';
      this.follower = new AllNodesFollower(this.job.id, nodes, this.logPre, options);
      return;
    }
    const [node, rank] = key.split('/rank-');
    // a large log starts at its tail: the page stays responsive, Download has the rest
    const size = this.streams.find(s => this.streamKey(s) === key)?.size ?? 0;
    const startAt = this.startAt(key);
    this.logPre.dataset.startAt = String(startAt);
    this.tailNote.textContent = startAt
      ? `showing the end of a ${megabytes(size)} log: Download saves all of it`
      : '';
    this.follower = new LogFollower(
      this.job.id,
      { node, rank: rank === undefined ? null : Number(rank) },
      this.logPre,
      { startAt, ...options }
    );
  }

  private applySearch(): void {
    const term = this.search.value;
    this.searchPre.hidden = !term;
    this.logPre.hidden = Boolean(term);
    if (!term) {
      return;
    }
    const lower = term.toLowerCase();
    const lines = (this.follower?.text() ?? '').split('\n').filter(l => l.toLowerCase().includes(lower));
    this.searchPre.textContent = lines.length ? lines.join('\n') : `no line contains “${term}”`;
    this.logNote.textContent = `${lines.length} matching line${lines.length === 1 ? '' : 's'}`;
  }

  private applyWrap(): void {
    for (const pre of [this.logPre, this.searchPre]) {
      pre.classList.toggle('ma-log-wrapped', this.wrap.checked);
    }
  }

  /** Save the whole stream shown (read from the service, not what the page keeps). */
  private async download(): Promise<void> {
    const key = this.streamSelect.value;
    if (!key) {
      throw new Error('no log to download yet');
    }
    const parts: string[] = [];
    // "All nodes": each node's whole log in turn, every line prefixed with its node
    for (const stream of key === ALL_NODES ? this.nodeNames() : [key]) {
      const [node, rank] = stream.split('/rank-');
      const text: string[] = [];
      let offset = 0;
      for (;;) {
        const chunk = await api.readLog(this.job.id, { node, rank: rank === undefined ? null : Number(rank) }, offset, 0);
        text.push(chunk.data ?? '');
        if (chunk.next_offset === offset || !chunk.data) {
          break;
        }
        offset = chunk.next_offset;
      }
      parts.push(key === ALL_NODES ? text.join('').replace(/^(?=.)/gm, `[${node}] `) : text.join(''));
    }
    const link = h('a', {
      href: URL.createObjectURL(new Blob(parts, { type: 'text/plain' })),
      download: `${this.job.id}-${key === ALL_NODES ? 'all-nodes' : key.replace('/', '-')}.log`
    });
    link.click();
    URL.revokeObjectURL(link.href);
  }

  // ---------------------------------------------------------------------------- resources

  private async loadResources(): Promise<void> {
    const section = this.sections.get('resources')!;
    try {
      const since = this.samples.length ? this.samples[this.samples.length - 1].t : undefined;
      const usage = await api.resources(this.job.id, since);
      this.usage = usage;
      this.samples.push(...(usage.samples ?? []));
    } catch (error) {
      section.replaceChildren(h('p', { class: 'ma-error' }, `Cannot read the samples: ${errorText(error)}`));
      return;
    }
    const usage = this.usage!;
    const limits = usage.nodes ?? [];
    const cpuLimit = limits.length && limits[0].cpus ? limits[0].cpus * 100 : null;
    const memLimit = limits.length && limits[0].memory_mb ? limits[0].memory_mb : null;
    const width = Math.max(480, Math.min(1100, section.clientWidth - 24 || 760));
    const note = this.samples.length
      ? `${this.samples.length} samples, every ${usage.interval} s while the job runs (older ones thinned out).`
      : isTerminal(this.job)
        ? 'No samples: the job did not run long enough, or its backend cannot sample (Ray).'
        : `No samples yet: the service samples running jobs every ${usage.interval} s.`;
    const cards = this.samples.some(s => s.card_percent !== null && s.card_percent !== undefined);
    const cardMemory = this.samples.some(s => s.card_memory_mb !== null && s.card_memory_mb !== undefined);
    const held = limits.filter(l => l.cards);
    // cards whose use the backend cannot read (emulated ones: no device behind them) are listed
    // as held, never drawn as a flat 0 %
    const cardNote =
      held.length && !cards
        ? h(
            'p',
            { class: 'ma-muted ma-cards-note' },
            `Cards held: ${held.map(l => `${l.node} ${l.cards}`).join(', ')}. Their use is not sampled: ` +
              'the cards of this cluster are emulated, with no device to read.'
          )
        : null;
    section.replaceChildren(
      h('p', { class: 'ma-muted ma-resources-note' }, note),
      ...(cardNote ? [cardNote] : []),
      lineChart('CPU per node (100% = one core)', '%', this.samples, s => s.cpu_percent, cpuLimit, width),
      lineChart('Resident memory per node', 'MB', this.samples, s => s.memory_mb, memLimit, width),
      ...(cards ? [lineChart('Cards per node', '%', this.samples, s => s.card_percent ?? 0, 100, width)] : []),
      ...(cardMemory
        ? [lineChart('Card memory per node', 'MB', this.samples, s => s.card_memory_mb ?? 0, null, width)]
        : [])
    );
    section.dataset.samples = String(this.samples.length);
  }

  // -------------------------------------------------------------------------- tensorboard

  private async loadTensorboard(): Promise<void> {
    const section = this.sections.get('tensorboard')!;
    if (this.tensorboardLoaded) {
      return;
    }
    if (this.buttons.tensorboard.disabled) {
      section.replaceChildren(h('p', { class: 'ma-muted' }, this.buttons.tensorboard.title));
      return;
    }
    section.replaceChildren(h('p', { class: 'ma-muted' }, 'Starting TensorBoard…'));
    const { url } = await api.tensorboard(this.job.id);
    this.tensorboardLoaded = true;
    const folder = this.job.outputs_folder ?? this.job.spec.outputs;
    // TensorBoard shows a blank page over a folder without event files: say so instead, and
    // show the board once the job writes some (asked again while the tab is open)
    // a board just started may not have read the folder yet: ask a few times before saying so
    let runs = await tensorboardRuns(this.job.id);
    for (let i = 0; i < 4 && runs !== null && runs.length === 0; i++) {
      await new Promise(resolve => window.setTimeout(resolve, 1500));
      runs = await tensorboardRuns(this.job.id);
    }
    if (runs !== null && runs.length === 0) {
      this.tensorboardLoaded = false; // opening the tab again asks again
      section.replaceChildren(
        h(
          'div',
          { class: 'ma-tb-empty', 'data-ma-tb-empty': '' },
          h('p', {}, `No TensorBoard event files in ${folder}${isTerminal(this.job) ? '' : ' yet'}.`),
          h(
            'p',
            { class: 'ma-muted' },
            'TensorBoard draws what a job logs with tf.summary, torch.utils.tensorboard.SummaryWriter, ' +
              "Keras' TensorBoard callback or Lightning's TensorBoardLogger, written under /workspace/outputs " +
              '(the job\'s outputs folder). ' +
              (isTerminal(this.job)
                ? 'This job ended without writing any there.'
                : 'This page shows the board as soon as the job writes some.')
          ),
          h('a', { href: url, target: '_blank', rel: 'noopener', class: 'ma-tb-link' }, 'Open TensorBoard anyway')
        )
      );
      if (!isTerminal(this.job)) {
        window.setTimeout(() => {
          if (!this.isDisposed && section.isConnected && section.querySelector('[data-ma-tb-empty]')) {
            void this.loadTensorboard();
          }
        }, 10000);
      }
      return;
    }
    section.replaceChildren(
      h(
        'div',
        { class: 'ma-toolbar' },
        h('span', { class: 'ma-muted' }, `TensorBoard over ${this.job.outputs_folder ?? this.job.spec.outputs}`),
        h('a', { href: url, target: '_blank', rel: 'noopener', class: 'ma-tb-link' }, 'Open in a new browser tab')
      ),
      h('iframe', { class: 'ma-tensorboard', src: url, title: `TensorBoard of ${this.job.id}` })
    );
  }

  // ------------------------------------------------------------------------------ outputs

  private async loadOutputs(): Promise<void> {
    const section = this.sections.get('outputs')!;
    const folder = this.job.outputs_folder ?? this.job.spec.outputs;
    if (!folder) {
      section.replaceChildren(h('p', { class: 'ma-muted' }, 'The job has no outputs folder.'));
      return;
    }
    const relative = underLabRoot(folder);
    if (relative === null) {
      section.replaceChildren(
        h('p', {}, 'Outputs folder: ', h('code', {}, folder)),
        h('p', { class: 'ma-muted' }, 'It lies outside the folder JupyterLab serves, so Lab cannot list or open its files.')
      );
      return;
    }
    const contents = this.host.app.serviceManager.contents;
    let listing;
    try {
      listing = await contents.get(relative, { content: true });
    } catch (error) {
      section.replaceChildren(h('p', {}, 'Outputs folder: ', h('code', {}, folder)), h('p', { class: 'ma-muted' }, `Nothing there yet (${errorText(error)}).`));
      return;
    }
    const items = (listing.content ?? []) as Array<{ name: string; path: string; type: string; size?: number; last_modified?: string }>;
    section.replaceChildren(
      h(
        'div',
        { class: 'ma-toolbar' },
        h('span', {}, 'Outputs folder: ', h('code', {}, folder)),
        h(
          'button',
          {
            class: 'jp-Button jp-mod-styled ma-open-folder',
            onclick: () => void this.host.app.commands.execute('filebrowser:go-to-path', { path: '/' + relative })
          },
          'Show in the file browser'
        ),
        h('button', { class: 'jp-Button jp-mod-styled', onclick: () => void this.act(() => this.loadOutputs()) }, 'Refresh')
      ),
      items.length
        ? h(
            'table',
            { class: 'ma-facts ma-outputs-table' },
            h('tr', {}, ...['Name', 'Kind', 'Size', 'Modified'].map(t => h('th', {}, t))),
            ...items.map(item =>
              h(
                'tr',
                { 'data-path': item.path },
                h(
                  'td',
                  {},
                  h(
                    'a',
                    {
                      href: '#',
                      onclick: (e: globalThis.Event) => {
                        e.preventDefault();
                        void this.host.app.commands.execute(
                          item.type === 'directory' ? 'filebrowser:go-to-path' : 'docmanager:open',
                          { path: item.type === 'directory' ? '/' + item.path : item.path }
                        );
                      }
                    },
                    item.name
                  )
                ),
                h('td', {}, item.type),
                h('td', {}, item.size === undefined || item.size === null ? '' : `${item.size} B`),
                h('td', {}, dateTime(item.last_modified))
              )
            )
          )
        : h('p', { class: 'ma-muted' }, 'The folder is empty.')
    );
  }

  // --------------------------------------------------------------------------- operations

  private async stop(): Promise<void> {
    const answer = await showDialog({
      title: `Stop ${this.job.spec.name}?`,
      body: 'Its nodes get SIGTERM, then SIGKILL after the grace period. Logs and outputs stay.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
    });
    if (!answer.button.accept) {
      return;
    }
    this.job = await api.stop(this.job.id);
    this.render();
  }

  private async remove(): Promise<void> {
    const running = !isTerminal(this.job);
    const answer = await showDialog({
      title: `Delete ${this.job.spec.name}?`,
      body: running
        ? 'The job still runs: it will be stopped first. Its logs and job folder are removed.'
        : 'Its logs and job folder are removed.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: running ? 'Stop and delete' : 'Delete' })]
    });
    if (!answer.button.accept) {
      return;
    }
    await api.remove(this.job.id, running);
    this.dispose();
  }

  private async ask(title: string, label: string, input: HTMLInputElement | HTMLSelectElement): Promise<string | null> {
    const body = new Widget({ node: h('label', { class: 'ma-dialog-field' }, label, input) });
    const answer = await showDialog({ title, body, buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Change' })] });
    return answer.button.accept ? input.value : null;
  }

  private async changePriority(): Promise<void> {
    const select = h(
      'select',
      { class: 'jp-mod-styled ma-priority-select' },
      ...['normal', 'urgent', 'very-urgent'].map(p => h('option', { value: p }, p))
    );
    select.value = this.job.spec.priority ?? 'normal';
    const value = await this.ask(`Priority of ${this.job.spec.name}`, 'Priority ', select);
    if (value !== null) {
      this.job = await api.update(this.job.id, { priority: value });
      this.render();
      this.message.textContent = `Priority set to ${value}; queue position ${(this.job.queue_position ?? 0) + 1}.`;
    }
  }

  private async changeDuration(): Promise<void> {
    const input = h('input', {
      class: 'jp-mod-styled ma-duration-input',
      placeholder: 'seconds, or 30m, 2h, 1d',
      value: this.job.spec.duration ? String(this.job.spec.duration) : ''
    });
    const value = await this.ask(`Duration of ${this.job.spec.name}`, 'Duration ', input);
    if (value !== null && value.trim()) {
      this.job = await api.update(this.job.id, { duration: value.trim() });
      this.render();
      this.message.textContent = `Duration set to ${span(this.job.spec.duration ?? 0)}.`;
    }
  }

  /** A terminal tab inside a node's sandbox (the node asked for when the job has several). */
  private async terminal(): Promise<void> {
    const nodes = (this.job.nodes ?? []).map(n => n.name);
    let node = nodes[0] ?? 'worker-0';
    if (nodes.length > 1) {
      const picked = await InputDialog.getItem({ title: 'Debug terminal of node', items: nodes, current: 0 });
      if (!picked.button.accept || !picked.value) {
        return;
      }
      node = picked.value;
    }
    await openDebugTerminal(this.host.app, this.job.id, node);
    this.message.textContent = `Opened the debug terminal of ${node} in a tab.`;
  }

  /** Ask the service for the job as a notebook, save it at the Lab root and open it. */
  private async devenv(): Promise<void> {
    let answer: { name: string; notebook: any };
    try {
      answer = await api.devenv(this.job.id);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404 && error.message.startsWith('no such route')) {
        throw new Error('This job service cannot create dev environments yet (GET /jobs/{id}/devenv is missing): update ma_jupyter.');
      }
      throw error;
    }
    const contents = this.host.app.serviceManager.contents;
    const stem = answer.name.replace(/\.ipynb$/, '').replace(/[^\w.-]+/g, '_') || this.job.id;
    let path = `${stem}.ipynb`;
    for (let n = 1; ; n++) {
      try {
        await contents.get(path, { content: false });
        path = `${stem}-${n}.ipynb`; // never overwrite a notebook
      } catch {
        break;
      }
    }
    await contents.save(path, { type: 'notebook', format: 'json', content: answer.notebook });
    await this.host.app.commands.execute('docmanager:open', { path });
    this.message.textContent = `Saved and opened ${path}.`;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.follower?.cancel();
    if (this.timer !== null) {
      window.clearInterval(this.timer);
    }
    if (this.resourcesTimer !== null) {
      window.clearInterval(this.resourcesTimer);
    }
    super.dispose();
  }
}

