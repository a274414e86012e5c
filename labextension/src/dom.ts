/**
 * Small DOM helpers every view builds with (no framework): `h` makes elements, `statusBadge` a
 * job status as every view shows it. Texts (times, sizes, states) are written in format.ts
 * and jobstate.ts.
 */

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
