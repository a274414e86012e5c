/**
 * The job page's Resources tab: the service's samples of the job (`GET /jobs/{id}/resources`),
 * CPU and memory per node drawn as SVG (chart.ts), and the cards' use when the backend reads
 * it (cards it cannot read are listed as held, never drawn as a flat 0 %).
 *
 * While the tab is current and the page visible, it reads every `RESOURCES_MS`; after the first
 * read it asks only for samples newer than the last one it holds.
 */
import { api } from './api';
import { lineChart } from './chart';
import { h } from './dom';
import { errorText } from './format';
import { isTerminal } from './jobstate';
import { JobTab, type JobPage } from './jobpage-tab';
import type { ResourceSample, ResourceUsage } from './models';

const RESOURCES_MS = 2000;

export class ResourcesTab extends JobTab {
  readonly label = 'Resources';
  private samples: ResourceSample[] = [];
  private usage: ResourceUsage | null = null;
  private timer: number | null = null;

  constructor(page: JobPage) {
    super('resources', page);
  }

  show(): void {
    void this.load();
    if (this.timer === null) {
      this.timer = window.setInterval(() => {
        if (this.page.current === 'resources' && this.page.isVisible) {
          void this.load();
        }
      }, RESOURCES_MS);
    }
  }

  dispose(): void {
    if (this.timer !== null) {
      window.clearInterval(this.timer);
    }
  }

  private async load(): Promise<void> {
    const section = this.section;
    const job = this.page.job;
    try {
      const since = this.samples.length ? this.samples[this.samples.length - 1].t : undefined;
      const usage = await api.resources(job.id, since);
      this.usage = usage;
      this.samples.push(...(usage.samples ?? []));
    } catch (error) {
      section.replaceChildren(h('p', { class: 'ma-error' }, `Cannot read the samples: ${errorText(error)}`));
      return;
    }
    const usage = this.usage!;
    const limits = usage.nodes ?? [];
    const cpuLimit = limits.length && limits[0].cpus ? limits[0].cpus * 100 : null;
    const memLimit = limits.length && limits[0].memory_mb ? limits[0].memory_mb : null;
    const width = Math.max(480, Math.min(1100, section.clientWidth - 24 || 760));
    const note = this.samples.length
      ? `${this.samples.length} samples, every ${usage.interval} s while the job runs (older ones thinned out).`
      : isTerminal(this.page.job)
        ? 'No samples: the job did not run long enough, or its backend cannot sample (Ray).'
        : `No samples yet: the service samples running jobs every ${usage.interval} s.`;
    const cards = this.samples.some(s => s.card_percent !== null && s.card_percent !== undefined);
    const cardMemory = this.samples.some(s => s.card_memory_mb !== null && s.card_memory_mb !== undefined);
    const held = limits.filter(l => l.cards);
    // cards whose use the backend cannot read (emulated ones: no device behind them) are listed
    // as held, never drawn as a flat 0 %
    const cardNote =
      held.length && !cards
        ? h(
            'p',
            { class: 'ma-muted ma-cards-note' },
            `Cards held: ${held.map(l => `${l.node} ${l.cards}`).join(', ')}. Their use is not sampled: ` +
              'the cards of this cluster are emulated, with no device to read.'
          )
        : null;
    section.replaceChildren(
      h('p', { class: 'ma-muted ma-resources-note' }, note),
      ...(cardNote ? [cardNote] : []),
      lineChart('CPU per node (100% = one core)', '%', this.samples, s => s.cpu_percent, cpuLimit, width),
      lineChart('Resident memory per node', 'MB', this.samples, s => s.memory_mb, memLimit, width),
      ...(cards ? [lineChart('Cards per node', '%', this.samples, s => s.card_percent ?? 0, 100, width)] : []),
      ...(cardMemory
        ? [lineChart('Card memory per node', 'MB', this.samples, s => s.card_memory_mb ?? 0, null, width)]
        : [])
    );
    section.dataset.samples = String(this.samples.length);
  }
}
