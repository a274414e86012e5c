/**
 * Follows one log stream (a node, or a node and rank) of a job into a <pre>, by byte offset over
 * the service's long-poll (`GET /jobs/{id}/logs/read?wait=`), so nothing is lost or repeated.
 *
 * 1. It starts at `startAt` (0: the whole log). A start past 0 is the tail of a large log: the
 *    partial line it lands in is dropped, and everything before it is left to Download.
 * 2. Only the newest `LOG_KEEP_CHARS` characters stay in the page, so a long run never makes
 *    the page slower with every line.
 * 3. Each line is shown as a terminal shows it (`visibleLine`: a progress bar's last state).
 * 4. After each append the <pre> is scrolled to the newest line only while `stick()` says so
 *    (the page's follow checkbox).
 * 5. It ends at the stream's end (`eof`, set as `data-eof` on the <pre>), on `cancel()`, or
 *    when the service answers `node_lost` (the node's machine is gone with its log: the
 *    message is shown as the problem and `data-lost` set on the <pre>).
 * 6. A line still being written (a progress bar redrawn with `\r`, no newline yet) is shown as
 *    it stands under the finished lines as soon as its bytes arrive, and replaced in place
 *    (`onPartial` gets it after each read, '' once none is left).
 */
import { ApiError, api } from './api';
import { errorText } from './format';
import { MergedLog } from './logmerge';

/** How long one long-poll read waits for new bytes (s). */
const LOG_WAIT_S = 10;
/** How long a polled follower (`poll`) waits between two reads that brought nothing (ms). */
const RANK_POLL_MS = 500;
/** The newest characters a page keeps of a log. */
export const LOG_KEEP_CHARS = 400_000;
/** Of a log larger than this, a page starts at its last this many bytes. */
export const LOG_TAIL_BYTES = 256 * 1024;

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

export interface LogFollowerOptions {
  /** byte offset to start at (rule 1) */
  startAt?: number;
  /** whether to keep the newest line in view (rule 4) */
  stick?: () => boolean;
  /** a problem to show (empty: none) */
  onProblem?: (text: string) => void;
  /** called after each append */
  onUpdate?: () => void;
  /** called with the finished lines of each append, each as `visibleLine` made it */
  onLines?: (lines: string[]) => void;
  /** called once the stream has ended (eof, or its node's machine gone) */
  onEnd?: () => void;
  /** called after each read with the unfinished line as `visibleLine` makes it ('' for none: rule 6) */
  onPartial?: (line: string) => void;
  /** read without waiting, every `RANK_POLL_MS` when nothing came (a rank's unfinished line) */
  poll?: boolean;
}

export class LogFollower {
  private controller = new AbortController();
  private offset: number;
  private stopped = false;
  private problemShown = false;
  /** a start in the middle of the log: drop up to its first newline */
  private skipPartial: boolean;
  /** the finished lines shown, each as `visibleLine` made it */
  private shown = '';
  /** the raw text after the last newline (a progress bar being drawn) */
  private partial = '';

  constructor(
    private readonly jobId: string,
    private readonly stream: { node: string; rank: number | null },
    private readonly pre: HTMLElement,
    private readonly options: LogFollowerOptions = {}
  ) {
    this.offset = options.startAt ?? 0;
    this.skipPartial = this.offset > 0;
    void this.run();
  }

  /** The text shown so far (its newest `LOG_KEEP_CHARS` characters). */
  text(): string {
    return this.shown + visibleLine(this.partial);
  }

  private append(text: string): void {
    if (this.skipPartial) {
      const newline = text.indexOf('\n');
      if (newline < 0) {
        return;
      }
      text = text.slice(newline + 1);
      this.skipPartial = false;
    }
    const raw = this.partial + text;
    const cut = raw.lastIndexOf('\n');
    if (cut >= 0) {
      const lines = raw.slice(0, cut).split('\n').map(visibleLine);
      this.options.onLines?.(lines);
      this.shown += lines.map(line => line + '\n').join('');
      if (this.shown.length > LOG_KEEP_CHARS) {
        this.shown = this.shown.slice(this.shown.length - LOG_KEEP_CHARS);
      }
    }
    this.partial = raw.slice(cut + 1);
    this.options.onPartial?.(visibleLine(this.partial));
    this.pre.textContent = this.shown + visibleLine(this.partial);
    if (this.options.stick?.() ?? true) {
      this.pre.scrollTop = this.pre.scrollHeight;
    }
    this.options.onUpdate?.();
  }

