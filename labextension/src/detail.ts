/**
 * One job: status, facts, events, and its logs streamed per node and per rank, with the Stop,
 * Delete, Clone and TensorBoard actions. Logs follow the service's long-poll by byte offset, so
 * nothing is lost or repeated; events are fetched after the last sequence number seen.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';

import { ApiError, api } from './api';
import { errorText, h, shortTime, statusBadge } from './dom';
import type { Event, Job, JobSpec, LogStream } from './models';
import type { View } from './view';

const POLL_MS = 1500;
const LOG_WAIT_S = 10;
const LOG_KEEP_CHARS = 400_000;

const TERMINAL = new Set(['error', 'stopped', 'expired', 'succeeded']);

/** Whether a job's status can change no more. */
export function isTerminal(job: Job): boolean {
  return TERMINAL.has(job.status ?? 'queued');
}

function streamKey(stream: { node: string; rank?: number | null }): string {
  return stream.rank === null || stream.rank === undefined
    ? stream.node
    : `${stream.node}/rank-${stream.rank}`;
}

/**
 * What a terminal shows of one log line, the rule of `render.visible_line` in Python: `\r`
 * goes back to the line start and `\b` one character back, and what follows overwrites (a
 * progress bar shows its last state).
 */
export function visibleLine(line: string): string {
  if (!line.includes('\r') && !line.includes('\b')) {
    return line;
  }
  const chars: string[] = [];
  let column = 0;
  for (const char of line) {
    if (char === '\r') {
      column = 0;
    } else if (char === '\b') {
      column = Math.max(0, column - 1);
    } else {
      if (column < chars.length) {
        chars[column] = char;
      } else {
        chars.push(char);
      }
      column += 1;
    }
  }
  return chars.join('');
}

/** Follows one log stream into a <pre> until the job ends or it is cancelled. */
export class LogFollower {
  private controller = new AbortController();
  private offset = 0;
  private stopped = false;
  /** the finished lines shown, each as `visibleLine` made it */
  private shown = '';
  /** the raw text after the last newline (a progress bar being drawn) */
  private partial = '';

  constructor(
    private readonly jobId: string,
    private readonly stream: { node: string; rank: number | null },
    private readonly pre: HTMLElement,
    private readonly onProblem: (text: string) => void,
    private readonly onUpdate: (() => void) | null = null
  ) {
    void this.run();
  }

  /** The text shown so far (its newest `LOG_KEEP_CHARS` characters). */
  text(): string {
    return this.shown + visibleLine(this.partial);
  }

  private append(text: string): void {
    const stick = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 8;
    const raw = this.partial + text;
    const cut = raw.lastIndexOf('\n');
    if (cut >= 0) {
      this.shown += raw
        .slice(0, cut)
        .split('\n')
        .map(line => visibleLine(line) + '\n')
        .join('');
      if (this.shown.length > LOG_KEEP_CHARS) {
        this.shown = this.shown.slice(this.shown.length - LOG_KEEP_CHARS);
      }
    }
    this.partial = raw.slice(cut + 1);
    this.pre.textContent = this.shown + visibleLine(this.partial);
    if (stick) {
      this.pre.scrollTop = this.pre.scrollHeight;
    }
    this.onUpdate?.();
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      try {
        const chunk = await api.readLog(
          this.jobId,
          this.stream,
          this.offset,
          LOG_WAIT_S,
          this.controller.signal
        );
        if (this.stopped) {
          return;
        }
        if (chunk.data) {
          this.append(chunk.data);
        }
        this.offset = chunk.next_offset;
        this.onProblem('');
        if (chunk.eof) {
          this.pre.dataset.eof = 'true';
          return;
        }
      } catch (error) {
        if (this.stopped) {
          return;
        }
        // a node that has not started has no log yet: say so and try again shortly
        this.onProblem(
          error instanceof ApiError && error.kind === 'not_found'
            ? 'waiting for the log to appear…'
            : `log: ${errorText(error)}`
        );
        await new Promise(resolve => window.setTimeout(resolve, 1000));
      }
    }
  }

  cancel(): void {
    this.stopped = true;
    this.controller.abort();
  }
}

