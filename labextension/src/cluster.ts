/**
 * The cluster view in the main area (`data-ma-view="cluster"`), the seed's cluster resources
 * page: each node with usage bars (cores, memory, cards; emulated cards marked "emulated"), its
 * cards as `card(virtual):job` and
 * the jobs on it; each spec with how many more could start now; the queue by priority; the
 * cards queued jobs ask for per board model.  Spec and board-model filters are the service's
 * (`GET /cluster?spec=…&model=…`); it refreshes every few seconds while open.
 */
import { Widget } from '@lumino/widgets';

import { requestAPI } from './api';
import { h } from './dom';
import { errorText } from './format';
import type { ClusterView as WireClusterView } from './models';

/** A wire model with every defaulted field present (the service's JSON always carries them). */
type Filled<T> = {
  [K in keyof T]-?: NonNullable<T[K]> extends Array<infer U>
    ? Array<Filled<U>>
    : NonNullable<T[K]> extends object
      ? Filled<NonNullable<T[K]>>
      : T[K];
};
export type ClusterView = Filled<WireClusterView>;
type ClusterNode = ClusterView['nodes'][number];

/** Seconds between refreshes while the view is open. */
const REFRESH = 3000;

/** The cluster view from the service, filtered by specs and board models. */
export function fetchCluster(specs: string[] = [], models: string[] = []): Promise<ClusterView> {
  const search = new URLSearchParams();
  specs.forEach(s => search.append('spec', s));
  models.forEach(m => search.append('model', m));
  const text = search.toString();
  return requestAPI<ClusterView>(`api/v1/cluster${text ? `?${text}` : ''}`);
}

function bar(label: string, used: number, total: number, unit = ''): HTMLElement {
  const share = total > 0 ? Math.min(1, used / total) : 0;
  const level = share >= 0.9 ? 'high' : share >= 0.6 ? 'mid' : 'low';
  return h(
    'div',
    { class: 'ma-bar', 'data-bar': label.toLowerCase() },
    h('span', { class: 'ma-bar-label' }, label),
    h(
      'span',
      { class: 'ma-bar-track' },
      h('span', { class: `ma-bar-fill ma-bar-${level}`, style: `width: ${(share * 100).toFixed(1)}%` })
    ),
    h('span', { class: 'ma-bar-value' }, `${+used.toFixed(2)} / ${+total.toFixed(2)}${unit}`)
  );
}

export class ClusterWidget extends Widget {
  private body: HTMLElement;
  private filters: HTMLElement;
  private specs = new Set<string>();
  private models = new Set<string>();
  private timer: number | undefined;
  private view: ClusterView | null = null;
  private catalog: string[] = [];

  /** `openJob`: where a click on a job (on a node, or in the queue) goes: its main-area tab. */
  constructor(private readonly openJob: (id: string) => void = () => undefined) {
    super();
    this.id = 'ma-cluster';
    this.title.label = 'Cluster resources';
    this.title.closable = true;
    this.addClass('ma-main');
    this.addClass('ma-cluster');
    this.node.setAttribute('data-ma-view', 'cluster');
    this.filters = h('div', { class: 'ma-cluster-filters' });
    this.body = h('div', { class: 'ma-cluster-body' }, 'Loading…');
    this.node.append(
      h(
        'div',
        { class: 'ma-header' },
        h('h2', { class: 'ma-view-title' }, 'Cluster resources'),
        h('button', { class: 'jp-mod-styled', 'data-ma-action': 'refresh', onclick: () => void this.refresh() }, 'Refresh')
      ),
      this.filters,
      this.body
    );
    void this.refresh();
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    super.dispose();
  }

  async refresh(): Promise<void> {
    window.clearTimeout(this.timer);
    try {
      this.view = await fetchCluster([...this.specs], [...this.models]);
      if (!this.specs.size && !this.models.size) {
        this.catalog = this.view.specs.map(r => r.spec.name);
      }
      this.render();
    } catch (error) {
      this.body.replaceChildren(h('div', { class: 'ma-error' }, errorText(error)));
    }
    if (!this.isDisposed) {
      this.timer = window.setTimeout(() => void this.refresh(), REFRESH);
    }
  }

  private chip(set: Set<string>, value: string, label: string, hook: string): HTMLElement {
    return h(
      'label',
      { class: 'ma-chip', [hook]: value },
      h('input', {
        type: 'checkbox',
        checked: set.has(value),
        onchange: (e: Event) => {
          (e.target as HTMLInputElement).checked ? set.add(value) : set.delete(value);
          void this.refresh();
        }
      }),
      label
    );
  }

