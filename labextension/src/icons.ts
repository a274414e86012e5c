/**
 * The Launcher cards' and tabs' icons of the create form and the cluster view (the jobs table's
 * is index.ts's `jobsIcon`), drawn in JupyterLab's icon colour class so themes recolour them.
 */
import { LabIcon } from '@jupyterlab/ui-components';

/** A plus over a bar chart: a new training job. */
export const newJobIcon = new LabIcon({
  name: 'ma_jupyter:new-job',
  svgstr: `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="3" y="15" width="4" height="6" rx="1"/>
    <rect x="9" y="11" width="4" height="10" rx="1"/>
    <path d="M17 2h2v4h4v2h-4v4h-2V8h-4V6h4z"/>
    <rect x="15" y="14" width="4" height="7" rx="1"/>
  </g>
</svg>`
});

/** Three stacked servers: the cluster's nodes and their use. */
export const clusterIcon = new LabIcon({
  name: 'ma_jupyter:cluster',
  svgstr: `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M3 3h18v5H3zm2 2v1h2V5zM3 10h18v5H3zm2 2v1h2v-1zM3 17h18v5H3zm2 2v1h2v-1z" fill-rule="evenodd"/>
  </g>
</svg>`
});
