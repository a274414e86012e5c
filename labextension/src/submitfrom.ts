/**
 * Main-area commands: the create form, the cluster view, and submitting from anywhere.
 *
 * - `ma-jupyter:create-job` opens the create form (args `algorithm`, `command`, `name` prefill
 *   it; `spec`, a job's whole spec, fills every field as a clone).
 * - `ma-jupyter:submit-file` ("Submit as training job", on `.py` files in the file browser's
 *   context menu) opens the form with algorithm = the file's folder and command = `python <file>`.
 * - `ma-jupyter:run-cell` ("Run cell as training job", also a notebook toolbar button through
 *   this plugin's `jupyter.lab.toolbars` setting) runs the active cell of the current notebook
 *   (else of the notebook that was current last) as `%%ma_train` in the notebook's own kernel,
 *   once that kernel is connected, so the job is exactly the magic's; a cell that already starts with
 *   `%%ma_train` runs as written.  What the magic prints is shown in a notification.
 * - `ma-jupyter:open-cluster` opens the cluster view.
 *
 * The file browser and notebook are reached through the shell's widgets (duck-typed), so the
 * extension needs no package beyond the ones it builds with.
 */
import type { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, Notification } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import type { Widget } from '@lumino/widgets';

import { ClusterWidget } from './cluster';
import { CREATE_JOB, OPEN_CLUSTER, OPEN_JOB, RUN_CELL, SUBMIT_FILE } from './commands';
import { CreateFormWidget, type FormPrefill } from './createform';
import { clusterIcon, newJobIcon } from './icons';
import { hostPath } from './labpaths';
import type { JobSpec } from './models';

/** The Lab path of the `.py` file selected in the file browser, if any. */
function selectedPythonFile(app: JupyterFrontEnd): string | null {
  for (const widget of app.shell.widgets('left')) {
    const browser = widget as any;
    if (typeof browser.selectedItems !== 'function') {
      continue;
    }
    for (const item of browser.selectedItems()) {
      if (item?.type === 'file' && String(item.path).endsWith('.py')) {
        return item.path as string;
      }
    }
  }
  return null;
}

/** Whether a shell widget is a notebook panel (duck-typed: its cells and its kernel session). */
function isNotebookPanel(widget: any): boolean {
  return !!widget && !widget.isDisposed && !!widget.sessionContext && !!widget.content && 'activeCell' in widget.content;
}

/**
 * The notebook the user worked in last.  A toolbar button's command runs with no widget of its
 * own, and by the time it runs the shell's current widget may be another tab (a restored
 * workspace, a notification's focus), so the last notebook that was current stands in for it.
 */
let lastNotebook: any = null;

function targetNotebook(app: JupyterFrontEnd): any {
  const current = app.shell.currentWidget as any;
  if (isNotebookPanel(current)) {
    return current;
  }
  return isNotebookPanel(lastNotebook) ? lastNotebook : null;
}

/** Seconds a command waits for a notebook's kernel that is still starting or connecting. */
const KERNEL_WAIT_S = 60;

/** The target notebook's active cell source and kernel, or the reason there is none. */
async function activeCell(app: JupyterFrontEnd): Promise<{ source: string; kernel: any } | string> {
  const panel = targetNotebook(app);
  const cell = panel?.content?.activeCell;
  if (!cell) {
    return 'Open a notebook and select the cell to run as a training job.';
  }
  if (cell.model?.type !== 'code') {
    return 'Select a code cell: only code runs as a training job.';
  }
  if (!panel.sessionContext.session?.kernel) {
    // a notebook that was just opened is still starting or connecting its kernel: wait for it
    // rather than refuse a click the user made on a notebook that looks ready
    const timeout = new Promise(resolve => setTimeout(resolve, KERNEL_WAIT_S * 1000));
    await Promise.race([panel.sessionContext.ready, timeout]);
  }
  const kernel = panel.sessionContext.session?.kernel;
  if (!kernel) {
    return 'The notebook has no running kernel: start one, then try again.';
  }
  return { source: cell.model.sharedModel.getSource() as string, kernel };
}

/** The `%%ma_train` cell the active cell becomes. */
export function asTrainCell(source: string): string {
  return source.trimStart().startsWith('%%ma_train') ? source : `%%ma_train\n${source}`;
}

