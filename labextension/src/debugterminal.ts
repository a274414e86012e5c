/**
 * The debug terminal of a job's node in a JupyterLab terminal tab.
 *
 * JupyterLab's own terminal (a real PTY on the Jupyter server, xterm in the browser) runs
 * `ma-jupyter shell JOB --node NODE` with the server's own interpreter, under `exec`, so the tab's
 * terminal ends when the node's shell ends.  The CLI reaches the job service as the Jupyter
 * server does (same home); the service checks that the caller may open it.
 *
 * `application/vnd.ma-jupyter.shell+json` (`%ma_shell JOB`) renders as a button that opens it.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { api } from './api';
import { LAB } from './commands';

export const SHELL_MIME = 'application/vnd.ma-jupyter.shell+json';

/** A word as a POSIX shell reads it literally. */
function quote(word: string): string {
  return /^[A-Za-z0-9_./:=@%+-]+$/.test(word) ? word : `'${word.replace(/'/g, "'\\''")}'`;
}

/** Open a terminal tab attached to `node` of job `jobId`; resolves once the command is typed. */
export async function openDebugTerminal(app: JupyterFrontEnd, jobId: string, node: string): Promise<void> {
  const status = await api.service();
  const python = status.python || 'python3';
  // @jupyterlab/terminal's types are not a dependency: its widget is used through its commands
  const widget: any = await app.commands.execute(LAB.newTerminal);
  const session: any = widget.content.session;
  // the terminal names itself once connected ("Terminal 1"): keep the node's name on the tab
  const label = `Debug terminal: ${jobId}/${node}`;
  const title = widget.content.title;
  title.label = label;
  title.changed.connect(() => {
    if (title.label !== label) {
      title.label = label;
    }
  });
  widget.node.dataset.maDebugTerminal = `${jobId}/${node}`;
  const line = ['exec', python, '-m', 'ma_jupyter.frontends.cli', 'shell', jobId, '--node', node]
    .map(quote)
    .join(' ');
  const type = () => session.send({ type: 'stdin', content: [line + '\r'] });
  if (session.connectionStatus === 'connected') {
    type();
    return;
  }
  await new Promise<void>(resolve => {
    const changed = (_: unknown, now: string) => {
      if (now === 'connected') {
        session.connectionStatusChanged.disconnect(changed);
        type();
        resolve();
      }
    };
    session.connectionStatusChanged.connect(changed);
  });
}

/** The output of `%ma_shell JOB`: a button that opens the node's terminal in a tab. */
class ShellOffer extends Widget implements IRenderMime.IRenderer {
  constructor(private readonly app: JupyterFrontEnd) {
    super();
    this.addClass('ma-shell-offer');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[SHELL_MIME] as { job?: string; node?: string } | undefined;
    const job = String(data?.job ?? '');
    const node = String(data?.node ?? 'worker-0');
    const button = document.createElement('button');
    button.className = 'jp-Button jp-mod-styled ma-shell-open';
    button.textContent = `Open the debug terminal of ${node} (${job})`;
    button.onclick = () => void openDebugTerminal(this.app, job, node);
    this.node.replaceChildren(button);
  }
}

/** The renderer factory for `SHELL_MIME` (its output is a button, safe to show untrusted). */
export function shellOfferFactory(app: JupyterFrontEnd): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [SHELL_MIME],
    defaultRank: 50,
    createRenderer: () => new ShellOffer(app)
  };
}
