/**
 * The job page's operations bar: Stop, Delete, Clone, Change priority, Change duration,
 * Create dev environment, Open TensorBoard, Terminal (`button.ma-op[data-op=KEY]`).
 *
 * 1. After every read of the job each button is enabled or disabled, the reason as its
 *    tooltip: first the caller's access (the job's `allowed`, as the service answers it), then
 *    the job's state. The service still checks each request; a refusal becomes the message.
 * 2. Stop and Delete ask first; Delete of a job that still runs stops it first (`force`) and
 *    closes the page.
 * 3. Terminal (a job submitted with a debug terminal, running or failed) opens a JupyterLab
 *    terminal tab inside a node's sandbox (debugterminal.ts), asking which node when several.
 * 4. Create dev environment offers two things: the job's own environment (a dev environment job
 *    with the sandbox of the node chosen, running a Jupyter kernel: the server extension starts
 *    it and installs its kernelspec, and a new notebook opens on that kernel; the job's owner or
 *    an admin only, as it runs with the job's secrets), or a notebook that submits the job again,
 *    saved at the Lab root under a name no notebook has yet, and opened.
 * 5. A dev environment's page names the job and node it is the environment of.
 */
import { Dialog, InputDialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { ApiError, api, requestAPI } from './api';
import { LAB } from './commands';
import { openDebugTerminal } from './debugterminal';
import { h } from './dom';
import { span } from './format';
import { isTerminal } from './jobstate';
import type { JobPage, TabKey } from './jobpage-tab';
import type { Job } from './models';

/** What the operations do to the page beyond what a tab may. */
export interface OperatedPage extends JobPage {
  /** take `job` as the job read last and render the page */
  setJob(job: Job): void;
  showTab(tab: TabKey): void;
  /** show `text` on the message line */
  say(text: string): void;
  /** close the page */
  dispose(): void;
}

export class Operations {
  readonly node: HTMLElement;
  private buttons: Record<string, HTMLButtonElement> = {};

  constructor(private readonly page: OperatedPage) {
    const op = (key: string, label: string, run: () => Promise<void>, cls = '') => {
      const button = h(
        'button',
        {
          class: `jp-Button jp-mod-styled ma-op ma-op-${key} ${cls}`,
          'data-op': key,
          onclick: () => void this.page.act(run)
        },
        label
      );
      this.buttons[key] = button;
      return button;
    };
    this.node = h(
      'div',
      { class: 'ma-ops' },
      op('stop', 'Stop', () => this.stop(), 'jp-mod-warn'),
      op('delete', 'Delete', () => this.remove(), 'jp-mod-warn'),
      op('clone', 'Clone', async () => this.page.host.clone(this.page.job.spec)),
      op('priority', 'Change priority', () => this.changePriority()),
      op('duration', 'Change duration', () => this.changeDuration()),
      op('devenv', 'Create dev environment', () => this.devenv()),
      op('tensorboard', 'Open TensorBoard', async () => this.page.showTab('tensorboard')),
      op('terminal', 'Terminal', () => this.terminal())
    );
  }

  /** Why the operation `key` is unavailable now (its disabled button's tooltip), or null. */
  unavailable(key: string): string | null {
    const button = this.buttons[key];
    return button.disabled ? button.title : null;
  }

  /** Enable or disable each button for the job as read last (rule 1). */
  render(): void {
    const job = this.page.job;
    const status = job.status ?? 'queued';
    // the caller's access first (the service says what it may do), then the job's state
    const allowed = new Set(job.allowed ?? []);
    const owner = job.spec.creator ? `${job.spec.creator}’s` : 'another user’s';
    const disable = (key: string, reason: string | null, op: string | null = key) => {
      if (op !== null && job.allowed?.length && !allowed.has(op)) {
        reason =
          op === 'shell'
            ? `a debug terminal is for the job’s owner or an admin (this is ${owner} job)`
            : `this is ${owner} job and it allows others ${job.spec.access ?? 'ro'} access: ask its owner`;
      }
      this.buttons[key].disabled = reason !== null;
      this.buttons[key].title = reason ?? '';
    };
    const ended = isTerminal(job);
    disable('stop', ended ? `the job has ended (${status})` : null);
    disable('delete', null);
    disable('clone', null, 'view');
    disable('priority', status === 'queued' ? null : 'only a queued job’s priority can change');
    disable('duration', ended ? 'only a queued or running job’s duration can change' : null);
    disable('devenv', null, 'view');
    disable('tensorboard', job.outputs_folder || job.spec.outputs ? null : 'the job has no outputs folder');
    disable(
      'terminal',
      !job.spec.debug_terminal
        ? 'the job was submitted without a debug terminal (--debug-terminal)'
        : status === 'running' || status === 'error'
          ? null
          : 'a debug terminal opens while the job runs (or while a failed node keeps its sandbox)',
      'shell'
    );
    if (!this.buttons.delete.disabled) {
      this.buttons.delete.title = ended ? '' : 'Stops the job first, then deletes it';
    }
  }

  private async stop(): Promise<void> {
    const job = this.page.job;
    const answer = await showDialog({
      title: `Stop ${job.spec.name}?`,
      body: 'Its nodes get SIGTERM, then SIGKILL after the grace period. Logs and outputs stay.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
    });
    if (!answer.button.accept) {
      return;
    }
    this.page.setJob(await api.stop(this.page.job.id));
  }

  private async remove(): Promise<void> {
    const job = this.page.job;
    const running = !isTerminal(job);
    const answer = await showDialog({
      title: `Delete ${job.spec.name}?`,
      body: running
        ? 'The job still runs: it will be stopped first. Its logs and job folder are removed.'
        : 'Its logs and job folder are removed.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: running ? 'Stop and delete' : 'Delete' })]
    });
    if (!answer.button.accept) {
      return;
    }
    await api.remove(this.page.job.id, running);
    this.page.dispose();
  }

  private async ask(title: string, label: string, input: HTMLInputElement | HTMLSelectElement): Promise<string | null> {
    const body = new Widget({ node: h('label', { class: 'ma-dialog-field' }, label, input) });
    const answer = await showDialog({ title, body, buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Change' })] });
    return answer.button.accept ? input.value : null;
  }

  private async changePriority(): Promise<void> {
    const select = h(
      'select',
      { class: 'jp-mod-styled ma-priority-select' },
      ...['normal', 'urgent', 'very-urgent'].map(p => h('option', { value: p }, p))
    );
    select.value = this.page.job.spec.priority ?? 'normal';
    const value = await this.ask(`Priority of ${this.page.job.spec.name}`, 'Priority ', select);
    if (value !== null) {
      this.page.setJob(await api.update(this.page.job.id, { priority: value }));
      this.page.say(`Priority set to ${value}; queue position ${(this.page.job.queue_position ?? 0) + 1}.`);
    }
  }

  private async changeDuration(): Promise<void> {
    const input = h('input', {
      class: 'jp-mod-styled ma-duration-input',
      placeholder: 'seconds, or 30m, 2h, 1d',
      value: this.page.job.spec.duration ? String(this.page.job.spec.duration) : ''
    });
    const value = await this.ask(`Duration of ${this.page.job.spec.name}`, 'Duration ', input);
    if (value !== null && value.trim()) {
      this.page.setJob(await api.update(this.page.job.id, { duration: value.trim() }));
      this.page.say(`Duration set to ${span(this.page.job.spec.duration ?? 0)}.`);
    }
  }

  /** A terminal tab inside a node's sandbox (the node asked for when the job has several). */
  private async terminal(): Promise<void> {
    const nodes = (this.page.job.nodes ?? []).map(n => n.name);
    let node = nodes[0] ?? 'worker-0';
    if (nodes.length > 1) {
      const picked = await InputDialog.getItem({ title: 'Debug terminal of node', items: nodes, current: 0 });
      if (!picked.button.accept || !picked.value) {
        return;
      }
      node = picked.value;
    }
    await openDebugTerminal(this.page.host.app, this.page.job.id, node);
    this.page.say(`Opened the debug terminal of ${node} in a tab.`);
  }

  /** The nodes a dev environment may be made of: the launched ones, else those the spec asks for. */
  private nodeNames(): string[] {
    const job = this.page.job;
    if (job.nodes?.length) {
      return job.nodes.map(n => n.name);
    }
    if (job.spec.type === 'batch') {
      return (job.spec.tasks ?? []).map((_t, i) => `task-${i}`);
    }
    const names: string[] = [];
    if (job.spec.mode === 'tensorflow') {
      for (let i = 0; i < (job.spec.ps ?? 0); i++) names.push(`ps-${i}`);
      if (job.spec.chief) names.push('chief-0');
    }
    for (let i = 0; i < (job.spec.nodes ?? 1); i++) names.push(`worker-${i}`);
    return names;
  }

  /** Rule 4: the job's own environment as a kernel, or the re-submit notebook. */
  private async devenv(): Promise<void> {
    const job = this.page.job;
    const own = !job.allowed?.length || job.allowed.includes('shell');
    const names = this.nodeNames();
    const select = h(
      'select',
      { class: 'ma-devenv-node' },
      ...names.filter(n => !n.startsWith('ps-')).map(n => h('option', { value: n }, n))
    ) as HTMLSelectElement;
    const body = new Widget({
      node: h(
        'div',
        { class: 'ma-devenv-choice' },
        h(
          'p',
          {},
          own
            ? 'Open a notebook whose kernel runs inside a sandbox built as this job’s node (its image, mounts, env, spec and working copy), as a job of its own; or save a notebook that submits the job again.'
            : 'The job’s own environment runs with its secret variables: only its owner or an admin may open it. You may save a notebook that submits the job again as your own job.'
        ),
        own ? h('label', {}, 'Node: ', select) : h('span', {})
      )
    });
    const buttons = [Dialog.cancelButton(), Dialog.okButton({ label: 'Re-submit notebook', className: 'ma-devenv-notebook' })];
    if (own) {
      buttons.push(Dialog.okButton({ label: 'Kernel in the job’s node', className: 'ma-devenv-kernel' }));
    }
    const answer = await showDialog({ title: `Create dev environment of ${job.spec.name}`, body, buttons });
    if (!answer.button.accept) {
      return;
    }
    if (answer.button.label === 'Re-submit notebook') {
      await this.resubmitNotebook();
      return;
    }
    const made = await requestAPI<{ kernel_name: string; display_name: string; devenv: Job }>('devenv-kernel', {
      method: 'POST',
      body: JSON.stringify({ job: job.id, node: select.value }),
      headers: { 'Content-Type': 'application/json' }
    });
    const app = this.page.host.app;
    await app.serviceManager.kernelspecs.refreshSpecs();
    await app.commands.execute('notebook:create-new', { kernelName: made.kernel_name });
    this.page.say(
      `Started dev environment ${made.devenv.id} (${made.devenv.status}); opened a notebook on ${made.display_name}. ` +
        'Shutting its kernel down stops it.'
    );
  }

  /** Ask the service for the job as a notebook, save it at the Lab root and open it. */
  private async resubmitNotebook(): Promise<void> {
    const jobId = this.page.job.id;
    let answer: { name: string; notebook: any };
    try {
      answer = await api.devenv(jobId);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404 && error.message.startsWith('no such route')) {
        throw new Error('This job service cannot create dev environments yet (GET /jobs/{id}/devenv is missing): update ma_jupyter.');
      }
      throw error;
    }
    const app = this.page.host.app;
    const contents = app.serviceManager.contents;
    const stem = answer.name.replace(/\.ipynb$/, '').replace(/[^\w.-]+/g, '_') || this.page.job.id;
    let path = `${stem}.ipynb`;
    for (let n = 1; ; n++) {
      try {
        await contents.get(path, { content: false });
        path = `${stem}-${n}.ipynb`; // never overwrite a notebook
      } catch {
        break;
      }
    }
    await contents.save(path, { type: 'notebook', format: 'json', content: answer.notebook });
    await app.commands.execute(LAB.openDocument, { path });
    this.page.say(`Saved and opened ${path}.`);
  }
}