export class JobDetailView implements View {
  readonly node: HTMLElement;
  private job: Job;
  private header: HTMLElement;
  private facts: HTMLElement;
  private eventsList: HTMLElement;
  private streamSelect: HTMLSelectElement;
  private logPre: HTMLElement;
  private logNote: HTMLElement;
  private message: HTMLElement;
  private buttons: Record<'stop' | 'remove' | 'clone' | 'tensorboard', HTMLButtonElement>;
  private lastSeq = 0;
  private follower: LogFollower | null = null;
  private streams: LogStream[] = [];
  private timer: number | null = null;
  private disposed = false;

  constructor(
    job: Job,
    private readonly back: () => void,
    private readonly clone: (spec: JobSpec) => void
  ) {
    this.job = job;
    this.header = h('div', { class: 'ma-detail-header' });
    this.facts = h('table', { class: 'ma-facts' });
    this.eventsList = h('ol', { class: 'ma-events' });
    this.streamSelect = h('select', {
      class: 'ma-log-stream jp-mod-styled',
      onchange: () => this.follow(this.streamSelect.value)
    });
    this.logPre = h('pre', { class: 'ma-log' });
    this.logNote = h('div', { class: 'ma-log-note' });
    this.message = h('div', { class: 'ma-message' });
    const button = (cls: string, label: string, title: string, action: () => Promise<void>) =>
      h(
        'button',
        {
          class: `jp-Button jp-mod-styled ma-action ma-${cls}`,
          title,
          onclick: () => void this.act(action)
        },
        label
      );
    this.buttons = {
      stop: button('stop', 'Stop', 'Stop the job (SIGTERM, then SIGKILL after its grace period)', () =>
        this.stop()
      ),
      remove: button('delete', 'Delete', 'Delete the job and its files', () => this.remove()),
      clone: button('clone', 'Clone', 'Open the form with this job’s settings', async () =>
        this.clone(this.job.spec)
      ),
      tensorboard: button('tensorboard', 'TensorBoard', 'Open TensorBoard over the job’s outputs', () =>
        this.tensorboard()
      )
    };
    this.node = h(
      'div',
      { class: 'ma-detail', 'data-job-id': job.id },
      h('button', { class: 'jp-Button jp-mod-minimal ma-back', onclick: () => this.back() }, '← Jobs'),
      this.header,
      h(
        'div',
        { class: 'ma-actions' },
        this.buttons.stop,
        this.buttons.remove,
        this.buttons.clone,
        this.buttons.tensorboard
      ),
      this.message,
      this.facts,
      h('h3', {}, 'Logs'),
      h('div', { class: 'ma-log-bar' }, this.streamSelect, this.logNote),
      this.logPre,
      h('h3', {}, 'Events'),
      this.eventsList
    );
    this.render();
    void this.poll();
    this.timer = window.setInterval(() => void this.poll(), POLL_MS);
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

  private async stop(): Promise<void> {
    this.buttons.stop.disabled = true;
    this.job = await api.stop(this.job.id);
    this.render();
    await this.poll();
  }

  private async remove(): Promise<void> {
    const running = !isTerminal(this.job);
    const answer = await showDialog({
      title: `Delete ${this.job.spec.name}?`,
      body: running
        ? 'The job still runs: it will be stopped first. Its logs and files are removed.'
        : 'Its logs and files are removed.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: running ? 'Stop and delete' : 'Delete' })]
    });
    if (!answer.button.accept) {
      return;
    }
    await api.remove(this.job.id, running);
    this.back();
  }

  private async tensorboard(): Promise<void> {
    const { url } = await api.tensorboard(this.job.id);
    this.message.replaceChildren(
      'TensorBoard: ',
      h('a', { href: url, target: '_blank', rel: 'noopener' }, url)
    );
    window.open(url, '_blank', 'noopener');
  }

  /** Refresh the job, new events and the list of log streams. */
  private async poll(): Promise<void> {
    if (this.disposed) {
      return;
    }
    try {
      const [job, events] = await Promise.all([
        api.job(this.job.id),
        api.events(this.job.id, this.lastSeq)
      ]);
      if (this.disposed) {
        return;
      }
      this.job = job;
      this.addEvents(events);
      this.render();
      await this.updateStreams();
      if (isTerminal(job) && this.timer !== null) {
        // one last round above caught the final events; nothing changes any more
        window.clearInterval(this.timer);
        this.timer = null;
      }
    } catch (error) {
      if (error instanceof ApiError && error.kind === 'not_found') {
        this.message.textContent = 'This job no longer exists.';
        if (this.timer !== null) {
          window.clearInterval(this.timer);
          this.timer = null;
        }
      } else {
        this.message.textContent = errorText(error);
      }
      this.message.classList.add('ma-error');
    }
  }

  private addEvents(events: Event[]): void {
    for (const event of events) {
      this.lastSeq = Math.max(this.lastSeq, event.seq ?? 0);
      const where = [event.node, event.rank !== null && event.rank !== undefined ? `rank ${event.rank}` : '']
        .filter(Boolean)
        .join(' ');
      this.eventsList.append(
        h(
          'li',
          { class: 'ma-event' },
          h('span', { class: 'ma-event-time' }, shortTime(event.time)),
          ' ',
          statusBadge(event.status),
          ' ',
          where ? h('span', { class: 'ma-event-where' }, `[${where}] `) : null,
          event.reason
        )
      );
    }
  }

  private async updateStreams(): Promise<void> {
    let streams: LogStream[];
    try {
      streams = await api.logStreams(this.job.id);
    } catch {
      return; // no logs yet (queued job)
    }
    const keys = streams.map(streamKey);
    if (keys.join('|') === this.streams.map(streamKey).join('|') && this.follower) {
      return;
    }
    const current = this.streamSelect.value;
    this.streams = streams;
    this.streamSelect.replaceChildren(
      ...streams.map(s =>
        h(
          'option',
          { value: streamKey(s) },
          s.rank === null || s.rank === undefined ? `${s.node} (all ranks)` : `${s.node} rank ${s.rank}`
        )
      )
    );
    // the stream shown first is the job's first primary node: the chief when there is one
    const primary = (this.job.nodes ?? []).find(node => node.primary !== false)?.name;
    if (current && keys.includes(current)) {
      this.streamSelect.value = current;
    } else if (primary && keys.includes(primary)) {
      this.streamSelect.value = primary;
    }
    if (!this.follower && streams.length > 0) {
      this.follow(this.streamSelect.value || keys[0]);
    }
  }

  private follow(key: string): void {
    const stream = this.streams.find(s => streamKey(s) === key);
    if (!stream) {
      return;
    }
    this.follower?.cancel();
    this.logPre.textContent = '';
    delete this.logPre.dataset.eof;
    this.follower = new LogFollower(
      this.job.id,
      { node: stream.node, rank: stream.rank ?? null },
      this.logPre,
      text => (this.logNote.textContent = text)
    );
  }

  private render(): void {
    const job = this.job;
    const spec = job.spec;
    this.node.dataset.status = job.status ?? 'queued';
    this.header.replaceChildren(
      h('h2', { class: 'ma-detail-name' }, spec.name),
      statusBadge(job.status),
      h('div', { class: 'ma-detail-id' }, job.id)
    );
    const terminal = isTerminal(job);
    this.buttons.stop.disabled = terminal;
    // TensorBoard reads the job's outputs folder (every job has one: its own or a default)
    const outputs = job.outputs_folder ?? spec.outputs;
    this.buttons.tensorboard.disabled = !outputs;
    this.buttons.tensorboard.title = outputs
      ? `Open TensorBoard over ${outputs}`
      : 'The job has no outputs folder for TensorBoard to read';
    const rows: Array<[string, string]> = [
      ['Reason', job.reason ?? ''],
      ['Mode', `${spec.mode ?? 'single'} × ${spec.nodes ?? 1} node(s)${spec.ps ? ` + ${spec.ps} ps` : ''}`],
      ['Spec', job.chosen_spec ?? (spec.specs ?? []).join(', ')],
      ['Command', spec.command ?? ''],
      ['Priority', spec.priority ?? 'normal'],
      ['Queue position', job.queue_position !== null && job.queue_position !== undefined ? String(job.queue_position) : ''],
      ['Created', shortTime(job.created_at)],
      ['Started', shortTime(job.started_at)],
      ['Finished', shortTime(job.finished_at)],
      ['Exit code', job.exit_code !== null && job.exit_code !== undefined ? String(job.exit_code) : ''],
      ['Nodes', (job.nodes ?? []).map(n => `${n.name}: ${n.state}`).join(', ')],
      ['Workspace', job.workspace_isolation ?? '']
    ];
    this.facts.replaceChildren(
      ...rows
        .filter(([, value]) => value !== '')
        .map(([label, value]) => h('tr', {}, h('th', {}, label), h('td', {}, value)))
    );
  }

  dispose(): void {
    this.disposed = true;
    this.follower?.cancel();
    if (this.timer !== null) {
      window.clearInterval(this.timer);
    }
  }
}
