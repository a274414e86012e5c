/**
 * Every command id the extension registers or runs, in one place.
 *
 * The extension's own commands are registered by one module each (named at each id) and run
 * from anywhere by id, so no view imports another view only to learn a command's name. The
 * `run-cell` id is also spelled in `schema/main-area.json` (the notebook toolbar button).
 */

/** Show the left-sidebar panel (registered in index.ts). */
export const SHOW_SIDEBAR = 'ma-jupyter:show-sidebar';
/** The main-area jobs table (mainarea.ts). */
export const OPEN_JOBS = 'ma-jupyter:open-jobs';
/** One job's main-area tab, args `{id}` (mainarea.ts). */
export const OPEN_JOB = 'ma-jupyter:open-job';
/** The create form; args `algorithm`, `command`, `name`, or a whole `spec` (submitfrom.ts). */
export const CREATE_JOB = 'ma-jupyter:create-job';
/** The create form for the `.py` file selected in the file browser (submitfrom.ts). */
export const SUBMIT_FILE = 'ma-jupyter:submit-file';
/** Run the active notebook cell as `%%ma_train` (submitfrom.ts, schema/main-area.json). */
export const RUN_CELL = 'ma-jupyter:run-cell';
/** The cluster view (submitfrom.ts). */
export const OPEN_CLUSTER = 'ma-jupyter:open-cluster';

/** JupyterLab's own commands the extension runs (their packages are not build dependencies). */
export const LAB = {
  /** the file browser at `{path}` (absolute within the Lab root: `/a/b`) */
  goToPath: 'filebrowser:go-to-path',
  /** open a document at `{path}` (relative to the Lab root) */
  openDocument: 'docmanager:open'
} as const;
