/**
 * The main-area jobs table (`data-ma-view="jobs"`): one row per job with name, id, status (and
 * queue position), mode × nodes, spec, creator, created (date and time), elapsed or duration,
 * outputs and its reason (the job's `reason` as `render.reason_summary` shows it in the CLI's
 * list: up to its "last log lines", none for a plain success; cut to the column's width,
 * whole in the tooltip).
 *
 * 1. Filters (name, status, creator, spec, outputs folder) are the service's list filters, so
 *    totals and pages count every matching job, not just the loaded page.
 * 2. Pages of `PAGE_SIZE` jobs in the service's order: a click on a column's header asks the
 *    service to sort by it (`GET /jobs?sort=`), so the order holds across every matching job,
 *    page by page.
 * 3. Live refresh every `REFRESH_MS` while the table is visible redraws the rows only: the
 *    scroll position and the checked rows (by job id) stay.
 * 4. Checked rows can be deleted together after one confirmation; a running job is stopped
 *    first (`force`).
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { api } from './api';
import { h, statusBadge } from './dom';
import { dateTime, errorText, shortPath } from './format';
import { elapsed, statusText } from './jobstate';
import { JOB_STATUS_VALUES, JobStatus, JobSummary } from './models';

const REFRESH_MS = 2000;
export const PAGE_SIZE = 100;

interface Column {
  key: string;
  label: string;
  value: (job: JobSummary) => string;
  /** false: the service cannot sort by it (no header click) */
  sortable?: boolean;
}

/** The reason of a plain success, which says nothing its status does not (render.PLAIN_SUCCESS). */
const PLAIN_SUCCESS = 'every node exited with code 0';
/** Where a failure's reason goes on with its last log lines (render.LOG_TAIL_MARK). */
const LOG_TAIL_MARK = '\nlast log lines:\n';

/** A job's reason as a list shows it (render.reason_summary): one line, without the log tail. */
function reasonSummary(job: JobSummary): string {
  const reason = job.reason ?? '';
  if (!reason || (job.status === 'succeeded' && reason === PLAIN_SUCCESS)) {
    return '';
  }
  return reason.split(LOG_TAIL_MARK, 1)[0].split(/\s+/).join(' ').trim();
}

const COLUMNS: Column[] = [
  { key: 'name', label: 'Name', value: j => j.spec.name },
  { key: 'id', label: 'ID', value: j => j.id },
  { key: 'status', label: 'Status', value: statusText },
  { key: 'mode', label: 'Mode × nodes', value: j => `${j.spec.mode ?? 'single'} × ${j.spec.nodes ?? 1}` },
  { key: 'spec', label: 'Spec', value: j => j.chosen_spec ?? (j.spec.specs ?? []).join(', ') },
  { key: 'creator', label: 'Creator', value: j => j.spec.creator ?? '' },
  {
    key: 'created',
    label: 'Created',
    value: j => dateTime(j.created_at)
  },
  {
    key: 'elapsed',
    label: 'Elapsed / duration',
    value: elapsed
  },
  {
    key: 'outputs',
    label: 'Outputs',
    value: j => shortPath(j.outputs_folder ?? j.spec.outputs ?? '')
  },
  { key: 'reason', label: 'Reason', value: reasonSummary, sortable: false }
];

export class JobsTableWidget extends Widget {
  private inputs: Record<'name' | 'creator' | 'spec' | 'outputs', HTMLInputElement>;
  private statusSelect: HTMLSelectElement;
  private tbody: HTMLTableSectionElement;
  private headRow: HTMLTableRowElement;
  private scroller: HTMLElement;
  private summary: HTMLElement;
  private message: HTMLElement;
  private pageLabel: HTMLElement;
  private prevButton: HTMLButtonElement;
  private nextButton: HTMLButtonElement;
  private deleteButton: HTMLButtonElement;
  private allBox: HTMLInputElement;
  private selected = new Set<string>();
  private jobs: JobSummary[] = [];
  private total = 0;
  private offset = 0;
  private sortKey = 'created';
  private sortDescending = true;
  private timer: number;
  private debounce: number | null = null;
  private inFlight = false;

