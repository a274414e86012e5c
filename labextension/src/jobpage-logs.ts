/**
 * The job page's Logs tab.
 *
 * 1. It follows one stream (node, or node and rank) by byte offset (logfollower.ts), or, as the
 *    default of a multi-node job, "All nodes": every node's log, lines merged by time, each
 *    prefixed with its time and `[node] ` (logmerge.ts says which time), nodes that appear
 *    later included.
 * 2. A large log is followed from its last `LOG_TAIL_BYTES` (said in the tail note), only the
 *    newest part kept in the page, scrolled to the newest line while "follow" is ticked.
 * 3. Search shows the matching lines of what the page keeps; "wrap" wraps long lines.
 * 4. Download saves the whole stream, read again from the service (all nodes: merged by time
 *    as the pane shows them).
 * 5. The list of streams is read when the tab is first shown and after every poll while it is
 *    current; the stream chosen stays chosen while it exists.
 * 6. A line still being written (a progress bar redrawn with `\r`) shows as it stands under the
 *    finished lines, replaced in place, one per node, and, while the job runs, one per rank of
 *    the nodes shown (read from each rank's own log: the rank splitter gives the node log a
 *    redrawn line whole, at its newline).
 */
import { api } from './api';
import { h } from './dom';
import { megabytes } from './format';
import { JobTab, type JobPage } from './jobpage-tab';
import { AllNodesFollower, LOG_TAIL_BYTES, LogFollower, visibleLine } from './logfollower';
import { MergedLog } from './logmerge';
import type { LogStream } from './models';

/** A whole log's lines as the pane shows them (a last line without its newline included). */
function logLines(text: string): string[] {
  const lines = text.split('\n');
  if (lines[lines.length - 1] === '') {
    lines.pop();
  }
  return lines.map(visibleLine);
}

/** The log pane's choice of every node's lines, each prefixed with its node. */
const ALL_NODES = '*';

/** A stream's key in the stream select: `node`, or `node/rank-N`. */
function streamKey(s: LogStream): string {
  return s.rank === null || s.rank === undefined ? s.node : `${s.node}/rank-${s.rank}`;
}

export class LogsTab extends JobTab {
  readonly label = 'Logs';
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

  constructor(page: JobPage) {
    super('logs', page);
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
    this.section.append(
      h(
        'div',
        { class: 'ma-toolbar' },
        this.streamSelect,
        this.search,
        h('label', { title: 'Keep the newest line in view' }, this.followBox, 'follow'),
        h('label', { title: 'Wrap long lines' }, this.wrap, 'wrap'),
        h(
          'button',
          { class: 'jp-Button jp-mod-styled ma-log-download', onclick: () => void this.page.act(() => this.download()) },
          'Download'
        ),
        this.logNote,
        this.tailNote
      ),
      this.logPre,
      this.searchPre
    );
    this.applyWrap();
  }

  show(): void {
    if (this.follower === null) {
      void this.updateStreams();
    }
  }

  refresh(): Promise<void> {
    return this.updateStreams();
  }

  dispose(): void {
    this.follower?.cancel();
  }

  /** The node logs of the streams (rank null), in the service's order. */
  private nodeNames(): string[] {
    return this.streams.filter(s => s.rank === null || s.rank === undefined).map(s => s.node);
  }

  private async updateStreams(): Promise<void> {
    let streams: LogStream[];
    try {
      streams = await api.logStreams(this.page.job.id);
    } catch {
      return;
    }
    const keys = streams.map(streamKey);
    const changed = keys.join('|') !== this.streams.map(streamKey).join('|');
    this.streams = streams; // their sizes too: a stream chosen later starts at its tail
    // a job of several nodes opens on every node's lines, each prefixed with its node
    const several = this.nodeNames().length > 1 || (this.page.job.nodes ?? []).length > 1;
    const options = several ? [ALL_NODES, ...keys] : keys;
    if (changed) {
      const chosen = this.streamSelect.value;
      this.streamSelect.replaceChildren(
        ...(several ? [h('option', { value: ALL_NODES }, 'All nodes')] : []),
        ...streams.map(s =>
          h(
            'option',
            { value: streamKey(s) },
            s.rank === null || s.rank === undefined ? `${s.node} (all ranks)` : `${s.node} · rank ${s.rank}`
          )
        )
      );
      if (options.includes(chosen)) {
        this.streamSelect.value = chosen;
      }
    }
    if (this.follower instanceof AllNodesFollower) {
      if (this.streamSelect.value === ALL_NODES) {
        for (const node of this.nodeNames()) {
          this.follower.addNode(node); // a node that appeared later, from its start
        }
      }
      if (this.page.job.status === 'running') {
        for (const s of streams) {
          if (s.rank !== null && s.rank !== undefined) {
            this.follower.addRank(s.node, s.rank); // rule 6 (a node not shown is left alone)
          }
        }
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
    const size = this.streams.find(s => streamKey(s) === key)?.size ?? 0;
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
    const jobId = this.page.job.id;
    if (key === ALL_NODES) {
      const nodes = this.nodeNames().map(node => ({ node, startAt: this.startAt(node) }));
      this.logPre.dataset.startAt = String(Math.max(0, ...nodes.map(n => n.startAt)));
      this.tailNote.textContent = nodes.some(n => n.startAt)
        ? "showing the end of large logs: Download saves all of a node's log"
        : '';
      this.follower = new AllNodesFollower(jobId, nodes, this.logPre, options);
      return;
    }
    const [node, rank] = key.split('/rank-');
    // a large log starts at its tail: the page stays responsive, Download has the rest
    const size = this.streams.find(s => streamKey(s) === key)?.size ?? 0;
    const startAt = this.startAt(key);
    this.logPre.dataset.startAt = String(startAt);
    this.tailNote.textContent = startAt ? `showing the end of a ${megabytes(size)} log: Download saves all of it` : '';
    if (rank === undefined) {
      // a node's own log: its ranks' lines being drawn show under it too (rule 6)
      this.follower = new AllNodesFollower(jobId, [{ node, startAt }], this.logPre, { ...options, prefixed: false });
      return;
    }
    this.follower = new LogFollower(
      jobId,
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
    const jobId = this.page.job.id;
    const parts: string[] = [];
    // "All nodes": every node's whole log, merged by time as the pane merges them
    const merged = new MergedLog(Infinity);
    for (const stream of key === ALL_NODES ? this.nodeNames() : [key]) {
      const [node, rank] = stream.split('/rank-');
      const text: string[] = [];
      let offset = 0;
      for (;;) {
        const chunk = await api.readLog(jobId, { node, rank: rank === undefined ? null : Number(rank) }, offset, 0);
        text.push(chunk.data ?? '');
        if (chunk.next_offset === offset || !chunk.data) {
          break;
        }
        offset = chunk.next_offset;
      }
      if (key === ALL_NODES) {
        merged.add(node, logLines(text.join('')));
      } else {
        parts.push(text.join(''));
      }
    }
    if (key === ALL_NODES) {
      parts.push(merged.text());
    }
    const link = h('a', {
      href: URL.createObjectURL(new Blob(parts, { type: 'text/plain' })),
      download: `${jobId}-${key === ALL_NODES ? 'all-nodes' : key.replace('/', '-')}.log`
    });
    link.click();
    URL.revokeObjectURL(link.href);
  }
}
