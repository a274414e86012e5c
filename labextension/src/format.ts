/**
 * How every view writes times, spans, counts, sizes and paths: one spelling each, so the
 * sidebar, the jobs table, the job page, the form and the cluster view agree with each other
 * (and with the CLI and the notebook, which write times the same way).
 */

/**
 * `2026-11-22 07:00:05` in local time: the date and the 24-hour time, always (never the
 * browser's locale format, 12-hour in some, nor a time without its date), as the CLI and the
 * notebook show times. Every view formats its times here.
 */
export function dateTime(iso: string | null | undefined): string {
  if (!iso) {
    return '';
  }
  const when = new Date(iso);
  if (Number.isNaN(when.getTime())) {
    return iso;
  }
  const pad = (n: number) => String(n).padStart(2, '0');
  return (
    `${when.getFullYear()}-${pad(when.getMonth() + 1)}-${pad(when.getDate())} ` +
    `${pad(when.getHours())}:${pad(when.getMinutes())}:${pad(when.getSeconds())}`
  );
}

/** `1h 02m`, `3m 05s`, `12s`. */
export function span(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  const pad = (n: number) => String(n).padStart(2, '0');
  if (s >= 3600) {
    return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
  }
  if (s >= 60) {
    return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  }
  return `${s}s`;
}

/** `1 core`, `2 cores`: a count with its noun, singular for one. */
export function count(n: number, noun: string, plural = `${noun}s`): string {
  return `${n} ${n === 1 ? noun : plural}`;
}

/** `12.3 MB` (MiB, one decimal). */
export function megabytes(bytes: number): string {
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

/** A long folder as its last two parts (`…/name-abc123/outputs`): the end tells jobs apart. */
export function shortPath(path: string): string {
  const parts = path.split('/').filter(Boolean);
  return path.length > 40 && parts.length > 2 ? `…/${parts.slice(-2).join('/')}` : path;
}

/** The readable text of any thrown value. */
export function errorText(error: unknown): string {
  if (error instanceof Error) {
    return error.message;
  }
  return String(error);
}
