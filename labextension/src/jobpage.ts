/**
 * One job in the main area (`data-ma-view="job"`, `data-job-id`), one tab per job: the title
 * line, the operations bar (jobpage-operations.ts), the message line, then one section per tab:
 * Overview, Logs, Events, Resources, TensorBoard, Outputs (jobpage-<tab>.ts, sharing
 * jobpage-tab.ts).
 *
 * 1. The page polls the job and its new events every `POLL_MS` until the job ends (or is
 *    gone: then it says so and stops); after each read the title, the operations and every
 *    tab render, and the current tab refreshes.
 * 2. A tab starts what it shows when it is chosen (a log follower, the resource samples,
 *    TensorBoard, the outputs listing) and ends it when the page closes.
 * 3. An operation's or a tab's error is shown on the message line; the service checks every
 *    request, so a refusal is shown there too.
 * 4. While the job has alert events (a performance alert, a reschedule, a hang), a banner under
 *    the title says how many and the latest one, whatever tab is shown; its button opens Events.
 */
import { Widget } from '@lumino/widgets';

import { ApiError, api } from './api';
import { h, statusBadge } from './dom';
import { errorText } from './format';
import { EventsTab } from './jobpage-events';
import { LogsTab } from './jobpage-logs';
import { Operations, type OperatedPage } from './jobpage-operations';
import { OutputsTab } from './jobpage-outputs';
import { OverviewTab } from './jobpage-overview';
import { ResourcesTab } from './jobpage-resources';
import { JobTab, TABS, type JobPageHost, type TabKey } from './jobpage-tab';
import { TensorboardTab } from './jobpage-tensorboard';
import { elapsed, isTerminal, statusText } from './jobstate';
import type { Event, Job } from './models';

export type { JobPageHost } from './jobpage-tab';

const POLL_MS = 1500;

export class JobPageWidget extends Widget implements OperatedPage {
  job: Job;
  events: Event[] = [];
  prediction = '';
  current: TabKey = 'overview';
  private bar: HTMLElement;
  private message: HTMLElement;
  private alertBanner: HTMLElement;
  private operations: Operations;
  private tabs: Map<TabKey, JobTab>;
  private tabButtons = new Map<TabKey, HTMLButtonElement>();
  private lastSeq = 0;
  private timer: number | null = null;

  constructor(
    job: Job,
    readonly host: JobPageHost
  ) {
    super();
    this.job = job;
    this.id = `ma-jupyter-job-${job.id}`;
    this.title.label = job.spec.name;
    this.title.caption = `Training job ${job.id}`;
    this.title.closable = true;
    this.addClass('ma-main');
    this.addClass('ma-job-page');
    this.node.dataset.maView = 'job';
    this.node.dataset.jobId = job.id;
    this.bar = h('div', { class: 'ma-job-head' });
    this.message = h('div', { class: 'ma-message' });
    this.alertBanner = h('div', { class: 'ma-alert-banner', role: 'alert' });
    this.alertBanner.hidden = true;
    this.operations = new Operations(this);
    const all = [
      new OverviewTab(this),
      new LogsTab(this),
      new EventsTab(this),
      new ResourcesTab(this),
      new TensorboardTab(this),
      new OutputsTab(this)
    ];
    this.tabs = new Map(TABS.map(key => [key, all.find(tab => tab.key === key)!]));
    const tabList = h('div', { class: 'ma-tabs', role: 'tablist' });
    for (const [key, tab] of this.tabs) {
      const button = h('button', { class: 'ma-tab', role: 'tab', 'data-tab': key, onclick: () => this.showTab(key) }, tab.label);
      this.tabButtons.set(key, button);
      tabList.append(button);
    }
    const sections = [...this.tabs.values()].map(tab => tab.section);
    this.node.append(this.bar, this.alertBanner, this.operations.node, this.message, tabList, ...sections);
    this.render();
    this.showTab('overview');
    void this.poll();
    this.timer = window.setInterval(() => void this.poll(), POLL_MS);
  }

  /** Show one tab's section (and start what it needs). */
  showTab(tab: TabKey): void {
    this.current = tab;
    for (const [key, { section }] of this.tabs) {
      section.hidden = key !== tab;
      this.tabButtons.get(key)!.classList.toggle('ma-tab-current', key === tab);
      this.tabButtons.get(key)!.setAttribute('aria-selected', String(key === tab));
    }
    this.tabs.get(tab)!.show();
  }

  async act(action: () => Promise<void>): Promise<void> {
    this.message.textContent = '';
    this.message.classList.remove('ma-error');
    try {
      await action();
    } catch (error) {
      this.message.textContent = errorText(error);
      this.message.classList.add('ma-error');
    }
  }

  say(text: string): void {
    this.message.textContent = text;
  }

  unavailable(op: string): string | null {
    return this.operations.unavailable(op);
  }

  setJob(job: Job): void {
    this.job = job;
    this.render();
  }

  private async poll(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    try {
      const [job, events] = await Promise.all([api.job(this.job.id), api.events(this.job.id, this.lastSeq)]);
      if (this.isDisposed) {
        return;
      }
      this.job = job;
      if (events.length) {
        this.events.push(...events);
        this.lastSeq = events[events.length - 1].seq ?? this.lastSeq;
        const waiting = [...this.events].reverse().find(e => e.status === 'queued' && e.reason);
        this.prediction = waiting?.reason ?? '';
      }
      this.render();
      await this.tabs.get(this.current)!.refresh();
      if (isTerminal(job) && this.timer !== null) {
        window.clearInterval(this.timer);
        this.timer = null;
      }
    } catch (error) {
      if (error instanceof ApiError && error.kind === 'not_found') {
        this.message.textContent = 'This job no longer exists.';
        this.node.dataset.gone = 'true';
        if (this.timer !== null) {
          window.clearInterval(this.timer);
          this.timer = null;
        }
        return;
      }
      this.message.textContent = errorText(error);
      this.message.classList.add('ma-error');
    }
  }

  /** The title line, the operations and every tab, for the job as read last. */
  private render(): void {
    const job = this.job;
    const status = job.status ?? 'queued';
    this.node.dataset.status = status;
    this.bar.replaceChildren(
      h('h2', { class: 'ma-job-title' }, job.spec.name),
      statusBadge(status),
      h('span', { class: 'ma-job-id' }, job.id),
      h('span', { class: 'ma-job-when' }, elapsed(job) ? `ran ${elapsed(job)}` : statusText(job))
    );
    this.renderAlerts();
    this.operations.render();
    for (const tab of this.tabs.values()) {
      tab.render();
    }
  }

  /** Rule 4: the alert banner, for the events read so far. */
  private renderAlerts(): void {
    const alerts = this.events.filter(e => e.alert);
    this.alertBanner.hidden = alerts.length === 0;
    this.node.dataset.alerts = String(alerts.length);
    if (!alerts.length) {
      return;
    }
    const last = alerts[alerts.length - 1];
    const reason = last.reason ?? '';
    const where = last.node && !reason.includes(last.node) ? `${last.node}: ` : '';
    this.alertBanner.replaceChildren(
      h('strong', {}, alerts.length === 1 ? 'Alert' : `${alerts.length} alerts`),
      h('span', { class: 'ma-alert-text' }, where + reason),
      h('button', { class: 'ma-alert-open', onclick: () => this.showTab('events') }, 'Events')
    );
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    for (const tab of this.tabs.values()) {
      tab.dispose();
    }
    if (this.timer !== null) {
      window.clearInterval(this.timer);
    }
    super.dispose();
  }
}
