/**
 * A folder picker through Lab's own contents (the file browser's view of the Lab root): a
 * dialog listing folders, one level at a time; it answers the chosen folder as an absolute
 * host path (Lab's `serverRoot` joined with the Lab path), which is what the job service mounts.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import type { Contents } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { h } from './dom';
import { errorText } from './format';
import { hostPath, labPath } from './labpaths';

class FolderList extends Widget {
  path: string;
  private list: HTMLElement;
  private where: HTMLElement;

  constructor(
    private contents: Contents.IManager,
    start: string
  ) {
    super();
    this.path = start;
    this.addClass('ma-folder-picker');
    this.node.setAttribute('data-ma-view', 'folder-picker');
    this.where = h('div', { class: 'ma-folder-where' });
    this.list = h('ul', { class: 'ma-folder-list' });
    this.node.append(this.where, this.list);
    void this.open(start);
  }

  async open(path: string): Promise<void> {
    this.path = path;
    this.where.textContent = hostPath(path) || '/';
    this.list.replaceChildren(h('li', { class: 'ma-folder-muted' }, 'Loading…'));
    let model: Contents.IModel;
    try {
      model = await this.contents.get(path, { content: true });
    } catch (error) {
      this.list.replaceChildren(h('li', { class: 'ma-error' }, errorText(error)));
      return;
    }
    const folders = ((model.content as Contents.IModel[]) ?? [])
      .filter(item => item.type === 'directory' && !item.name.startsWith('.'))
      .sort((a, b) => a.name.localeCompare(b.name));
    const items: HTMLElement[] = [];
    if (path) {
      items.push(
        h('li', { class: 'ma-folder', onclick: () => void this.open(PathExt.dirname(path)) }, '↑ .. (parent folder)')
      );
    }
    for (const folder of folders) {
      items.push(
        h(
          'li',
          {
            class: 'ma-folder',
            'data-path': folder.path,
            onclick: () => void this.open(folder.path)
          },
          `📁 ${folder.name}`
        )
      );
    }
    if (!folders.length) {
      items.push(h('li', { class: 'ma-folder-muted' }, 'no subfolders'));
    }
    this.list.replaceChildren(...items);
  }
}

/**
 * Ask for a folder, starting at `start` (a host path under the Lab root, else the root);
 * the host path chosen, or null when cancelled.
 */
export async function pickFolder(
  contents: Contents.IManager,
  title: string,
  start = ''
): Promise<string | null> {
  const body = new FolderList(contents, labPath(start) ?? '');
  const result = await showDialog({
    title,
    body,
    buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Choose this folder' })]
  });
  return result.button.accept ? hostPath(body.path) : null;
}
