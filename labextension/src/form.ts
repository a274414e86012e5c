/**
 * The create form: name, specs (from the service), mode, nodes, parameter servers (TensorFlow
 * only), command, folders and mounts, priority and duration. "Dry run" shows the resolved plan;
 * "Submit" creates the job. The service's typed errors appear next to the form, naming the field.
 */
import { ApiError, api } from './api';
import { errorText, h } from './dom';
import { MODE_VALUES, PRIORITY_VALUES } from './models';
import type { Job, JobSpec, Mode, Plan, Priority } from './models';
import type { View } from './view';

type MountKind = 'datasets' | 'models' | 'volumes' | 'annotations';
const MOUNT_KINDS: Array<[MountKind, string]> = [
  ['datasets', 'dataset'],
  ['models', 'model'],
  ['volumes', 'volume'],
  ['annotations', 'annotation']
];

interface MountRow {
  node: HTMLElement;
  kind: HTMLSelectElement;
  name: HTMLInputElement;
  path: HTMLInputElement;
  writable: HTMLInputElement;
}

function field(label: string, cls: string, control: HTMLElement, hint = ''): HTMLElement {
  return h(
    'label',
    { class: `ma-field ma-field-${cls}`, 'data-field': cls },
    h('span', { class: 'ma-field-label' }, label),
    control,
    hint ? h('span', { class: 'ma-field-hint' }, hint) : null
  );
}

function defaultName(): string {
  const now = new Date();
  const pad = (n: number) => String(n).padStart(2, '0');
  return `job-${pad(now.getMonth() + 1)}${pad(now.getDate())}-${pad(now.getHours())}${pad(now.getMinutes())}${pad(now.getSeconds())}`;
}

export class JobFormView implements View {
  readonly node: HTMLElement;
  private name: HTMLInputElement;
  private specs: HTMLSelectElement;
  private mode: HTMLSelectElement;
  private nodes: HTMLInputElement;
  private ps: HTMLInputElement;
  private command: HTMLTextAreaElement;
  private algorithm: HTMLInputElement;
  private outputs: HTMLInputElement;
  private priority: HTMLSelectElement;
  private duration: HTMLInputElement;
  private mounts: HTMLElement;
  private mountRows: MountRow[] = [];
  private message: HTMLElement;
  private submitButton: HTMLButtonElement;
  private base: Partial<JobSpec> = {};

  constructor(
    private readonly created: (job: Job) => void,
    private readonly cancel: () => void,
    template?: JobSpec
  ) {
    this.name = h('input', { class: 'jp-mod-styled', type: 'text', value: defaultName() });
    this.specs = h('select', { class: 'jp-mod-styled ma-specs', multiple: true, size: 4 });
    this.mode = h(
      'select',
      { class: 'jp-mod-styled', onchange: () => this.syncMode() },
      ...MODE_VALUES.map(m => h('option', { value: m }, m))
    );
    this.nodes = h('input', { class: 'jp-mod-styled', type: 'number', min: 1, max: 64, value: 1 });
    this.ps = h('input', { class: 'jp-mod-styled', type: 'number', min: 0, max: 64, value: 0 });
    this.command = h('textarea', {
      class: 'jp-mod-styled',
      rows: 2,
      placeholder: 'python /workspace/algorithm/train.py --epochs 3'
    });
    this.algorithm = h('input', {
      class: 'jp-mod-styled',
      type: 'text',
      placeholder: 'host folder shown at /workspace/algorithm'
    });
    this.outputs = h('input', {
      class: 'jp-mod-styled',
      type: 'text',
      placeholder: 'host folder shown at /workspace/outputs'
    });
    this.priority = h(
      'select',
      { class: 'jp-mod-styled' },
      ...PRIORITY_VALUES.map(p => h('option', { value: p }, p))
    );
    this.duration = h('input', {
      class: 'jp-mod-styled',
      type: 'text',
      placeholder: 'no limit; e.g. 30m, 2h, 1d'
    });
    this.mounts = h('div', { class: 'ma-mounts' });
    this.message = h('div', { class: 'ma-message ma-form-message' });
    this.submitButton = h(
      'button',
      { class: 'jp-Button jp-mod-styled jp-mod-accept ma-submit', onclick: () => void this.submit() },
      'Submit'
    );
    this.node = h(
      'form',
      { class: 'ma-form', onsubmit: (e: globalThis.Event) => e.preventDefault() },
      h('h2', {}, template ? `Clone of ${template.name}` : 'New training job'),
      field('Name', 'name', this.name),
      field('Specs', 'specs', this.specs, 'the first that can start now wins'),
      field('Mode', 'mode', this.mode),
      h('div', { class: 'ma-row' }, field('Nodes', 'nodes', this.nodes), field('Parameter servers', 'ps', this.ps)),
      field('Command', 'command', this.command),
      field('Algorithm folder', 'algorithm', this.algorithm),
      field('Outputs folder', 'outputs', this.outputs),
      h(
        'div',
        { class: 'ma-field ma-field-mounts', 'data-field': 'mounts' },
        h('span', { class: 'ma-field-label' }, 'Mounts'),
        this.mounts,
        h(
          'button',
          { class: 'jp-Button jp-mod-minimal ma-add-mount', type: 'button', onclick: () => this.addMount() },
          '+ mount'
        )
      ),
      h('div', { class: 'ma-row' }, field('Priority', 'priority', this.priority), field('Duration', 'duration', this.duration)),
      h(
        'div',
        { class: 'ma-actions' },
        this.submitButton,
        h(
          'button',
          { class: 'jp-Button jp-mod-styled ma-dry-run', type: 'button', onclick: () => void this.dryRun() },
          'Dry run'
        ),
        h('button', { class: 'jp-Button jp-mod-styled jp-mod-reject ma-cancel', type: 'button', onclick: () => this.cancel() }, 'Cancel')
      ),
      this.message
    );
    if (template) {
      this.fill(template);
    }
    this.syncMode();
    void this.loadSpecs(template?.specs);
  }