  private render(): void {
    const view = this.view!;
    this.filters.replaceChildren(
      h('span', { class: 'ma-field-label' }, 'Specs:'),
      ...this.catalog.map(name => this.chip(this.specs, name, name, 'data-spec')),
      ...(view.models.length ? [h('span', { class: 'ma-field-label' }, 'Board model:')] : []),
      ...view.models.map(model =>
        this.chip(this.models, model, `${model} (${view.demand[model] ?? 0} queued)`, 'data-model')
      )
    );
    this.body.replaceChildren(
      h('h3', {}, 'Nodes'),
      h('div', { class: 'ma-node-cards' }, ...view.nodes.map(entry => this.nodeCard(entry))),
      h('h3', {}, 'Specs: how many more can start now'),
      h(
        'table',
        { class: 'ma-table', 'data-ma-specs': '' },
        h(
          'thead',
          {},
          h('tr', {}, ...['spec', 'cores', 'memory', 'cards', 'board models', 'nodes', 'can start now'].map(t => h('th', {}, t)))
        ),
        h(
          'tbody',
          {},
          ...view.specs.map(room =>
            h(
              'tr',
              { 'data-spec': room.spec.name },
              h('td', {}, room.spec.name),
              h('td', {}, String(room.spec.cpus)),
              h('td', {}, `${room.spec.memory_gb} GB`),
              h(
                'td',
                {},
                room.spec.accelerators
                  ? `${room.spec.accelerators} ${room.spec.accelerator_type}${room.spec.emulated ? ' (emulated)' : ''}`
                  : '–'
              ),
              h('td', {}, room.models.join(', ') || '–'),
              h('td', {}, String(room.nodes)),
              h('td', { class: 'ma-can-start', 'data-can-start': String(room.can_start) }, String(room.can_start))
            )
          )
        )
      ),
      h('h3', {}, `Queue (${view.queue.length})`),
      view.queue.length
        ? h(
            'table',
            { class: 'ma-table', 'data-ma-queue': '' },
            h('thead', {}, h('tr', {}, ...['#', 'priority', 'job', 'specs', 'nodes', 'cards'].map(t => h('th', {}, t)))),
            h(
              'tbody',
              {},
              ...view.queue.map(q =>
                h(
                  'tr',
                  q.job_id
                    ? { 'data-job-id': q.job_id, class: 'ma-clickable', title: 'Open the job', onclick: () => this.openJob(q.job_id!) }
                    : {},
                  h('td', {}, String(q.position + 1)),
                  h('td', {}, q.priority),
                  h('td', {}, q.job_id ? `${q.name} (${q.job_id})` : q.name),
                  h('td', {}, q.specs.join(', ')),
                  h('td', {}, String(q.nodes)),
                  h('td', {}, q.cards ? `${q.cards} ${q.model}` : '–')
                )
              )
            )
          )
        : h('div', { class: 'ma-field-hint' }, 'No job is waiting.'),
      h('h3', {}, 'Cards queued jobs ask for, per board model'),
      h(
        'div',
        { 'data-ma-demand': '' },
        Object.keys(view.demand).length
          ? Object.entries(view.demand)
              .map(([model, cards]) => `${model}: ${cards}`)
              .join(' · ')
          : 'none'
      )
    );
  }

  private nodeCard(entry: ClusterNode): HTMLElement {
    const n = entry.node;
    const cards = entry.cards ?? [];
    const jobs = entry.jobs ?? [];
    const usage = n.usage ?? [];
    const used = n.accelerators_used ?? [];
    // the badge, first that applies: down, drained or faulty (no job is placed there at all);
    // tight (nothing more of the chosen or any spec fits); busy (jobs run on it, and more still
    // fits); idle (nothing runs on it)
    const running = jobs.length > 0 || usage.length > 0 || (n.cpus_used ?? 0) > 0 || used.length > 0;
    const out = n.status === 'down' || n.status === 'drained' || n.status === 'faulty' ? n.status : null;
    const state = out ?? (!entry.fits ? 'tight' : running ? 'busy' : 'idle');
    const what = this.specs.size ? 'a chosen spec' : 'some spec';
    const why: Record<string, string> = {
      down: 'the node is down',
      drained: `drained: no job is placed here${n.health ? ` (${n.health})` : ''}`,
      faulty: `faulty: no job is placed here${n.health ? ` (${n.health})` : ''}`,
      tight: `tight: jobs hold it so that no node of ${what} fits here now`,
      busy: `busy: jobs run here, and one node of ${what} still fits`,
      idle: 'idle: no job runs here'
    };
    return h(
      'div',
      { class: 'ma-node-card', 'data-node': n.name, 'data-state': state },
      h(
        'div',
        { class: 'ma-node-head' },
        h('b', {}, n.name),
        h(
          'span',
          {
            class: `ma-node-state ma-node-${state}`,
            title: why[state]
          },
          state
        ),
        n.accelerators && n.emulated
          ? h(
              'span',
              {
                class: 'ma-node-emulated',
                'data-ma-emulated': '',
                title: 'emulated cards: indices only, no device bound into a job (cluster.toml says emulated, or this machine shows none of their type)'
              },
              'emulated'
            )
          : null,
        h(
          'span',
          { class: 'ma-field-hint', 'data-ma-system': '' },
          [entry.model, n.driver_version ? `driver ${n.driver_version}` : '', n.os, n.kernel ? `kernel ${n.kernel}` : '']
            .filter(Boolean)
            .join(' · ')
        )
      ),
      bar('Cores', n.cpus_used ?? 0, n.cpus),
      bar('Memory', n.memory_used_gb ?? 0, n.memory_gb, ' GB'),
      n.accelerators ? bar('Cards', used.length, n.accelerators) : null,
      h('div', { class: 'ma-node-specs', 'data-ma-specs': '' }, 'Specs: ', (n.specs ?? []).join(', ') || 'none'),
      h(
        'div',
        { class: 'ma-node-use' },
        cards.length ? h('div', {}, 'Cards: ', ...cards.map(c => h('code', { class: 'ma-card-use' }, c))) : null,
        h(
          'div',
          {},
          'Jobs: ',
          ...(jobs.length
            ? jobs.map(id =>
                h(
                  'a',
                  { class: 'ma-node-job', 'data-job-id': id, href: '#', title: 'Open the job', onclick: (e: Event) => {
                    e.preventDefault();
                    this.openJob(id);
                  } },
                  id
                )
              )
            : [usage.length ? "another user's" : 'none'])
        )
      )
    );
  }
}
