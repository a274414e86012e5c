/**
 * The main-area views: the jobs table (command `ma-jupyter:open-jobs`, "Training jobs: Open
 * jobs", also a Launcher card and a sidebar button; the Launcher's "Training jobs" section also
 * has cards for the create form and the cluster view) and one detail tab per job
 * (`ma-jupyter:open-job` with `{id}`). Opening a view that is open already activates its tab.
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';
import type { ICommandPalette } from '@jupyterlab/apputils';
import type { LabIcon } from '@jupyterlab/ui-components';
import type { Token } from '@lumino/coreutils';
import type { Widget } from '@lumino/widgets';

import { api } from './api';
import { CREATE_JOB, OPEN_CLUSTER, OPEN_JOB, OPEN_JOBS } from './commands';
import { JobPageWidget } from './jobpage';
import { JobsTableWidget } from './jobstable';
import type { Job, JobSpec, JobSummary } from './models';

const LAUNCHER_TOKEN = '@jupyterlab/launcher:ILauncher';

export class MainArea {
  private table: JobsTableWidget | null = null;
  private pages = new Map<string, JobPageWidget>();
  private icon: LabIcon | null = null;

  constructor(
    private readonly app: JupyterFrontEnd,
    private readonly clone: (spec: JobSpec) => void
  ) {}

  private add(widget: Widget): void {
    if (!widget.isAttached) {
      widget.title.icon = this.icon ?? undefined;
      this.app.shell.add(widget, 'main');
    }
    this.app.shell.activateById(widget.id);
  }

  /** The jobs table, opened or brought to the front. */
  openJobs(): void {
    if (this.table === null || this.table.isDisposed) {
      this.table = new JobsTableWidget(job => void this.openListed(job), {
        newJob: () => void this.app.commands.execute(CREATE_JOB),
        cluster: () => void this.app.commands.execute(OPEN_CLUSTER)
      });
    }
    this.add(this.table);
  }

  /**
   * A listed job's tab: a listing has the job's summary, its page the whole job, read now
   * (a tab already open is brought to the front).
   */
  async openListed(job: JobSummary): Promise<void> {
    const page = this.pages.get(job.id);
    if (page !== undefined && !page.isDisposed) {
      this.add(page);
      return;
    }
    this.openJob(await api.job(job.id));
  }

  /** One job's detail tab, opened or brought to the front. */
  openJob(job: Job): void {
    let page = this.pages.get(job.id);
    if (page === undefined || page.isDisposed) {
      page = new JobPageWidget(job, { app: this.app, clone: this.clone });
      this.pages.set(job.id, page);
      page.disposed.connect(() => this.pages.delete(job.id));
    }
    this.add(page);
  }

  /** Register the commands, the palette items and the Launcher cards. */
  register(palette: ICommandPalette | null, icon: LabIcon): void {
    this.icon = icon;
    this.app.commands.addCommand(OPEN_JOBS, {
      label: args => (args.launcher ? 'Training jobs' : 'Open jobs'),
      caption: 'The training jobs table in the main area',
      icon,
      execute: () => this.openJobs()
    });
    this.app.commands.addCommand(OPEN_JOB, {
      label: 'Open a training job',
      execute: async args => this.openJob(await api.job(String(args.id)))
    });
    palette?.addItem({ command: OPEN_JOBS, category: 'Training jobs' });
    void this.addLauncherCards();
  }

  /**
   * The Launcher's "Training jobs" cards: the jobs table, the create form, the cluster view.
   * The launcher's package is not among this extension's build dependencies, so its service is
   * looked up by its token's name in the application's plugin registry; without a launcher
   * nothing is added.
   */
  private async addLauncherCards(): Promise<void> {
    try {
      await this.app.started;
      const registry = (this.app as any).pluginRegistry ?? (this.app as any)._pluginRegistry;
      const services: Map<Token<any>, string> | undefined = registry?._services;
      const token = [...(services?.keys() ?? [])].find(t => t.name === LAUNCHER_TOKEN);
      if (!token) {
        return;
      }
      const launcher: any = await this.app.resolveOptionalService(token);
      launcher?.add({ command: OPEN_JOBS, category: 'Training jobs', rank: 1, args: { launcher: true } });
      launcher?.add({ command: CREATE_JOB, category: 'Training jobs', rank: 2 });
      launcher?.add({ command: OPEN_CLUSTER, category: 'Training jobs', rank: 3 });
    } catch {
      // no launcher in this Lab: the command palette and the sidebar still open the table
    }
  }
}
