/**
 * The debug terminal of a job's node in a tab, and the notebook output that offers it.
 *
 * The server extension starts a Jupyter terminal (a real PTY on the Jupyter server) whose
 * process is `ma-jupyter shell JOB --node NODE` given as an argv (`POST ma-jupyter/debug-terminal`,
 * `DebugTerminalHandler`); the tab is JupyterLab's terminal widget connected to that session,
 * so it ends when the node's shell ends.  Nothing is typed into a shell: the job id and the node
 * are arguments, and a control character in either (a `\x15` erasing a typed line, a `\r` running
 * the rest) never reaches a line editor.  The service checks that the caller may open it.
 *
 * `application/vnd.ma-jupyter.shell+json` (`%ma_shell JOB`) renders as a button that opens it,
 * with these rules (a notebook may come from anyone: a job's outputs, a shared file):
 *
 * 1. The bundle's `job` and `node` must match the wire model's patterns (`JOB_ID_PATTERN`,
 *    `NODE_NAME_PATTERN` of `models.ts`); otherwise an inert note says what is wrong, no button.
 * 2. In an untrusted notebook (`model.trusted` false: outputs neither run here nor trusted by the
 *    user) the output is an inert note saying to trust the notebook, no button.
 * 3. `openDebugTerminal` checks the pair again (rule 1) whoever calls it, and the server
 *    extension checks it once more before it starts anything.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Terminal } from '@jupyterlab/terminal';
import { Widget } from '@lumino/widgets';

import { requestAPI } from './api';
import { JOB_ID_PATTERN, NODE_NAME_PATTERN } from './models';

export const SHELL_MIME = 'application/vnd.ma-jupyter.shell+json';

/** A value as a note may show it: a string's control characters escaped, at most 80 characters. */
function shown(value: unknown): string {
  const text = typeof value === 'string' ? JSON.stringify(value) : String(value);
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

/** What is wrong with a job id and node name (rule 1), or null when both are well formed. */
export function targetProblem(job: unknown, node: unknown): string | null {
  if (typeof job !== 'string' || !JOB_ID_PATTERN.test(job)) {
    return `not a job id: ${shown(job)}`;
  }
  if (typeof node !== 'string' || !NODE_NAME_PATTERN.test(node)) {
    return `not a node name: ${shown(node)}`;
  }
  return null;
}

/** Open a tab on a terminal attached to `node` of job `jobId`; resolves once the tab is shown. */
export async function openDebugTerminal(app: JupyterFrontEnd, jobId: string, node: string): Promise<void> {
  const problem = targetProblem(jobId, node);
  if (problem !== null) {
    throw new Error(`No debug terminal opened: ${problem}.`);
  }
  const made = await requestAPI<{ name: string }>('debug-terminal', {
    method: 'POST',
    body: JSON.stringify({ job: jobId, node }),
    headers: { 'Content-Type': 'application/json' }
  });
  const session = app.serviceManager.terminals.connectTo({ model: { name: made.name } });
  // closing the tab ends the terminal's CLI, and with it the node's shell
  const content = new Terminal(session, { shutdownOnClose: true, closeOnExit: true });
  // the terminal names itself once its xterm is made ("Terminal"): keep the node's name on the
  // tab (the main-area widget shows its content's title)
  const label = `Debug terminal: ${jobId}/${node}`;
  const title = content.title;
  title.label = label;
  title.changed.connect(() => {
    if (title.label !== label) {
      title.label = label;
    }
  });
  const widget = new MainAreaWidget({ content, reveal: content.ready });
  widget.id = `ma-debug-terminal-${made.name}`;
  widget.title.closable = true;
  widget.node.dataset.maDebugTerminal = `${jobId}/${node}`;
  app.shell.add(widget, 'main', { type: 'Terminal' });
  app.shell.activateById(widget.id);
}

/** The output of `%ma_shell JOB`: a button that opens the node's terminal in a tab (see the rules). */
class ShellOffer extends Widget implements IRenderMime.IRenderer {
  constructor(private readonly app: JupyterFrontEnd) {
    super();
    this.addClass('ma-shell-offer');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[SHELL_MIME] as { job?: unknown; node?: unknown } | undefined;
    const job = data?.job;
    const node = data?.node ?? 'worker-0';
    const problem = targetProblem(job, node);
    if (problem !== null) {
      this.note('invalid', `This output names no debug terminal to open (${problem}).`);
      return;
    }
    if (!model.trusted) {
      this.note(
        'untrusted',
        `Debug terminal of ${node} (${job}): trust this notebook to open the terminal ` +
          '(run its cell, or "Trust Notebook" from the command palette).'
      );
      return;
    }
    const button = document.createElement('button');
    button.className = 'jp-Button jp-mod-styled ma-shell-open';
    button.textContent = `Open the debug terminal of ${node} (${job})`;
    button.onclick = () =>
      void openDebugTerminal(this.app, job as string, node as string).catch(error =>
        this.note('failed', `The debug terminal did not open: ${(error as Error).message}`, button)
      );
    this.node.replaceChildren(button);
  }

  /** An inert line in place of the button (`data-ma-shell-inert` = why), text only. */
  private note(why: string, text: string, ...keep: HTMLElement[]): void {
    const note = document.createElement('div');
    note.className = 'jp-RenderedText ma-shell-inert';
    note.dataset.maShellInert = why;
    note.textContent = text;
    this.node.replaceChildren(...keep, note);
  }
}

/**
 * The renderer factory for `SHELL_MIME`.  `safe: true` so an untrusted notebook shows the
 * renderer's own inert note (rule 2) rather than the plain-text fallback: the renderer, not Lab,
 * decides what an untrusted output may do.
 */
export function shellOfferFactory(app: JupyterFrontEnd): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [SHELL_MIME],
    defaultRank: 50,
    createRenderer: () => new ShellOffer(app)
  };
}