  private async loadSpecs(selected?: string[]): Promise<void> {
    try {
      const specs = await api.specs();
      const chosen = new Set(selected && selected.length ? selected : specs.length ? [specs[0].name] : []);
      this.specs.replaceChildren(
        ...specs.map(s => {
          const option = h(
            'option',
            { value: s.name, title: s.description || '' },
            `${s.name} (${s.cpus} CPU, ${s.memory_gb} GB${s.accelerators ? `, ${s.accelerators} ${s.accelerator_type}` : ''})`
          );
          option.selected = chosen.has(s.name);
          return option;
        })
      );
    } catch (error) {
      this.show(`Cannot load the specs: ${errorText(error)}`, true);
    }
  }

  private syncMode(): void {
    const mode = this.mode.value as Mode;
    const tensorflow = mode === 'tensorflow';
    this.ps.disabled = !tensorflow;
    if (!tensorflow) {
      this.ps.value = '0';
    }
    this.nodes.disabled = mode === 'single';
    if (mode === 'single') {
      this.nodes.value = '1';
    }
  }

  private addMount(kind: MountKind = 'datasets', name = '', path = '', writable = false): void {
    const row: MountRow = {
      node: h('div', { class: 'ma-mount' }),
      kind: h('select', { class: 'jp-mod-styled' }, ...MOUNT_KINDS.map(([k, label]) => h('option', { value: k }, label))),
      name: h('input', { class: 'jp-mod-styled', type: 'text', placeholder: 'name', value: name }),
      path: h('input', { class: 'jp-mod-styled', type: 'text', placeholder: 'host path', value: path }),
      writable: h('input', { type: 'checkbox', title: 'dataset mounted read-write' })
    };
    row.kind.value = kind;
    row.writable.checked = writable;
    row.node.append(
      row.kind,
      row.name,
      row.path,
      h('label', { class: 'ma-mount-rw', title: 'datasets only: mount read-write' }, row.writable, 'rw'),
      h(
        'button',
        {
          class: 'jp-Button jp-mod-minimal',
          type: 'button',
          title: 'Remove',
          onclick: () => {
            row.node.remove();
            this.mountRows = this.mountRows.filter(r => r !== row);
          }
        },
        '×'
      )
    );
    this.mountRows.push(row);
    this.mounts.append(row.node);
  }