  /**
   * `open`: a click on a row (the job's tab); `go`: the toolbar's "New job" and "Cluster"
   * buttons (the main-area create form and cluster view).
   */
  constructor(
    private readonly open: (job: JobSummary) => void,
    go: { newJob: () => void; cluster: () => void }
  ) {
    super();
    this.id = 'ma-jupyter-jobs';
    this.title.label = 'Training jobs';
    this.title.closable = true;
    this.addClass('ma-main');
    this.node.dataset.maView = 'jobs';
    const filter = (key: string, placeholder: string) =>
      h('input', {
        class: `jp-mod-styled ma-filter-${key}`,
        type: 'search',
        placeholder,
        'aria-label': placeholder,
        oninput: () => this.filtersChanged()
      });
    this.inputs = {
      name: filter('name', 'Name contains'),
      creator: filter('creator', 'Creator'),
      spec: filter('spec', 'Spec'),
      outputs: filter('outputs', 'Outputs folder contains')
    };
    this.statusSelect = h(
      'select',
      { class: 'jp-mod-styled ma-filter-status', 'aria-label': 'Status', onchange: () => this.filtersChanged() },
      h('option', { value: '' }, 'Any status'),
      ...JOB_STATUS_VALUES.map(s => h('option', { value: s }, s))
    );
    this.allBox = h('input', {
      type: 'checkbox',
      class: 'ma-select-all',
      title: 'Select every job of this page',
      onchange: () => this.selectAll(this.allBox.checked)
    });
    this.headRow = h('tr', {}, h('th', { class: 'ma-col-select' }, this.allBox));
    for (const column of COLUMNS) {
      if (column.sortable === false) {
        this.headRow.append(h('th', { class: `ma-col-${column.key}` }, column.label));
        continue;
      }
      this.headRow.append(
        h(
          'th',
          {
            class: `ma-col-${column.key} ma-sortable`,
            'data-sort': column.key,
            title: 'Sort the rows of this page',
            onclick: () => this.sortBy(column.key)
          },
          column.label
        )
      );
    }
    this.tbody = h('tbody');
    this.scroller = h(
      'div',
      { class: 'ma-table-scroll' },
      h('table', { class: 'ma-jobs-table' }, h('thead', {}, this.headRow), this.tbody)
    );
    this.summary = h('span', { class: 'ma-table-summary' });
    this.message = h('div', { class: 'ma-message' });
    this.pageLabel = h('span', { class: 'ma-page-label' });
    this.prevButton = h(
      'button',
      { class: 'jp-Button jp-mod-styled ma-page-prev', onclick: () => this.page(-1) },
      '← Previous'
    );
    this.nextButton = h(
      'button',
      { class: 'jp-Button jp-mod-styled ma-page-next', onclick: () => this.page(1) },
      'Next →'
    );
    this.deleteButton = h(
      'button',
      {
        class: 'jp-Button jp-mod-styled jp-mod-warn ma-delete-selected',
        onclick: () => void this.deleteSelected()
      },
      'Delete selected'
    );
    this.node.append(
      h(
        'div',
        { class: 'ma-toolbar' },
        h('h2', { class: 'ma-main-title' }, 'Training jobs'),
        this.inputs.name,
        this.statusSelect,
        this.inputs.creator,
        this.inputs.spec,
        this.inputs.outputs
      ),
      h(
        'div',
        { class: 'ma-toolbar ma-toolbar-second' },
        h('button', { class: 'jp-Button jp-mod-styled jp-mod-accept ma-table-new-job', onclick: () => go.newJob() }, 'New job'),
        h(
          'button',
          { class: 'jp-Button jp-mod-styled ma-table-cluster', title: 'Nodes, their use and the queue', onclick: () => go.cluster() },
          'Cluster'
        ),
        this.deleteButton,
        h('button', { class: 'jp-Button jp-mod-styled ma-refresh', onclick: () => void this.refresh() }, 'Refresh'),
        this.summary,
        h('span', { class: 'ma-spacer' }),
        this.prevButton,
        this.pageLabel,
        this.nextButton
      ),
      this.message,
      this.scroller
    );
    void this.refresh();
    this.timer = window.setInterval(() => {
      if (this.isVisible) {
        void this.refresh();
      }
    }, REFRESH_MS);
  }

  private filtersChanged(): void {
    if (this.debounce !== null) {
      window.clearTimeout(this.debounce);
    }
    this.debounce = window.setTimeout(() => {
      this.offset = 0;
      void this.refresh();
    }, 250);
  }

  private page(step: number): void {
    this.offset = Math.max(0, this.offset + step * PAGE_SIZE);
    this.scroller.scrollTop = 0;
    void this.refresh();
  }

  private sortBy(key: string): void {
    this.sortDescending = this.sortKey === key ? !this.sortDescending : false;
    this.sortKey = key;
    this.offset = 0; // a new order starts at its first page
    void this.refresh();
  }

  /** The service's order for the current sort (`-` first: descending). */
  private serviceSort(): string {
    return `${this.sortDescending ? '-' : ''}${this.sortKey}`;
  }

  private selectAll(on: boolean): void {
    for (const job of this.jobs) {
      if (on) {
        this.selected.add(job.id);
      } else {
        this.selected.delete(job.id);
      }
    }
    this.render();
  }

