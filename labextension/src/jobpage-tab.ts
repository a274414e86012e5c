/**
 * What the job page (jobpage.ts) and its tabs (jobpage-*.ts) share: the page as a tab sees it,
 * and the tab's own part.
 *
 * 1. The page owns the job and its events as last polled, the message line and the operations;
 *    a tab reads them through `JobPage` and never polls the job itself.
 * 2. A tab owns one `<section class="ma-section ma-section-KEY" data-section="KEY">`, shown
 *    while its tab button is current, and whatever it starts for it (a log follower, a timer),
 *    which it ends in `dispose()`.
 * 3. Hooks, all optional: `render()` after every read of the job (every tab, shown or not, in
 *    the page's tab order); `refresh()` after every poll while the tab is current; `show()` each
 *    time the tab is chosen.
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';

import { h } from './dom';
import type { Event, Job, JobSpec } from './models';

/** The tabs of a job page, in the order of their buttons and sections. */
export const TABS = ['overview', 'logs', 'events', 'resources', 'tensorboard', 'outputs'] as const;
export type TabKey = (typeof TABS)[number];

/** What the page needs from the rest of the extension. */
export interface JobPageHost {
  app: JupyterFrontEnd;
  /** open the create form filled with `spec` */
  clone: (spec: JobSpec) => void;
}

/** The page, as its tabs and operations see it (rule 1). */
export interface JobPage {
  /** the job as last read from the service */
  readonly job: Job;
  /** every event of the job read so far, oldest first */
  readonly events: readonly Event[];
  /** why a queued job waits, from its newest queued event with a reason ('' if none) */
  readonly prediction: string;
  readonly host: JobPageHost;
  /** the tab shown */
  readonly current: TabKey;
  readonly isDisposed: boolean;
  readonly isVisible: boolean;
  /** run `action` with the message line cleared; an error it throws becomes the message */
  act(action: () => Promise<void>): Promise<void>;
  /** why an operation (`data-op`, e.g. `tensorboard`) is unavailable now, or null */
  unavailable(op: string): string | null;
}

/** One tab of the page: its section and its hooks (rules 2 and 3). */
export abstract class JobTab {
  /** the text of the tab's button */
  abstract readonly label: string;
  readonly section: HTMLElement;

  constructor(
    readonly key: TabKey,
    protected readonly page: JobPage
  ) {
    this.section = h('section', { class: `ma-section ma-section-${key}`, 'data-section': key });
  }

  /** the job was read again (the page's message and operations are already updated) */
  render(): void {}

  /** the page polled while this tab is current */
  async refresh(): Promise<void> {}

  /** the tab was chosen */
  show(): void {}

  /** the page closes: end what the tab started */
  dispose(): void {}
}