  private fill(spec: JobSpec): void {
    // keep what the form has no control for (env, image, restarts...) so a clone is faithful
    const { name, specs: _specs, mode, nodes, ps, command, algorithm, outputs, priority, duration, datasets, models, volumes, annotations, creator: _creator, ...rest } = spec;
    this.base = rest;
    this.name.value = cloneName(name);
    this.mode.value = mode ?? 'single';
    this.nodes.value = String(nodes ?? 1);
    this.ps.value = String(ps ?? 0);
    this.command.value = command ?? '';
    this.algorithm.value = algorithm ?? '';
    this.outputs.value = outputs ?? '';
    this.priority.value = priority ?? 'normal';
    this.duration.value = duration ? `${duration}` : '';
    for (const d of datasets ?? []) {
      this.addMount('datasets', d.name, d.path, d.read_only === false);
    }
    for (const m of models ?? []) {
      this.addMount('models', m.name, m.path);
    }
    for (const v of volumes ?? []) {
      this.addMount('volumes', v.name, v.path);
    }
    for (const a of annotations ?? []) {
      this.addMount('annotations', a.name, a.path);
    }
  }

  /** The JobSpec the form describes (only what the user set, plus a clone's other fields). */
  spec(): Partial<JobSpec> {
    const spec: Partial<JobSpec> = { ...this.base, name: this.name.value.trim() };
    const specs = [...this.specs.selectedOptions].map(o => o.value);
    if (specs.length) {
      spec.specs = specs;
    }
    spec.mode = this.mode.value as Mode;
    spec.nodes = Number(this.nodes.value || 1);
    if (spec.mode === 'tensorflow') {
      spec.ps = Number(this.ps.value || 0);
    }
    spec.command = this.command.value.trim();
    if (this.algorithm.value.trim()) {
      spec.algorithm = this.algorithm.value.trim();
    }
    if (this.outputs.value.trim()) {
      spec.outputs = this.outputs.value.trim();
    }
    spec.priority = this.priority.value as Priority;
    if (this.duration.value.trim()) {
      // the service accepts seconds or a text like 30m; the generated type says number
      (spec as Record<string, unknown>).duration = this.duration.value.trim();
    }
    for (const row of this.mountRows) {
      const kind = row.kind.value as MountKind;
      const mount: Record<string, unknown> = { name: row.name.value.trim(), path: row.path.value.trim() };
      if (kind === 'datasets' && row.writable.checked) {
        mount.read_only = false;
      }
      const list = ((spec as Record<string, unknown>)[kind] as unknown[] | undefined) ?? [];
      (spec as Record<string, unknown>)[kind] = [...list, mount];
    }
    return spec;
  }

  private show(text: string | HTMLElement, error = false, fieldName: string | null = null): void {
    this.message.replaceChildren(text);
    this.message.classList.toggle('ma-error', error);
    this.node.querySelectorAll('.ma-field-invalid').forEach(el => el.classList.remove('ma-field-invalid'));
    if (fieldName) {
      this.node.querySelector(`[data-field="${fieldName.split('.')[0]}"]`)?.classList.add('ma-field-invalid');
    }
  }

  private problem(error: unknown): void {
    if (error instanceof ApiError) {
      this.show(error.message, true, error.field);
    } else {
      this.show(errorText(error), true);
    }
  }

  private async dryRun(): Promise<void> {
    this.show('Resolving the plan…');
    try {
      const plan = await api.plan(this.spec());
      this.show(this.renderPlan(plan));
    } catch (error) {
      this.problem(error);
    }
  }

  private renderPlan(plan: Plan): HTMLElement {
    return h(
      'div',
      { class: 'ma-plan' },
      h(
        'div',
        {},
        `Spec ${plan.spec}: ${plan.can_start_now ? 'can start now' : `waits (${plan.queue_ahead ?? 0} ahead)`}`
      ),
      ...(plan.notes ?? []).map(n => h('div', { class: 'ma-plan-note' }, n)),
      ...plan.nodes.map(n =>
        h('details', {}, h('summary', {}, `${n.name} @ ${n.hostname}`), h('pre', {}, n.argv.join(' ')))
      )
    );
  }

  private async submit(): Promise<void> {
    this.submitButton.disabled = true;
    this.show('Submitting…');
    try {
      const job = await api.submit(this.spec());
      this.created(job);
    } catch (error) {
      this.problem(error);
    } finally {
      this.submitButton.disabled = false;
    }
  }

  dispose(): void {
    // nothing runs in the background
  }
}

/** The name a clone gets, as `ma_jupyter.models.clone_name` makes it: x, x-copy, x-copy-2... */
export function cloneName(name: string): string {
  const match = /-copy(?:-(\d+))?$/.exec(name);
  const base = match ? name.slice(0, match.index) : name;
  const number = match ? Number(match[1] ?? 1) + 1 : 1;
  const suffix = number === 1 ? '-copy' : `-copy-${number}`;
  return base.slice(0, 63 - suffix.length) + suffix;
}
