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
 */
import { ApiError, api } from './api';
import { errorText } from './format';
import { MergedLog } from './logmerge';

/** How long one long-poll read waits for new bytes (s). */
const LOG_WAIT_S = 10;
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
        const chunk = await api.readLog(this.jobId, this.stream, this.offset, LOG_WAIT_S, this.controller.signal);
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
          }
          this.pre.dataset.eof = 'true';
          this.options.onEnd?.();
          return;
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
 * default of a multi-node job), as the CLI's `--follow` and the notebook do:
 *
 * 1. One `LogFollower` per node, each into a detached <pre>; their finished lines come here,
 *    merged by time, each prefixed with its time and `[node] ` (a rank splitter's `[rank r]`
 *    follows it): logmerge.ts.
 * 2. `addNode` follows a node that appeared later (a restart's new attempt, a scale-up).
 * 3. The newest `LOG_KEEP_CHARS` characters stay; `data-eof` is set once every node's log ended.
 */
export class AllNodesFollower {
  private followers = new Map<string, LogFollower>();
  private ended = new Set<string>();
  private merged = new MergedLog(LOG_KEEP_CHARS);

  constructor(
    private readonly jobId: string,
    nodes: { node: string; startAt: number }[],
    private readonly pre: HTMLElement,
    private readonly options: LogFollowerOptions = {}
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
    const follower = new LogFollower(this.jobId, { node, rank: null }, document.createElement('pre'), {
      startAt,
      onProblem: text => this.options.onProblem?.(text ? `${node}: ${text}` : ''),
      onLines: lines => this.add(node, lines),
      onEnd: () => {
        this.ended.add(node);
        if (this.ended.size === this.followers.size) {
          this.pre.dataset.eof = 'true';
        }
      }
    });
    this.followers.set(node, follower);
    return true;
  }

  private add(node: string, lines: string[]): void {
    this.merged.add(node, lines);
    this.pre.textContent = this.merged.text();
    if (this.options.stick?.() ?? true) {
      this.pre.scrollTop = this.pre.scrollHeight;
    }
    this.options.onUpdate?.();
  }

  /** The text shown so far. */
  text(): string {
    return this.merged.text();
  }

  cancel(): void {
    for (const follower of this.followers.values()) {
      follower.cancel();
    }
  }
}
