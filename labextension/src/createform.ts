/**
 * The create form in the main area (`data-ma-view="form"`): every field of a job spec, grouped as
 * the console groups them (what to run on first: specs, mode and nodes, then the code, its data,
 * interpreter and environment, lifecycle and access), checked as you type; the Submit button
 * stays in view at the form's bottom edge however far the form is scrolled.
 *
 * 1. Each change asks the service's dry run (`POST /plan`), debounced; only the newest answer
 *    is shown (an older one arriving late is dropped).
 * 2. A refused spec shows the service's own message at the field it names (`field`, e.g.
 *    `command`, `fault_restart`); a message without a known field shows above the buttons.
 * 3. An accepted spec shows the queue prediction ("Can start now" / "Would wait behind N jobs",
 *    with the plan's estimated start) and the per-node dry run: each node's role, host and
 *    cards, the command as written (shell-quoted), its working directory, environment and
 *    mounts (`details.ma-plan-node[data-node]`).
 * 4. "Submit" sends the same spec to `POST /jobs`.
 * 5. While nothing is typed the dry run of an accepted spec is asked again every few seconds,
 *    so the prediction follows jobs that start and end; a refused one waits for the next edit
 *    (asking again could only be refused again).
 * 6. The form is quiet until it has something to check: an empty form (no command, no tasks,
 *    nothing prefilled) that the user has not edited asks no dry run and shows no error, only
 *    what to fill in.
 *
 * Folder fields have a "Browse…" button (Lab's contents, see folderpicker.ts).  Specs are
 * checkboxes (several may be chosen: the first that fits starts), filtered by board model, with
 * the cards queued jobs ask for per model (from the cluster view).
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Widget } from '@lumino/widgets';

import { ApiError, api } from './api';
import { fetchCluster } from './cluster';
import { h } from './dom';
import { pickFolder } from './folderpicker';
import { count, dateTime, errorText } from './format';
import {
  ACCESS_VALUES,
  CONVENTION_VALUES,
  JOB_TYPE_VALUES,
  MODE_VALUES,
  PERF_POLICY_VALUES,
  PRIORITY_VALUES,
  MOUNT_FORMAT,
  MOUNT_LINE,
  READ_ONLY,
  READ_WRITE,
  TASK_SEPARATOR
} from './models';
import type { ClusterView, Job, JobSpec, NodeLaunch, Plan, Spec } from './models';

/**
 * Values the form starts from: submit-from-file fills algorithm and command; a clone gives the
 * whole spec of the job it copies (every field filled, the name made a clone's name).
 */
export interface FormPrefill {
  name?: string;
  algorithm?: string;
  command?: string;
  outputs?: string;
  spec?: JobSpec;
}

/** The name a clone gets, as `ma_jupyter.models.clone_name` makes it: x, x-copy, x-copy-2... */
export function cloneName(name: string): string {
  const match = /-copy(?:-(\d+))?$/.exec(name);
  const base = match ? name.slice(0, match.index) : name;
  const number = match ? Number(match[1] ?? 1) + 1 : 1;
  const suffix = number === 1 ? '-copy' : `-copy-${number}`;
  return base.slice(0, 63 - suffix.length) + suffix;
}

function getPath(source: Record<string, any>, key: string): unknown {
  let at: any = source;
  for (const part of key.split('.')) {
    at = at === null || at === undefined ? undefined : at[part];
  }
  return at;
}

/**
 * One mount as a line of a mounts field, in the CLI's and the notebook's format (generated from
 * ma_jupyter/spectext.py): `[SOURCE/]NAME[@VERSION]=PATH`, a writable dataset's path ending in `:rw`.
 */
function mountLine(mount: Record<string, any>, key: string): string {
  const source = mount.source ? `${mount.source}/` : '';
  const version = mount.version ? `@${mount.version}` : '';
  const suffix = key === 'datasets' && mount.read_only === false ? READ_WRITE : '';
  return `${source}${mount.name}${version}=${mount.path}${suffix}`;
}

