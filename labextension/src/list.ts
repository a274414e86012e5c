/** The job list: filters by name and status, live refresh, a click opens the job. */
import { api } from './api';
import { h, statusBadge } from './dom';
import { dateTime, errorText } from './format';
import { JOB_STATUS_VALUES, JobStatus, JobSummary } from './models';

const REFRESH_MS = 2000;

export class JobListView {
  readonly node: HTMLElement;
  private nameInput: HTMLInputElement;
  private statusBoxes = new Map<JobStatus, HTMLInputElement>();
  private live: HTMLInputElement;
  private body: HTMLElement;
  private summary: HTMLElement;
  private counts: HTMLElement;
  private timer: number | null = null;
  private debounce: number | null = null;
  private inFlight = false;
  private disposed = false;

  constructor(private readonly open: (job: JobSummary) => void) {
    this.nameInput = h('input', {
      class: 'ma-filter-name jp-mod-styled',
      type: 'search',
      placeholder: 'Filter by name',
      oninput: () => this.scheduleRefresh()
    });
    const chips = JOB_STATUS_VALUES.map(status => {
      const box = h('input', {
        type: 'checkbox',
        value: status,
        onchange: () => this.refresh()
      });
      this.statusBoxes.set(status, box);
      return h('label', { class: `ma-chip ma-chip-${status}` }, box, status);
    });
    this.live = h('input', {
      type: 'checkbox',
      class: 'ma-live',
      checked: true,
      onchange: () => this.arm()
    });
    this.body = h('ul', { class: 'ma-jobs' });
    this.summary = h('div', { class: 'ma-list-summary' });
    this.counts = h('div', { class: 'ma-status-counts' });
    this.node = h(
      'div',
      { class: 'ma-list' },
      this.counts,
      h(
        'div',
        { class: 'ma-filters' },
        this.nameInput,
        h('div', { class: 'ma-status-filter' }, ...chips),
        h(
          'div',
          { class: 'ma-list-controls' },
          h('label', { class: 'ma-live-label', title: 'Refresh every 2 s' }, this.live, 'live'),
          h(
            'button',
            { class: 'jp-Button jp-mod-styled ma-refresh', onclick: () => this.refresh() },
            'Refresh'
          )
        )
      ),
      this.body,
      this.summary
    );
    void this.refresh();
    this.arm();
  }

  private selectedStatuses(): JobStatus[] {
    return [...this.statusBoxes.entries()].filter(([, box]) => box.checked).map(([s]) => s);
  }

  private scheduleRefresh(): void {
    if (this.debounce !== null) {
      window.clearTimeout(this.debounce);
    }
    this.debounce = window.setTimeout(() => void this.refresh(), 250);
  }

  private arm(): void {
    if (this.timer !== null) {
      window.clearInterval(this.timer);
      this.timer = null;
    }
    if (this.live.checked && !this.disposed) {
      this.timer = window.setInterval(() => {
        // only while someone can see it: a hidden sidebar costs the service nothing
        if (this.node.isConnected && this.node.offsetParent !== null) {
          void this.refresh();
        }
      }, REFRESH_MS);
    }
  }

  /** Fetch the list with the current filters and redraw it. */
  async refresh(): Promise<void> {
    if (this.inFlight || this.disposed) {
      return;
    }
    this.inFlight = true;
    try {
      const page = await api.jobs({
        name: this.nameInput.value.trim() || undefined,
        status: this.selectedStatuses(),
        limit: 100
      });
      this.render(page.items, page.total);
      await this.countStatuses();
    } catch (error) {
      this.summary.textContent = `Cannot list jobs: ${errorText(error)}`;
      this.summary.classList.add('ma-error');
    } finally {
      this.inFlight = false;
    }
  }

  /** How many jobs have each status (the service's totals, one cheap indexed count each). */
  private async countStatuses(): Promise<void> {
    const totals = await Promise.all(
      JOB_STATUS_VALUES.map(status => api.jobs({ status: [status], limit: 1 }).then(p => p.total))
    );
    this.counts.replaceChildren(
      ...JOB_STATUS_VALUES.filter((_, i) => totals[i] > 0).map(status =>
        h(
          'span',
          { class: `ma-count ma-status-${status}`, 'data-status': status },
          `${status} ${totals[JOB_STATUS_VALUES.indexOf(status)]}`
        )
      )
    );
  }

  private render(jobs: JobSummary[], total: number): void {
    this.body.replaceChildren(
      ...jobs.map(job =>
        h(
          'li',
          {
            class: 'ma-job-row',
            'data-job-id': job.id,
            'data-job-name': job.spec.name,
            title: job.reason || job.id,
            onclick: () => this.open(job)
          },
          h(
            'div',
            { class: 'ma-job-line' },
            h('span', { class: 'ma-job-name' }, job.spec.name),
            statusBadge(job.status)
          ),
          h(
            'div',
            { class: 'ma-job-meta' },
            [
              `${job.spec.mode ?? 'single'}×${job.spec.nodes ?? 1}`,
              job.chosen_spec ?? (job.spec.specs ?? []).join(', '),
              dateTime(job.created_at)
            ].join(' · ')
          )
        )
      )
    );
    this.summary.classList.remove('ma-error');
    this.summary.textContent =
      total === 0 ? 'No jobs match. Create one with "New job".' : `${jobs.length} of ${total} jobs`;
  }

  dispose(): void {
    this.disposed = true;
    if (this.timer !== null) {
      window.clearInterval(this.timer);
    }
    if (this.debounce !== null) {
      window.clearTimeout(this.debounce);
    }
  }
}
