/** The left-sidebar panel: a header with the service state, and one view (list, job, form). */
import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { api } from './api';
import { JobDetailView } from './detail';
import { errorText, h } from './dom';
import { JobFormView } from './form';
import { JobListView } from './list';
import type { Job, JobSpec } from './models';
import type { View } from './view';

export class JobsSidebar extends Widget {
  private view: View | null = null;
  private body: HTMLElement;
  private serviceLine: HTMLElement;

  /**
   * `openJob`: where a click on a listed job goes (the main-area detail); without it the
   * sidebar shows the job itself. `openJobs`: the "All jobs" button (the main-area table).
   */
  constructor(
    private readonly openJob: ((job: Job) => void) | null = null,
    private readonly openJobs: (() => void) | null = null
  ) {
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
        this.openJobs
          ? h(
              'button',
              {
                class: 'jp-Button jp-mod-styled ma-open-jobs',
                title: 'The jobs table in the main area',
                onclick: () => this.openJobs?.()
              },
              'All jobs'
            )
          : null,
        h(
          'button',
          { class: 'jp-Button jp-mod-styled jp-mod-accept ma-new-job', onclick: () => this.showForm() },
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
    if (this.view === null) {
      this.showList();
    }
  }

  private async checkService(): Promise<void> {
    try {
      const status = await api.service();
      this.serviceLine.textContent = status.running
        ? `service ${status.url} (pid ${status.pid})`
        : `no service for ${status.home} yet: it starts on first use`;
      this.serviceLine.classList.remove('ma-error');
    } catch (error) {
      this.serviceLine.textContent = `server extension unavailable: ${errorText(error)}`;
      this.serviceLine.classList.add('ma-error');
    }
  }

  private showView(view: View): void {
    this.view?.dispose();
    this.view = view;
    this.body.replaceChildren(view.node);
    void this.checkService();
  }

  /** The job list with its filters. */
  showList(): void {
    this.showView(new JobListView(job => (this.openJob ? this.openJob(job) : this.showJob(job))));
  }

  /** One job's detail with its live logs. */
  showJob(job: Job): void {
    this.showView(
      new JobDetailView(
        job,
        () => this.showList(),
        spec => this.showForm(spec)
      )
    );
  }

  /** The create form, empty or filled from a job to clone. */
  showForm(template?: JobSpec): void {
    this.showView(
      new JobFormView(
        job => this.showJob(job),
        () => this.showList(),
        template
      )
    );
  }

  dispose(): void {
    this.view?.dispose();
    this.view = null;
    super.dispose();
  }
}