  /** Fetch the page with the current filters and redraw the rows. */
  async refresh(): Promise<void> {
    if (this.inFlight || this.isDisposed) {
      return;
    }
    this.inFlight = true;
    try {
      const value = (input: HTMLInputElement) => input.value.trim() || undefined;
      const status = this.statusSelect.value as JobStatus | '';
      const page = await api.jobs({
        name: value(this.inputs.name),
        creator: value(this.inputs.creator),
        spec: value(this.inputs.spec),
        outputs: value(this.inputs.outputs),
        status: status ? [status] : [],
        sort: this.serviceSort(),
        offset: this.offset,
        limit: PAGE_SIZE
      });
      if (page.items.length === 0 && this.offset > 0 && page.total > 0) {
        this.offset = Math.max(0, Math.floor((page.total - 1) / PAGE_SIZE) * PAGE_SIZE);
        this.inFlight = false;
        return this.refresh();
      }
      this.jobs = page.items;
      this.total = page.total;
      this.message.textContent = '';
      this.message.classList.remove('ma-error');
      this.render();
    } catch (error) {
      this.message.textContent = `Cannot list jobs: ${errorText(error)}`;
      this.message.classList.add('ma-error');
    } finally {
      this.inFlight = false;
    }
  }

  private render(): void {
    const scroll = this.scroller.scrollTop;
    const ids = new Set(this.jobs.map(j => j.id));
    for (const id of [...this.selected]) {
      if (!ids.has(id)) {
        this.selected.delete(id); // deleted meanwhile, or on another page
      }
    }
    this.tbody.replaceChildren(
      ...this.jobs.map(job => {
        const box = h('input', {
          type: 'checkbox',
          class: 'ma-row-select',
          'aria-label': `Select ${job.spec.name}`,
          checked: this.selected.has(job.id),
          onclick: (e: Event) => e.stopPropagation(),
          onchange: () => {
            if (box.checked) {
              this.selected.add(job.id);
            } else {
              this.selected.delete(job.id);
            }
            this.updateControls();
          }
        });
        const row = h(
          'tr',
          {
            class: 'ma-jobs-row',
            'data-job-id': job.id,
            'data-status': job.status ?? 'queued',
            title: job.reason || 'Open the job',
            onclick: () => this.open(job)
          },
          h('td', { class: 'ma-col-select' }, box)
        );
        for (const column of COLUMNS) {
          const text = column.value(job);
          row.append(
            h(
              'td',
              {
                class: `ma-col-${column.key}`,
                title: column.key === 'outputs' ? (job.outputs_folder ?? job.spec.outputs ?? '') : text
              },
              column.key === 'status' ? statusBadge(job.status) : text,
              column.key === 'status' && text !== (job.status ?? 'queued')
                ? h('span', { class: 'ma-queue-pos' }, ` #${(job.queue_position ?? 0) + 1}`)
                : null
            )
          );
        }
        return row;
      })
    );
    for (const th of Array.from(this.headRow.querySelectorAll('th[data-sort]'))) {
      const key = (th as HTMLElement).dataset.sort;
      th.setAttribute(
        'aria-sort',
        key === this.sortKey ? (this.sortDescending ? 'descending' : 'ascending') : 'none'
      );
    }
    this.scroller.scrollTop = scroll;
    this.updateControls();
  }

  private updateControls(): void {
    const first = this.total === 0 ? 0 : this.offset + 1;
    const last = this.offset + this.jobs.length;
    this.pageLabel.textContent = `${first}–${last} of ${this.total}`;
    this.prevButton.disabled = this.offset === 0;
    this.nextButton.disabled = last >= this.total;
    this.deleteButton.disabled = this.selected.size === 0;
    this.deleteButton.title = this.selected.size === 0 ? 'Check the jobs to delete first' : '';
    this.deleteButton.textContent = `Delete selected (${this.selected.size})`;
    this.allBox.checked = this.jobs.length > 0 && this.jobs.every(j => this.selected.has(j.id));
    this.summary.textContent =
      this.total === 0 ? 'No jobs match these filters.' : `${this.total} jobs match`;
  }

  private async deleteSelected(): Promise<void> {
    const doomed = this.jobs.filter(j => this.selected.has(j.id));
    if (doomed.length === 0) {
      return;
    }
    const live = doomed.filter(j => j.status === 'running' || j.status === 'queued').length;
    const result = await showDialog({
      title: `Delete ${doomed.length} job${doomed.length === 1 ? '' : 's'}?`,
      body:
        `${doomed.map(j => j.spec.name).slice(0, 10).join(', ')}${doomed.length > 10 ? ', …' : ''}. ` +
        'Their logs and job folders are removed' +
        (live ? `; ${live} still queued or running will be stopped first.` : '.'),
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
    });
    if (!result.button.accept) {
      return;
    }
    const failed: string[] = [];
    for (const job of doomed) {
      try {
        await api.remove(job.id, true);
        this.selected.delete(job.id);
      } catch (error) {
        failed.push(`${job.spec.name}: ${errorText(error)}`);
      }
    }
    this.message.textContent = failed.length ? `Not deleted: ${failed.join('; ')}` : '';
    this.message.classList.toggle('ma-error', failed.length > 0);
    await this.refresh();
  }

  dispose(): void {
    window.clearInterval(this.timer);
    if (this.debounce !== null) {
      window.clearTimeout(this.debounce);
    }
    super.dispose();
  }
}
