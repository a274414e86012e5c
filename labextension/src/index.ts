/**
 * ma_jupyter's JupyterLab plugins: the left-sidebar job list and the main-area views (jobs
 * table, one tab per job, create form, cluster view) over the job service, reached through
 * the ma_jupyter server extension.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { LabIcon } from '@jupyterlab/ui-components';

import { CREATE_JOB, SHOW_SIDEBAR } from './commands';
import { shellOfferFactory } from './debugterminal';
import { MainArea } from './mainarea';
import { JobsSidebar } from './sidebar';
import { mainAreaPlugin } from './submitfrom';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="3" y="13" width="4" height="8" rx="1"/>
    <rect x="10" y="8" width="4" height="13" rx="1"/>
    <rect x="17" y="3" width="4" height="18" rx="1"/>
  </g>
</svg>`;

export const jobsIcon = new LabIcon({ name: 'ma_jupyter:jobs', svgstr: ICON_SVG });

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'ma_jupyter:sidebar',
  description: 'Training jobs: a sidebar list and the main-area jobs table and job pages.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    // a clone opens the main-area create form filled with the whole job
    const main = new MainArea(app, spec => void app.commands.execute(CREATE_JOB, { spec: spec as any }));
    const sidebar = new JobsSidebar({
      openJob: job => void main.openListed(job),
      openJobs: () => main.openJobs(),
      newJob: () => void app.commands.execute(CREATE_JOB)
    });
    sidebar.title.icon = jobsIcon;
    app.shell.add(sidebar, 'left', { rank: 650 });
    restorer?.add(sidebar, sidebar.id);
    app.commands.addCommand(SHOW_SIDEBAR, {
      label: 'Show the training jobs sidebar',
      execute: () => app.shell.activateById(sidebar.id)
    });
    palette?.addItem({ command: SHOW_SIDEBAR, category: 'Training jobs' });
    main.register(palette, jobsIcon);
  }
};

/** `%ma_shell JOB` in a notebook: a button that opens the node's terminal in a tab. */
const shellOfferPlugin: JupyterFrontEndPlugin<void> = {
  id: 'ma_jupyter:shell-offer',
  description: 'Renders %ma_shell output as a button opening the debug terminal in a tab.',
  autoStart: true,
  requires: [IRenderMimeRegistry],
  activate: (app: JupyterFrontEnd, rendermime: IRenderMimeRegistry) => {
    rendermime.addFactory(shellOfferFactory(app));
  }
};

export default [plugin, mainAreaPlugin, shellOfferPlugin];
