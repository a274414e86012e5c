/**
 * The job page's Outputs tab: the job's outputs folder listed through Lab's contents (one
 * level; a click opens a file as a document, a folder in the file browser), when the folder
 * lies under the Lab root; otherwise only its host path, said to be out of Lab's reach.
 */
import { LAB } from './commands';
import { h } from './dom';
import { dateTime, errorText } from './format';
import { JobTab, type JobPage } from './jobpage-tab';
import { labPath } from './labpaths';

/** One entry of a Lab contents listing, as the table shows it. */
interface Item {
  name: string;
  path: string;
  type: string;
  size?: number;
  last_modified?: string;
}

export class OutputsTab extends JobTab {
  readonly label = 'Outputs';

  constructor(page: JobPage) {
    super('outputs', page);
  }

  show(): void {
    void this.page.act(() => this.load());
  }

  private async load(): Promise<void> {
    const section = this.section;
    const job = this.page.job;
    const folder = job.outputs_folder ?? job.spec.outputs;
    if (!folder) {
      section.replaceChildren(h('p', { class: 'ma-muted' }, 'The job has no outputs folder.'));
      return;
    }
    const relative = labPath(folder);
    if (relative === null) {
      section.replaceChildren(
        h('p', {}, 'Outputs folder: ', h('code', {}, folder)),
        h('p', { class: 'ma-muted' }, 'It lies outside the folder JupyterLab serves, so Lab cannot list or open its files.')
      );
      return;
    }
    const app = this.page.host.app;
    let listing;
    try {
      listing = await app.serviceManager.contents.get(relative, { content: true });
    } catch (error) {
      section.replaceChildren(
        h('p', {}, 'Outputs folder: ', h('code', {}, folder)),
        h('p', { class: 'ma-muted' }, `Nothing there yet (${errorText(error)}).`)
      );
      return;
    }
    const items = (listing.content ?? []) as Item[];
    section.replaceChildren(
      h(
        'div',
        { class: 'ma-toolbar' },
        h('span', {}, 'Outputs folder: ', h('code', {}, folder)),
        h(
          'button',
          {
            class: 'jp-Button jp-mod-styled ma-open-folder',
            onclick: () => void app.commands.execute(LAB.goToPath, { path: '/' + relative })
          },
          'Show in the file browser'
        ),
        h('button', { class: 'jp-Button jp-mod-styled', onclick: () => void this.page.act(() => this.load()) }, 'Refresh')
      ),
      items.length
        ? h(
            'table',
            { class: 'ma-facts ma-outputs-table' },
            h('tr', {}, ...['Name', 'Kind', 'Size', 'Modified'].map(t => h('th', {}, t))),
            ...items.map(item =>
              h(
                'tr',
                { 'data-path': item.path },
                h(
                  'td',
                  {},
                  h(
                    'a',
                    {
                      href: '#',
                      onclick: (e: globalThis.Event) => {
                        e.preventDefault();
                        void app.commands.execute(item.type === 'directory' ? LAB.goToPath : LAB.openDocument, {
                          path: item.type === 'directory' ? '/' + item.path : item.path
                        });
                      }
                    },
                    item.name
                  )
                ),
                h('td', {}, item.type),
                h('td', {}, item.size === undefined || item.size === null ? '' : `${item.size} B`),
                h('td', {}, dateTime(item.last_modified))
              )
            )
          )
        : h('p', { class: 'ma-muted' }, 'The folder is empty.')
    );
  }
}