/** The mount a line of the `key` field (datasets, models...) describes: `mountLine` read back. */
function parseMount(line: string, key: string): Record<string, unknown> {
  const groups = MOUNT_LINE.exec(line)?.groups;
  if (!groups) {
    // not a mount line: the service's answer names the field, whose label shows the format
    return { name: line, path: '' };
  }
  let path = groups.path;
  const mount: Record<string, unknown> = { name: groups.name };
  const suffix = [READ_WRITE, READ_ONLY].find(s => path.endsWith(s));
  if (key === 'datasets' && suffix) {
    mount.read_only = suffix === READ_ONLY;
    path = path.slice(0, -suffix.length);
  } else if (key === 'models' && path.endsWith(READ_ONLY)) {
    path = path.slice(0, -READ_ONLY.length); // models are read-only anyway
  }
  mount.path = path;
  if (groups.source) {
    mount.source = groups.source; // a wrong one is the service's 400 at the field
  }
  if (groups.version) {
    mount.version = groups.version;
  }
  return mount;
}

/** A task as a line of the tasks field: `ALGO_DIR::COMMAND`, or the bare command. */
function taskLine(task: Record<string, any>): string {
  return task.algorithm ? `${task.algorithm}${TASK_SEPARATOR}${task.command}` : task.command;
}

type Kind = 'text' | 'number' | 'select' | 'check' | 'area' | 'path' | 'env' | 'mounts' | 'tasks';

interface FieldDef {
  /** Dotted spec path (`lifecycle.on_start`); also the `data-field` hook. */
  key: string;
  label: string;
  kind: Kind;
  values?: ReadonlyArray<string>;
  hint?: string;
  placeholder?: string;
}

