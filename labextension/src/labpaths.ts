/**
 * Host paths and Lab paths. The job service speaks host paths (`/home/me/project/data`); Lab's
 * contents, file browser and documents speak paths relative to the folder Lab serves
 * (`data`). Lab's `serverRoot` page option joins the two; without it nothing is under the root.
 */
import { PageConfig } from '@jupyterlab/coreutils';

/** The Lab root on the host (`/home/me/project`), from the page config; '' when unknown. */
export function serverRoot(): string {
  return PageConfig.getOption('serverRoot') || '';
}

/** A Lab path (`data/train.py`) as a host path (`/home/me/project/data/train.py`). */
export function hostPath(labPath: string): string {
  const root = serverRoot().replace(/\/+$/, '');
  return labPath ? `${root}/${labPath.replace(/^\/+/, '')}` : root;
}

/**
 * A host path as a Lab path: '' for the root itself, `data/x` for a path under it, null when it
 * lies outside the root (or the root is unknown).
 */
export function labPath(host: string): string | null {
  const option = serverRoot();
  if (!option) {
    return null;
  }
  const root = option.replace(/\/+$/, '');
  const clean = host.replace(/\/+$/, '');
  if (clean === root) {
    return '';
  }
  return clean.startsWith(root + '/') ? clean.slice(root.length + 1).replace(/^\/+/, '') : null;
}