  private async run(): Promise<void> {
    const problem = this.options.onProblem ?? (() => undefined);
    while (!this.stopped) {
      try {
        // a rank's unfinished line is polled (`poll`), not waited on: the service counts each
        // waiting read as a log follower against its caps, and one per node is enough
        const wait = this.options.poll ? 0 : LOG_WAIT_S;
        const chunk = await api.readLog(this.jobId, this.stream, this.offset, wait, this.controller.signal);
        if (this.stopped) {
          return;
        }
        if (chunk.data) {
          this.append(chunk.data);
        }
        this.offset = chunk.next_offset;
        if (this.problemShown) {
          problem(''); // only a problem of ours is cleared: the page's own note stays
          this.problemShown = false;
        }
        if (chunk.eof) {
          if (this.partial) {
            this.options.onLines?.([visibleLine(this.partial)]); // the job ended mid-line
            this.options.onPartial?.('');
          }
          this.pre.dataset.eof = 'true';
          this.options.onEnd?.();
          return;
        }
        if (this.options.poll && !chunk.data) {
          await new Promise(resolve => window.setTimeout(resolve, RANK_POLL_MS));
        }
      } catch (error) {
        if (this.stopped) {
          return;
        }
        if (error instanceof ApiError && error.kind === 'node_lost') {
          // the machine that ran this node is gone with its log: asking again cannot help
          problem(error.message);
          this.pre.dataset.lost = 'true';
          this.options.onEnd?.();
          return;
        }
        // a node that has not started has no log yet: say so and try again shortly
        this.problemShown = true;
        problem(
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

/**
 * Follows every node's own log of a job into one <pre> (the log pane's "All nodes" choice, the
 * default of a multi-node job; with `prefixed` false, one node's own log), as the CLI's
 * `--follow` and the notebook do:
 *
 * 1. One `LogFollower` per node, each into a detached <pre>; their finished lines come here,
 *    merged by time, each prefixed with its time and `[node] ` (a rank splitter's `[rank r]`
 *    follows it): logmerge.ts.
 * 2. `addNode` follows a node that appeared later (a restart's new attempt, a scale-up).
 * 3. The newest `LOG_KEEP_CHARS` characters stay; `data-eof` is set once every node's log ended.
 * 4. Each node's line still being written shows under the finished lines, one per node, as it
 *    stands (LogFollower rule 6).  A rank splitter keeps a rank's redrawn line out of the node
 *    log until its newline: `addRank` reads a rank's own log of a followed node for its
 *    unfinished line only, shown labelled `[rank r] ` as the node log will have it.
 */
export class AllNodesFollower {
  private followers = new Map<string, LogFollower>();
  private ended = new Set<string>();
  private merged = new MergedLog(LOG_KEEP_CHARS);
  /** per stream (`node` or `node/rank-r`), what goes before its unfinished line and the line */
  private partials = new Map<string, [string, string]>();
  /** the rank logs read for their unfinished line only (rule 4) */
  private ranks = new Map<string, LogFollower>();

  constructor(
    private readonly jobId: string,
    nodes: { node: string; startAt: number }[],
    private readonly pre: HTMLElement,
    private readonly options: LogFollowerOptions & { prefixed?: boolean } = {}
  ) {
    for (const { node, startAt } of nodes) {
      this.addNode(node, startAt);
    }
  }

  /** Follow one more node (rule 2); false if it is followed already. */
  addNode(node: string, startAt = 0): boolean {
    if (this.followers.has(node)) {
      return false;
    }
    delete this.pre.dataset.eof;
    const own = document.createElement('pre');
    const one = this.options.prefixed === false; // one node's own log: said as LogFollower says it
    const follower = new LogFollower(this.jobId, { node, rank: null }, own, {
      startAt,
      onProblem: text => this.options.onProblem?.(text && !one ? `${node}: ${text}` : text),
      onLines: lines => this.add(node, lines),
      onPartial: line => this.setPartial(node, this.label(node), line),
      onEnd: () => {
        if (one && own.dataset.lost) {
          this.pre.dataset.lost = 'true';
        }
        this.ended.add(node);
        if (this.ended.size === this.followers.size) {
          this.pre.dataset.eof = 'true';
        }
      }
    });
    this.followers.set(node, follower);
    return true;
  }

  /** Read a rank's own log of a followed node for its unfinished line (rule 4); false if
   * it is read already or its node is not followed. */
  addRank(node: string, rank: number): boolean {
    const key = `${node}/rank-${rank}`;
    if (this.ranks.has(key) || !this.followers.has(node)) {
      return false;
    }
    const label = `[rank ${rank}] `;
    const follower = new LogFollower(this.jobId, { node, rank }, document.createElement('pre'), {
      // its finished lines come through the node's log; only the line being drawn is shown,
      // labelled after each \r too, as the splitter writes it into the node log
      onPartial: line => this.setPartial(key, this.label(node), line ? label + line : ''),
      poll: true
    });
    this.ranks.set(key, follower);
    return true;
  }

  private label(node: string): string {
    return this.options.prefixed === false ? '' : `[${node}] `;
  }

  private add(node: string, lines: string[]): void {
    this.merged.add(node, lines, Date.now(), this.options.prefixed !== false);
    this.render();
  }

  private setPartial(key: string, label: string, line: string): void {
    const before = this.partials.get(key)?.[1] ?? '';
    if (line === before) {
      return;
    }
    if (line) {
      this.partials.set(key, [label, line]);
    } else {
      this.partials.delete(key);
    }
    this.render();
  }

  private render(): void {
    this.pre.textContent = this.text();
    if (this.options.stick?.() ?? true) {
      this.pre.scrollTop = this.pre.scrollHeight;
    }
    this.options.onUpdate?.();
  }

  /** The text shown so far: the finished lines, then each line still being written. */
  text(): string {
    let text = this.merged.text();
    for (const [label, line] of this.partials.values()) {
      text += `${label}${line}\n`;
    }
    return text;
  }

  cancel(): void {
    for (const follower of [...this.followers.values(), ...this.ranks.values()]) {
      follower.cancel();
    }
  }
}
