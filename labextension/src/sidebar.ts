/**
 * The left-sidebar panel: a compact live list of jobs with status counts. A click on a job opens
 * its detail in the main area; "All jobs" opens the main-area table and "New job" the main-area
 * create form.
 */
import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { api } from './api';
import { h } from './dom';
import { errorText } from './format';
import { JobListView } from './list';
import type { JobSummary } from './models';

/** How often the service line is read again (ms). */
const SERVICE_CHECK_MS = 5000;

/** Where the sidebar's buttons and rows lead (the main-area views). */
export interface SidebarActions {
  openJob: (job: JobSummary) => void;
  openJobs: () => void;
  newJob: () => void;
}

export class JobsSidebar extends Widget {
  private list: JobListView | null = null;
  private serviceTimer: number | null = null;
  private body: HTMLElement;
  private serviceLine: HTMLElement;

  constructor(private readonly actions: SidebarActions) {
    super();
    this.id = 'ma-jupyter-sidebar';
    this.addClass('ma-sidebar');
    this.title.caption = 'Training jobs';
    this.serviceLine = h('div', { class: 'ma-service' });
    this.body = h('div', { class: 'ma-body' });
    this.node.append(
      h(
        'div',
        { class: 'ma-header' },
        h('h1', { class: 'ma-title' }, 'Training jobs'),
        h(
          'button',
          {
            class: 'jp-Button jp-mod-styled ma-open-jobs',
            title: 'The jobs table in the main area',
            onclick: () => this.actions.openJobs()
          },
          'All jobs'
        ),
        h(
          'button',
          {
            class: 'jp-Button jp-mod-styled jp-mod-accept ma-new-job',
            title: 'The create form in the main area',
            onclick: () => this.actions.newJob()
          },
          'New job'
        )
      ),
      this.serviceLine,
      this.body
    );
  }

  /**
   * The first time the panel is shown, open the list (which starts the job service if none
   * runs): merely loading JupyterLab starts nothing.
   */
  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    if (this.list === null) {
      this.list = new JobListView(job => this.actions.openJob(job));
      this.body.replaceChildren(this.list.node);
      // the list's first read starts the service: say so once it runs, and if it goes away
      void this.checkService();
      this.serviceTimer = window.setInterval(() => void this.checkService(), SERVICE_CHECK_MS);
    }
  }

  private async checkService(): Promise<void> {
    if (!this.isVisible) {
      return;
    }
    try {
      const status = await api.service();
      // the address is for whoever debugs the service: in the tooltip, not in the user's way
      this.serviceLine.textContent = status.running
        ? `Job service running (pid ${status.pid})`
        : 'Job service not started yet: it starts on first use';
      this.serviceLine.title = status.running
        ? `${status.url}, home ${status.home}`
        : `its home: ${status.home}`;
      this.serviceLine.classList.remove('ma-error');
    } catch (error) {
      this.serviceLine.textContent = `server extension unavailable: ${errorText(error)}`;
      this.serviceLine.classList.add('ma-error');
    }
  }

  dispose(): void {
    if (this.serviceTimer !== null) {
      window.clearInterval(this.serviceTimer);
    }
    this.list?.dispose();
    this.list = null;
    super.dispose();
  }
}