const GROUPS: Array<{ id: string; title: string; fields: FieldDef[] }> = [
  {
    id: 'basics',
    title: 'Basics',
    fields: [
      { key: 'name', label: 'Name', kind: 'text', hint: "letters, digits, '-', '_', '.'" },
      { key: 'type', label: 'Type', kind: 'select', values: JOB_TYPE_VALUES },
      { key: 'priority', label: 'Priority', kind: 'select', values: PRIORITY_VALUES }
    ]
  },
  {
    id: 'resources',
    title: 'Specs, mode and nodes',
    fields: [
      { key: 'mode', label: 'Mode', kind: 'select', values: MODE_VALUES },
      { key: 'nodes', label: 'Nodes', kind: 'number' },
      { key: 'ps', label: 'Parameter servers (TensorFlow)', kind: 'number' },
      { key: 'chief', label: 'Chief task (TensorFlow)', kind: 'check' },
      { key: 'convention', label: 'Launch convention', kind: 'select', values: CONVENTION_VALUES },
      { key: 'node_name', label: 'Node name', kind: 'text', hint: 'empty: the scheduler picks' },
      { key: 'driver_version', label: 'Driver version (GPU/MLU specs)', kind: 'text' },
      { key: 'pool', label: 'Resource pool', kind: 'text' }
    ]
  },
  {
    id: 'code',
    title: 'Code and command',
    fields: [
      { key: 'algorithm', label: 'Algorithm folder (/workspace/algorithm)', kind: 'path' },
      { key: 'algorithm_read_only', label: 'Algorithm folder read-only', kind: 'check' },
      {
        key: 'command',
        label: 'Command',
        kind: 'area',
        placeholder: 'e.g. python train.py --lr 0.1',
        hint: 'starts with an executable; use bash -c "…" for several statements'
      },
      {
        key: 'tasks',
        label: `Batch tasks (one per line: command, or ALGO_DIR${TASK_SEPARATOR}COMMAND)`,
        kind: 'tasks',
        placeholder: `e.g. /data/a${TASK_SEPARATOR}python train.py`
      },
      { key: 'workdir', label: 'Working directory in the node', kind: 'text', placeholder: 'default: /workspace/algorithm' }
    ]
  },
  {
    id: 'data',
    title: 'Data and mounts',
    fields: [
      { key: 'outputs', label: 'Outputs folder (/workspace/outputs), or s3://BUCKET/PREFIX', kind: 'path' },
      {
        key: 'datasets',
        label: `Datasets (${MOUNT_FORMAT}[${READ_WRITE}] per line; SOURCE private|favorite)`,
        kind: 'mounts',
        placeholder: 'e.g. mnist@v2=/data/mnist or mnist=s3://bucket/mnist'
      },
      {
        key: 'models',
        label: `Models (${MOUNT_FORMAT} per line; SOURCE pretrained|private|favorite)`,
        kind: 'mounts'
      },
      { key: 'volumes', label: 'Volumes (NAME=PATH per line)', kind: 'mounts' },
      { key: 'annotations', label: 'Annotations (NAME=PATH per line)', kind: 'mounts' },
      { key: 'data_preparation', label: 'Prepare data before training (datasets read-only)', kind: 'check' },
      {
        key: 'storage_env',
        label: "Give the job my object storage credentials (AWS_*, the Jupyter server's)",
        kind: 'check'
      }
    ]
  },
  {
    id: 'environment',
    title: 'Interpreter and environment',
    fields: [
      { key: 'image.python', label: 'Image: Python interpreter', kind: 'text' },
      { key: 'image.venv', label: 'Image: virtualenv folder', kind: 'path' },
      { key: 'image.conda_env', label: 'Image: conda environment', kind: 'text' },
      { key: 'image.name', label: 'Image: registered image (ma-jupyter images list)', kind: 'text' },
      { key: 'env', label: 'Environment (KEY=VALUE per line)', kind: 'env' },
      { key: 'secret_env', label: 'Secret environment (KEY=VALUE per line, shown as ***)', kind: 'env' }
    ]
  },
  {
    id: 'lifecycle',
    title: 'Lifecycle and reliability',
    fields: [
      { key: 'duration', label: 'Duration', kind: 'text', placeholder: 'e.g. 30m, 2h, 1d', hint: 'empty: no limit' },
      { key: 'grace_period', label: 'Grace period on stop (s)', kind: 'number' },
      { key: 'lifecycle.on_start', label: 'On start (each node)', kind: 'text' },
      { key: 'lifecycle.on_stop', label: 'On stop (each node)', kind: 'text' },
      { key: 'fault_restart', label: 'Restart on failure', kind: 'check' },
      { key: 'fault_restart.max_restarts', label: 'Max restarts', kind: 'number' },
      { key: 'checkpoint_resume', label: 'Resume from checkpoint', kind: 'check' },
      { key: 'checkpoint_resume.max_resumes', label: 'Max resumes', kind: 'number' },
      { key: 'checkpoint_resume.grace_period', label: 'Resume grace period (s)', kind: 'number' },
      { key: 'checkpoint_resume.elastic_min_nodes', label: 'Elastic: fewest nodes', kind: 'number' },
      { key: 'checkpoint_resume.allow_scale_up', label: 'Elastic: allow scale-up', kind: 'check' },
      { key: 'checkpoint_resume.perf_threshold', label: 'Performance threshold', kind: 'number' },
      { key: 'checkpoint_resume.perf_policy', label: 'Performance policy', kind: 'select', values: PERF_POLICY_VALUES },
      { key: 'debug_terminal', label: 'Keep a debug terminal', kind: 'check' }
    ]
  },
  {
    id: 'access',
    title: 'Access',
    fields: [
      {
        key: 'access',
        label: 'Other users may',
        kind: 'select',
        values: ACCESS_VALUES,
        hint: 'rw: read and change · ro: read · none: not see it'
      }
    ]
  }
];

/** Defaults shown in the form (the spec's own defaults). */
const DEFAULTS: Record<string, string | boolean> = {
  type: 'regular',
  priority: 'normal',
  algorithm_read_only: true,
  mode: 'single',
  nodes: '1',
  ps: '0',
  convention: 'platform',
  grace_period: '10',
  'fault_restart.max_restarts': '3',
  'checkpoint_resume.max_resumes': '3',
  'checkpoint_resume.grace_period': '30',
  'checkpoint_resume.perf_policy': 'alert',
  access: 'ro'
};

/** Debounce of the dry run while typing (ms). */
const PLAN_DELAY = 400;
/** The prediction is asked again this often while nothing is typed (ms): jobs start and end. */
const REPLAN = 5000;

type Control = HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement;

