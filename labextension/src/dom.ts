/** A small helper to build DOM trees without a framework. */

type Child = Node | string | null | undefined | false;
type Attrs = Record<string, string | number | boolean | EventListener | null | undefined>;

/**
 * Create an element: `h('button', {class: 'x', onclick: fn}, 'Stop')`. Attributes starting with
 * `on` become event listeners; `false`/`null` attributes are left out; children may be text.
 */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) {
      continue;
    }
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value as EventListener);
    } else if (key === 'value' && 'value' in el) {
      (el as unknown as HTMLInputElement).value = String(value);
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    el.append(typeof child === 'string' ? document.createTextNode(child) : child);
  }
  return el;
}

/** A status badge: `<span class="ma-status ma-status-running">running</span>`. */
export function statusBadge(status: string | undefined): HTMLSpanElement {
  const value = status ?? 'queued';
  return h('span', { class: `ma-status ma-status-${value}`, 'data-status': value }, value);
}

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

/** `1 core`, `2 cores`: a count with its noun, singular for one. */
export function count(n: number, noun: string, plural = `${noun}s`): string {
  return `${n} ${n === 1 ? noun : plural}`;
}

/** The readable text of any thrown value. */
export function errorText(error: unknown): string {
  if (error instanceof Error) {
    return error.message;
  }
  return String(error);
}
