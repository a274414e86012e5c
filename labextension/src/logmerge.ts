/**
 * The log pane's "All nodes" text: every node's lines merged by time, each shown as
 * `YYYY-MM-DD HH:MM:SS [node] line` (local time, as `format.ts`'s `dateTime`).
 *
 * The service keeps no time per log line (a log file holds the bytes the job wrote), so a
 * line's time is, in this order:
 *
 * 1. the time the line itself starts with, after an optional `[rank r] ` of the rank splitter
 *    (`2026-12-06 14:02:03`, `2026-12-06T14:02:03.5Z`, Python logging's `,123` milliseconds;
 *    without a zone: local time), so a log read after it was written (a finished job, a page
 *    opened late) still interleaves by when its lines were written;
 * 2. else the time of the nearest line of the same read that has one (the lines of a traceback
 *    stay with the logged line they follow);
 * 3. else when the page read it (a live job's lines arrive as they are written).
 *
 * 4. A node's lines keep their order: a line is never placed before its node's previous line,
 *    and lines of one time keep their arrival order.
 * 5. Only the newest `keep` characters stay.
 */
import { dateTime } from './format';

/** A leading date and time, after an optional `[` and a rank splitter's `[rank r] `. */
const LEADING_TIME =
  /^(?:\[rank \d+\] )?\[?(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,6}))?(Z|[+-]\d{2}:?\d{2})?(?![\d])/;

/** The time (ms since the epoch) a line starts with (rule 1), or null. */
export function lineTime(line: string): number | null {
  const m = LEADING_TIME.exec(line);
  if (!m) {
    return null;
  }
  const fraction = m[3] ? `.${m[3].padEnd(3, '0').slice(0, 3)}` : '';
  const zone = m[4] ? (m[4] === 'Z' ? 'Z' : m[4].length === 5 ? `${m[4].slice(0, 3)}:${m[4].slice(3)}` : m[4]) : '';
  const t = new Date(`${m[1]}T${m[2]}${fraction}${zone}`).getTime();
  return Number.isNaN(t) ? null : t;
}

interface TimedLine {
  t: number;
  text: string;
}

export class MergedLog {
  private lines: TimedLine[] = [];
  private chars = 0;
  /** each node's newest line time (rule 4) */
  private latest = new Map<string, number>();

  constructor(private readonly keep: number) {}

  /** Add the finished lines one read of `node`'s log gave, read at `now`; `labelled` false
   * (one node's own log) shows each line as it is, without its time and node. */
  add(node: string, texts: string[], now: number = Date.now(), labelled = true): void {
    const own = texts.map(lineTime);
    for (let i = 0; i < texts.length; i++) {
      let t = own[i];
      if (t === null) {
        // rule 2: the nearest timed line of this read, before it first, else after it
        let j = i - 1;
        while (j >= 0 && own[j] === null) {
          j--;
        }
        let k = i + 1;
        while (j < 0 && k < texts.length && own[k] === null) {
          k++;
        }
        t = j >= 0 ? own[j] : k < texts.length ? own[k] : now;
      }
      t = Math.max(t as number, this.latest.get(node) ?? -Infinity);
      this.latest.set(node, t);
      const label = labelled ? `${dateTime(new Date(t).toISOString())} [${node}] ` : '';
      this.insert({ t, text: `${label}${texts[i]}\n` });
    }
    while (this.chars > this.keep && this.lines.length > 1) {
      this.chars -= this.lines.shift()!.text.length;
    }
  }

  /** The merged text (rule 5). */
  text(): string {
    return this.lines.map(line => line.text).join('');
  }

  private insert(line: TimedLine): void {
    // after every line of the same or an earlier time (rule 4); nearly always at the end
    let lo = 0;
    let hi = this.lines.length;
    if (hi === 0 || this.lines[hi - 1].t <= line.t) {
      lo = hi;
    }
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.lines[mid].t <= line.t) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    this.lines.splice(lo, 0, line);
    this.chars += line.text.length;
  }
}