function defaultName(): string {
  const now = new Date();
  const pad = (n: number) => String(n).padStart(2, '0');
  return `job-${pad(now.getMonth() + 1)}${pad(now.getDate())}-${pad(now.getHours())}${pad(now.getMinutes())}${pad(now.getSeconds())}`;
}

function setPath(target: Record<string, any>, key: string, value: unknown): void {
  const parts = key.split('.');
  let at = target;
  for (const part of parts.slice(0, -1)) {
    at[part] = at[part] ?? {};
    at = at[part];
  }
  at[parts[parts.length - 1]] = value;
}

function lines(text: string): string[] {
  return text
    .split('\n')
    .map(l => l.trim())
    .filter(l => l && !l.startsWith('#'));
}

/** A word as a shell reads it back: quoted when it holds anything but safe characters. */
function shellWord(word: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, "'\\''")}'`;
}

/**
 * One node of the dry run, as the CLI's `--dry-run` shows it (render.plan_text): what it runs
 * (the command as written, shell-quoted, wrapped at spaces only), where, its environment and its
 * mounts; the first node open, the others folded under their one-line summary.
 */
function planNode(node: NodeLaunch, open: boolean): HTMLElement {
  const where = [node.host || node.hostname, node.devices?.length ? `cards ${node.devices.join(',')}` : ''];
  const env = Object.entries(node.env ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const mounts = node.mounts ?? [];
  const item = (label: string, value: Node | string) =>
    [h('dt', {}, label), h('dd', {}, typeof value === 'string' ? h('pre', {}, value) : value)];
  return h(
    'details',
    { class: 'ma-plan-node', 'data-node': node.name, open },
    h(
      'summary',
      {},
      `${node.name} · ${node.role} ${node.index}${node.primary === false ? ' (auxiliary)' : ''} · ${where.filter(Boolean).join(' · ')}`
    ),
    h(
      'dl',
      {},
      ...item('runs', node.argv.map(shellWord).join(' ')),
      ...(node.workdir ? item('in', node.workdir) : []),
      ...item(
        `env (${env.length})`,
        h('pre', { 'data-ma-plan': 'env' }, env.map(([k, v]) => `${k}=${v}`).join('\n') || '–')
      ),
      ...item(
        `mounts (${mounts.length})`,
        h(
          'pre',
          { 'data-ma-plan': 'mounts' },
          mounts
            .map(m => `${m.target} ← ${m.source} (${m.read_only ? 'ro' : 'rw'}${m.copy_of ? `, a copy of ${m.copy_of}` : ''})`)
            .join('\n') || '–'
        )
      )
    )
  );
}

export class CreateFormWidget extends Widget {
  private controls = new Map<string, Control>();
  private fields = new Map<string, HTMLElement>();
  private specBox: HTMLElement;
  private modelBox: HTMLElement;
  private specs: Spec[] = [];
  private cluster: ClusterView | null = null;
  private chosenSpecs = new Set<string>(['cpu.small']);
  private chosenModels = new Set<string>();
  private prediction: HTMLElement;
  private dryRun: HTMLElement;
  private message: HTMLElement;
  private submitButton: HTMLButtonElement;
  private timer: number | undefined;
  private asked = 0;
  /** Whether the user changed a field (rule 6). */
  private edited = false;
  /** Whether the newest dry run accepted the spec (rule 5). */
  private accepted = false;

  constructor(
    private app: JupyterFrontEnd,
    prefill: FormPrefill = {}
  ) {
    super();
    this.id = `ma-create-form-${Date.now()}`;
    // several forms may be open (one per file submitted or job cloned): the tab names the job
    this.title.label = prefill.spec
      ? `Clone of ${prefill.spec.name}`
      : prefill.name
        ? `New job: ${prefill.name}`
        : 'New training job';
    this.title.closable = true;
    this.addClass('ma-main');
    this.addClass('ma-create');
    this.node.setAttribute('data-ma-view', 'form');

    this.specBox = h('div', { class: 'ma-spec-choices', 'data-field': 'specs' });
    this.modelBox = h('div', { class: 'ma-model-choices', 'data-field': 'model' });
    this.prediction = h('div', { class: 'ma-prediction', 'data-ma-prediction': '' }, 'Checking…');
    this.dryRun = h('div', { class: 'ma-dryrun' });
    this.message = h('div', { class: 'ma-message', 'data-ma-form-message': '' });
    this.submitButton = h(
      'button',
      { class: 'jp-mod-styled jp-mod-accept', 'data-ma-action': 'submit', onclick: () => void this.submit() },
      'Submit'
    );

    const groups = GROUPS.map(group => {
      const body = h('div', { class: 'ma-group-body' });
      if (group.id === 'resources') {
        body.append(
          h(
            'div',
            { class: 'ma-field ma-field-wide', 'data-field': 'specs' },
            h('span', { class: 'ma-field-label' }, 'Specs (several: the first that fits starts)'),
            this.modelBox,
            this.specBox
          )
        );
      }
      for (const def of group.fields) {
        body.append(this.buildField(def));
      }
      return h(
        'fieldset',
        { class: 'ma-group', 'data-group': group.id },
        h('legend', {}, group.title),
        body
      );
    });

    const side = h(
      'aside',
      { class: 'ma-create-side' },
      h('h3', {}, 'Queue prediction'),
      this.prediction,
      h('h3', {}, 'Dry run, per node'),
      this.dryRun
    );
    this.node.append(
      h(
        'div',
        { class: 'ma-create-layout' },
        h(
          'div',
          { class: 'ma-create-main' },
          h('h2', { class: 'ma-view-title' }, prefill.spec ? `Clone of ${prefill.spec.name}` : 'New training job'),
          ...groups,
          this.message,
          h('div', { class: 'ma-buttons' }, this.submitButton)
        ),
        side
      )
    );

    this.value('name', prefill.name ?? defaultName());
    for (const [key, value] of Object.entries(DEFAULTS)) {
      this.value(key, value);
    }
    if (prefill.algorithm) {
      this.value('algorithm', prefill.algorithm);
    }
    if (prefill.command) {
      this.value('command', prefill.command);
    }
    if (prefill.outputs) {
      this.value('outputs', prefill.outputs);
    }
    if (prefill.spec) {
      this.fill(prefill.spec);
    }
    this.node.addEventListener('input', () => {
      this.edited = true;
      this.schedulePlan();
    });
    this.node.addEventListener('change', () => {
      this.edited = true;
      this.showRelevant();
      this.schedulePlan();
    });
    this.showRelevant();
    void this.loadCatalog();
  }

  /** Set a control's value (a checkbox takes a boolean). */
  value(key: string, value: string | boolean): void {
    const control = this.controls.get(key);
    if (!control) {
      return;
    }
    if (control instanceof HTMLInputElement && control.type === 'checkbox') {
      control.checked = Boolean(value);
    } else {
      control.value = String(value);
    }
  }

  /**
   * Fill every field from a job's spec (a clone). Secret values come back from the service as
   * `***`: they stay so, and the dry run (as the submit) refuses them at their field until the
   * real values are typed in.
   */
  private fill(spec: JobSpec): void {
    const source = spec as unknown as Record<string, any>;
    this.value('name', cloneName(spec.name));
    this.chosenSpecs = new Set(spec.specs?.length ? spec.specs : ['cpu.small']);
    for (const group of GROUPS) {
      for (const def of group.fields) {
        if (def.key === 'name') {
          continue;
        }
        const value = getPath(source, def.key);
        switch (def.kind) {
          case 'check':
            // fault_restart / checkpoint_resume are objects when enabled
            this.value(def.key, typeof value === 'boolean' ? value : value !== null && value !== undefined);
            break;
          case 'env':
            this.value(
              def.key,
              Object.entries((value as Record<string, string>) ?? {})
                .map(([k, v]) => `${k}=${v}`)
                .join('\n')
            );
            break;
          case 'mounts':
            this.value(def.key, ((value as any[]) ?? []).map(m => mountLine(m, def.key)).join('\n'));
            break;
          case 'tasks':
            this.value(
              def.key,
              ((value as any[]) ?? []).map(taskLine).join('\n')
            );
            break;
          default:
            if (value !== null && value !== undefined) {
              this.value(def.key, String(value));
            }
        }
      }
    }
  }

  /**
   * Show only the fields that apply: tasks for batch jobs (command otherwise), parameter
   * servers and chief for TensorFlow, the restart and resume settings once they are enabled.
   */
  private showRelevant(): void {
    const get = (key: string) => this.controls.get(key)!;
    const on = (key: string) => (get(key) as HTMLInputElement).checked;
    const batch = get('type').value === 'batch';
    const tensorflow = get('mode').value === 'tensorflow';
    const shown: Record<string, boolean> = {
      tasks: batch,
      command: !batch,
      ps: tensorflow,
      chief: tensorflow
    };
    for (const key of this.fields.keys()) {
      if (key.startsWith('fault_restart.')) {
        shown[key] = on('fault_restart');
      } else if (key.startsWith('checkpoint_resume.')) {
        shown[key] = on('checkpoint_resume');
      }
    }
    for (const [key, visible] of Object.entries(shown)) {
      this.fields.get(key)?.classList.toggle('ma-hidden', !visible);
    }
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    this.asked++; // answers still on their way are dropped
    super.dispose();
  }

  private buildField(def: FieldDef): HTMLElement {
    let control: Control;
    let extra: HTMLElement | null = null;
    switch (def.kind) {
      case 'select':
        control = h('select', {}, ...(def.values ?? []).map(v => h('option', { value: v }, v)));
        break;
      case 'check':
        control = h('input', { type: 'checkbox' });
        break;
      case 'area':
      case 'env':
      case 'mounts':
      case 'tasks':
        control = h('textarea', { rows: def.kind === 'area' ? 2 : 2, placeholder: def.placeholder ?? '' });
        break;
      case 'number':
        control = h('input', { type: 'number', placeholder: def.placeholder ?? '' });
        break;
      default:
        control = h('input', { type: 'text', placeholder: def.placeholder ?? '' });
    }
    control.setAttribute('data-ma-input', def.key);
    if (def.kind === 'path') {
      extra = h(
        'button',
        {
          class: 'jp-mod-styled ma-browse',
          'data-ma-browse': def.key,
          onclick: async (e: Event) => {
            e.preventDefault();
            const chosen = await pickFolder(
              this.app.serviceManager.contents,
              `Choose the ${def.label.toLowerCase()}`,
              control.value
            );
            if (chosen !== null) {
              control.value = chosen;
              this.schedulePlan();
            }
          }
        },
        'Browse…'
      );
    }
    this.controls.set(def.key, control);
    const check = def.kind === 'check';
    const node = h(
      'label',
      {
        class: `ma-field ${check ? 'ma-field-check' : ''} ${['area', 'tasks', 'path'].includes(def.kind) ? 'ma-field-wide' : ''}`,
        'data-field': def.key
      },
      check ? control : null,
      h('span', { class: 'ma-field-label' }, def.label),
      check ? null : extra ? h('span', { class: 'ma-path' }, control, extra) : control,
      def.hint ? h('span', { class: 'ma-field-hint' }, def.hint) : null,
      h('span', { class: 'ma-field-error' })
    );
    this.fields.set(def.key, node);
    return node;
  }

  private async loadCatalog(): Promise<void> {
    try {
      [this.specs, this.cluster] = await Promise.all([api.specs(), fetchCluster()]);
    } catch (error) {
      this.message.textContent = `Could not load the specs: ${errorText(error)}`;
      return;
    }
    this.renderSpecs();
    this.schedulePlan(0);
  }

  private renderSpecs(): void {
    const cluster = this.cluster;
    const models = cluster?.models ?? [];
    const demand = cluster?.demand ?? {};
    this.modelBox.replaceChildren(
      ...(models.length ? [h('span', { class: 'ma-field-hint' }, 'Board model:')] : []),
      ...models.map(model =>
        h(
          'label',
          { class: 'ma-chip', 'data-model': model },
          h('input', {
            type: 'checkbox',
            checked: this.chosenModels.has(model),
            onchange: (e: Event) => {
              (e.target as HTMLInputElement).checked ? this.chosenModels.add(model) : this.chosenModels.delete(model);
              this.renderSpecs();
            }
          }),
          `${model} · ${count(demand[model] ?? 0, 'card')} queued`
        )
      )
    );
    const room = new Map((cluster?.specs ?? []).map(r => [r.spec.name, r]));
    const shown = this.specs.filter(
      s =>
        !this.chosenModels.size ||
        (room.get(s.name)?.models ?? []).some(m => this.chosenModels.has(m)) ||
        this.chosenSpecs.has(s.name)
    );
    this.specBox.replaceChildren(
      ...shown.map(spec => {
        const r = room.get(spec.name);
        const cards = spec.accelerators ? ` · ${spec.accelerators} ${spec.accelerator_type}` : '';
        return h(
          'label',
          { class: 'ma-spec-choice', 'data-spec': spec.name },
          h('input', {
            type: 'checkbox',
            checked: this.chosenSpecs.has(spec.name),
            onchange: (e: Event) => {
              (e.target as HTMLInputElement).checked
                ? this.chosenSpecs.add(spec.name)
                : this.chosenSpecs.delete(spec.name);
            }
          }),
          h('b', {}, spec.name),
          ` ${count(spec.cpus, 'core')} · ${spec.memory_gb} GB${cards}`,
          h('span', { class: 'ma-field-hint' }, r ? ` · ${r.can_start} more can start now` : '')
        );
      })
    );
  }

  /** The spec the form says, as the service's JSON (empty fields left out: their defaults). */
  spec(): Partial<JobSpec> {
    const out: Record<string, any> = { specs: [...this.chosenSpecs] };
    const enabled = (key: string) => (this.controls.get(key) as HTMLInputElement).checked;
    for (const group of GROUPS) {
      for (const def of group.fields) {
        const control = this.controls.get(def.key)!;
        if (this.fields.get(def.key)?.classList.contains('ma-hidden')) {
          continue; // does not apply (e.g. tasks of a regular job)
        }
        const top = def.key.split('.')[0];
        if ((top === 'fault_restart' || top === 'checkpoint_resume') && def.key !== top) {
          if (!enabled(top)) {
            continue;
          }
        }
        if (def.kind === 'check') {
          const checked = (control as HTMLInputElement).checked;
          if (def.key === 'fault_restart' || def.key === 'checkpoint_resume') {
            if (checked) {
              out[def.key] = out[def.key] ?? {};
            }
          } else {
            setPath(out, def.key, checked);
          }
          continue;
        }
        const text = control.value.trim();
        if (!text) {
          continue;
        }
        switch (def.kind) {
          case 'number':
            setPath(out, def.key, Number(text));
            break;
          case 'env': {
            const env: Record<string, string> = {};
            for (const line of lines(text)) {
              const at = line.indexOf('=');
              env[at < 0 ? line : line.slice(0, at)] = at < 0 ? '' : line.slice(at + 1);
            }
            out[def.key] = env;
            break;
          }
          case 'mounts':
            out[def.key] = lines(text).map(line => parseMount(line, def.key));
            break;
          case 'tasks':
            out.tasks = lines(text).map(line => {
              const at = line.indexOf(TASK_SEPARATOR);
              return at < 0
                ? { command: line }
                : {
                    algorithm: line.slice(0, at).trim(),
                    command: line.slice(at + TASK_SEPARATOR.length).trim()
                  };
            });
            break;
          default:
            setPath(out, def.key, text);
        }
      }
    }
    return out as Partial<JobSpec>;
  }

  private schedulePlan(delay = PLAN_DELAY): void {
    window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => void this.plan(), delay);
  }

  private showError(error: unknown): void {
    for (const node of this.fields.values()) {
      node.classList.remove('ma-field-invalid');
      node.querySelector('.ma-field-error')!.textContent = '';
    }
    this.node.querySelector('[data-field="specs"].ma-field')?.classList.remove('ma-field-invalid');
    this.message.textContent = '';
    this.message.classList.remove('ma-error');
    if (!error) {
      return;
    }
    const text = errorText(error);
    const name = error instanceof ApiError ? error.field : null;
    let target = name ? this.fields.get(name) : undefined;
    if (!target && name) {
      // the service names the top-level field (`fault_restart`); its first input shows it
      target = [...this.fields.entries()].find(([key]) => key.startsWith(`${name}.`))?.[1];
    }
    if (name === 'specs') {
      const box = this.node.querySelector('[data-field="specs"].ma-field') as HTMLElement;
      box.classList.add('ma-field-invalid');
      this.message.textContent = text;
      this.message.classList.add('ma-error');
      return;
    }
    if (target) {
      target.classList.add('ma-field-invalid');
      target.querySelector('.ma-field-error')!.textContent = text;
    } else {
      this.message.textContent = text;
      this.message.classList.add('ma-error');
    }
  }

  private async plan(): Promise<void> {
    const asked = ++this.asked;
    try {
      await this.planOnce(asked);
    } finally {
      if (asked === this.asked && !this.isDisposed && this.accepted) {
        this.schedulePlan(REPLAN);
      }
    }
  }

  private async planOnce(asked: number): Promise<void> {
    // the spec counts and queued demand change as jobs start and end: refresh them alongside
    fetchCluster()
      .then(cluster => {
        if (!this.isDisposed) {
          this.cluster = cluster;
          this.renderSpecs();
        }
      })
      .catch(() => undefined); // the dry run below reports an unreachable service
    const spec = this.spec();
    if (!this.edited && !spec.command && !(spec.tasks ?? []).length) {
      // rule 6: nothing to check yet; say what to fill in, no error and no request
      this.accepted = false;
      this.showError(null);
      this.prediction.replaceChildren(
        h('div', {}, 'Type the command to run (or the tasks of a batch job) to see where and when the job would start.')
      );
      this.prediction.onclick = null;
      this.prediction.setAttribute('data-state', 'empty');
      this.dryRun.replaceChildren();
      return;
    }
    let plan: Plan;
    try {
      plan = await api.plan(spec);
    } catch (error) {
      if (asked !== this.asked) {
        return;
      }
      this.accepted = false;
      this.showError(error);
      // the field may be scrolled away: say which one, and take the user there on a click
      const name = error instanceof ApiError ? error.field : null;
      this.prediction.replaceChildren(
        h('div', {}, name ? `Fix ${name} to see the prediction:` : 'Fix the form to see the prediction:'),
        h('div', { class: 'ma-prediction-error' }, errorText(error))
      );
      this.prediction.onclick = () =>
        this.node.querySelector('.ma-field-invalid, .ma-message.ma-error')?.scrollIntoView({ block: 'center' });
      this.prediction.setAttribute('data-state', 'invalid');
      this.dryRun.replaceChildren();
      return;
    }
    if (asked !== this.asked) {
      return; // a newer question was asked meanwhile
    }
    this.accepted = true;
    this.showError(null);
    this.renderPlan(plan);
  }

  private renderPlan(plan: Plan): void {
    const when = plan.estimated_start ? dateTime(plan.estimated_start) : null;
    let text: string;
    if (plan.can_start_now) {
      text = `Can start now (spec ${plan.spec})`;
      this.prediction.setAttribute('data-state', 'now');
    } else {
      text =
        (plan.queue_ahead ?? 0) > 0
          ? `Would wait behind ${count(plan.queue_ahead ?? 0, 'job')}`
          : 'Would wait for running jobs to free resources';
      text += when ? ` · estimated start ${when}` : ' · start unknown (running jobs have no duration)';
      this.prediction.setAttribute('data-state', 'wait');
    }
    this.prediction.textContent = text;
    this.dryRun.replaceChildren(
      ...plan.nodes.map((node, i) => planNode(node, i === 0)),
      ...(plan.notes ?? []).map(note => h('div', { class: 'ma-field-hint' }, note))
    );
  }

  private async submit(): Promise<void> {
    window.clearTimeout(this.timer);
    this.submitButton.disabled = true;
    let job: Job;
    try {
      job = await api.submit(this.spec());
    } catch (error) {
      this.showError(error);
      this.submitButton.disabled = false;
      return;
    }
    this.submitButton.disabled = false;
    this.showError(null);
    this.message.replaceChildren(
      h('span', { 'data-job-id': job.id, 'data-ma-submitted': '' }, `Submitted ${job.spec.name} (${job.id}): ${job.status}`)
    );
    if (this.app.commands.hasCommand('ma-jupyter:open-job')) {
      void this.app.commands.execute('ma-jupyter:open-job', { id: job.id });
    }
  }
}