async function runCell(app: JupyterFrontEnd): Promise<void> {
  const found = await activeCell(app);
  if (typeof found === 'string') {
    Notification.warning(found, { autoClose: 6000 });
    return;
  }
  const code = asTrainCell(found.source);
  if (!code.replace(/^%%ma_train.*\n?/, '').trim()) {
    Notification.warning('The cell is empty: write the training code first.', { autoClose: 6000 });
    return;
  }
  // the magic's extension, loaded as `%load_ext ma_jupyter` would (a no-op when it is loaded)
  await found.kernel.requestExecute({
    code: "get_ipython().extension_manager.load_extension('ma_jupyter')",
    silent: true,
    store_history: false
  }).done;
  const out: string[] = [];
  let jobId = '';
  const future = found.kernel.requestExecute({ code, silent: false, store_history: false });
  future.onIOPub = (msg: any) => {
    const kind = msg.header.msg_type;
    if (kind === 'stream') {
      out.push(msg.content.text);
    } else if (kind === 'execute_result') {
      // the magic returns the JobHandle: `<JobHandle id=… name=… status=…>`
      const id = /\bid=(\S+)/.exec(msg.content.data?.['text/plain'] ?? '');
      jobId = id ? id[1] : jobId;
    } else if (kind === 'error') {
      out.push(`${msg.content.ename}: ${msg.content.evalue}`);
    }
  };
  const reply = await future.done;
  const text = out.join('').trim().split('\n').slice(-6).join('\n');
  if (reply.content.status === 'ok') {
    Notification.success(`Training job ${jobId ? `${jobId} ` : ''}submitted from the cell.${text ? `\n${text}` : ''}`, {
      autoClose: 10000,
      actions: jobId
        ? [
            {
              label: 'Open job',
              caption: 'The job’s page: logs, events, resources',
              callback: () => void app.commands.execute(OPEN_JOB, { id: jobId })
            }
          ]
        : []
    });
  } else {
    Notification.error(text || 'The cell could not be submitted.', { autoClose: false });
  }
}

export const mainAreaPlugin: JupyterFrontEndPlugin<void> = {
  id: 'ma_jupyter:main-area',
  description: 'Training jobs in the main area: the create form, the cluster view, submit from files and cells.',
  autoStart: true,
  optional: [ICommandPalette],
  activate: (app: JupyterFrontEnd, palette: ICommandPalette | null) => {
    const openForm = (prefill: FormPrefill): Widget => {
      const content = new CreateFormWidget(app, prefill);
      const widget = new MainAreaWidget({ content });
      widget.id = content.id;
      widget.title.label = content.title.label;
      widget.title.icon = newJobIcon;
      widget.title.closable = true;
      app.shell.add(widget, 'main');
      app.shell.activateById(widget.id);
      return widget;
    };
    let cluster: MainAreaWidget<ClusterWidget> | null = null;
    (app.shell as any).currentChanged?.connect((_: unknown, change: { newValue: unknown }) => {
      if (isNotebookPanel(change.newValue)) {
        lastNotebook = change.newValue;
      }
    });

    app.commands.addCommand(CREATE_JOB, {
      label: 'New Training Job',
      caption: 'Create a training job (every field, checked as you type)',
      icon: newJobIcon,
      execute: args =>
        openForm({
          name: args.name as string | undefined,
          algorithm: args.algorithm as string | undefined,
          command: args.command as string | undefined,
          spec: args.spec as unknown as JobSpec | undefined
        })
    });
    app.commands.addCommand(SUBMIT_FILE, {
      label: 'Submit as Training Job',
      caption: 'Open the create form for this file: its folder as the algorithm, python <file> as the command',
      isVisible: () => selectedPythonFile(app) !== null,
      execute: args => {
        const path = (args.path as string | undefined) ?? selectedPythonFile(app);
        if (!path) {
          Notification.warning('Select a .py file in the file browser first.', { autoClose: 6000 });
          return;
        }
        const base = PathExt.basename(path);
        return openForm({
          name: base.replace(/\.py$/, '').replace(/[^A-Za-z0-9_.-]/g, '-').replace(/^[^A-Za-z0-9]+/, '') || undefined,
          algorithm: hostPath(PathExt.dirname(path)),
          command: `python ${base}`
        });
      }
    });
    app.commands.addCommand(RUN_CELL, {
      label: 'Run Cell as Training Job',
      caption: 'Submit the active cell as %%ma_train does, in this notebook’s kernel',
      iconClass: 'ma-run-cell-icon',
      execute: () => runCell(app)
    });
    app.commands.addCommand(OPEN_CLUSTER, {
      label: 'Cluster Resources',
      caption: 'Nodes and their use, how many more of each spec can start, the queue',
      icon: clusterIcon,
      execute: () => {
        if (!cluster || cluster.isDisposed) {
          const openJob = (id: string) => void app.commands.execute(OPEN_JOB, { id });
          cluster = new MainAreaWidget({ content: new ClusterWidget(openJob) });
          cluster.id = 'ma-cluster-view';
          cluster.title.label = 'Cluster resources';
          cluster.title.icon = clusterIcon;
          cluster.title.closable = true;
          app.shell.add(cluster, 'main');
        }
        app.shell.activateById(cluster.id);
      }
    });
    app.contextMenu.addItem({
      command: SUBMIT_FILE,
      selector: '.jp-DirListing-item[data-file-type="python"]',
      rank: 3
    });
    app.contextMenu.addItem({ command: RUN_CELL, selector: '.jp-Notebook .jp-CodeCell', rank: 30 });
    for (const command of [CREATE_JOB, OPEN_CLUSTER, RUN_CELL]) {
      palette?.addItem({ command, category: 'Training jobs' });
    }
  }
};
