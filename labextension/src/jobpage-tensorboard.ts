/**
 * The job page's TensorBoard tab: the job's TensorBoard embedded through the Jupyter server's
 * proxy (`/ma-jupyter/tensorboard/<id>/`), started on first open.
 *
 * TensorBoard shows a blank page over a folder without event files: the tab says so instead
 * (`data-ma-tb-empty`), with what writes them, and while the job runs asks again every 10 s,
 * showing the board once the job writes some.
 *
 * From the tab's first click until the board's page has loaded (the board starts, reads the
 * folder, then draws: several seconds) a spinner says what it waits for (`data-ma-tb-loading`),
 * never a blank box.
 */
import { api, tensorboardRuns } from './api';
import { h } from './dom';
import { isTerminal } from './jobstate';
import { JobTab, type JobPage } from './jobpage-tab';

/** A spinner and what it waits for (`data-ma-tb-loading`). */
function loading(text: string): HTMLElement {
  return h(
    'div',
    { class: 'ma-tb-loading', 'data-ma-tb-loading': '', role: 'status' },
    h('span', { class: 'ma-spinner', 'aria-hidden': 'true' }),
    h('span', {}, text)
  );
}

export class TensorboardTab extends JobTab {
  readonly label = 'TensorBoard';
  private loaded = false;

  constructor(page: JobPage) {
    super('tensorboard', page);
  }

  show(): void {
    void this.page.act(() => this.load());
  }

  private async load(): Promise<void> {
    const section = this.section;
    if (this.loaded) {
      return;
    }
    const unavailable = this.page.unavailable('tensorboard');
    if (unavailable !== null) {
      section.replaceChildren(h('p', { class: 'ma-muted' }, unavailable));
      return;
    }
    section.replaceChildren(loading('Starting TensorBoard…'));
    const job = this.page.job;
    const { url } = await api.tensorboard(job.id);
    this.loaded = true;
    const folder = this.page.job.outputs_folder ?? this.page.job.spec.outputs;
    // a board just started may not have read the folder yet: ask a few times before saying so
    let runs = await tensorboardRuns(job.id);
    for (let i = 0; i < 4 && runs !== null && runs.length === 0; i++) {
      await new Promise(resolve => window.setTimeout(resolve, 1500));
      runs = await tensorboardRuns(job.id);
    }
    if (runs !== null && runs.length === 0) {
      this.loaded = false; // opening the tab again asks again
      const ended = isTerminal(this.page.job);
      section.replaceChildren(
        h(
          'div',
          { class: 'ma-tb-empty', 'data-ma-tb-empty': '' },
          h('p', {}, `No TensorBoard event files in ${folder}${ended ? '' : ' yet'}.`),
          h(
            'p',
            { class: 'ma-muted' },
            'TensorBoard draws what a job logs with tf.summary, torch.utils.tensorboard.SummaryWriter, ' +
              "Keras' TensorBoard callback or Lightning's TensorBoardLogger, written under /workspace/outputs " +
              "(the job's outputs folder). " +
              (ended ? 'This job ended without writing any there.' : 'This page shows the board as soon as the job writes some.')
          ),
          h('a', { href: url, target: '_blank', rel: 'noopener', class: 'ma-tb-link' }, 'Open TensorBoard anyway')
        )
      );
      if (!ended) {
        window.setTimeout(() => {
          if (!this.page.isDisposed && section.isConnected && section.querySelector('[data-ma-tb-empty]')) {
            void this.load();
          }
        }, 10000);
      }
      return;
    }
    const shown = this.page.job;
    const cover = loading('Loading the TensorBoard page…');
    const frame: HTMLIFrameElement = h('iframe', { class: 'ma-tensorboard', src: url, title: `TensorBoard of ${shown.id}` });
    frame.addEventListener('load', () => cover.remove());
    section.replaceChildren(
      h(
        'div',
        { class: 'ma-toolbar' },
        h('span', { class: 'ma-muted' }, `TensorBoard over ${shown.outputs_folder ?? shown.spec.outputs}`),
        h('a', { href: url, target: '_blank', rel: 'noopener', class: 'ma-tb-link' }, 'Open in a new browser tab')
      ),
      h('div', { class: 'ma-tb-frame' }, frame, cover)
    );
  }
}
