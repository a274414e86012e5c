/**
 * A plain SVG line chart of one quantity per node over time (the Resources tab): no chart
 * library, one polyline per node, the y axis from 0 to the larger of the peak and the limit.
 */
import type { ResourceSample } from './models';

const SVG = 'http://www.w3.org/2000/svg';
const COLORS = ['#1976d2', '#d32f2f', '#388e3c', '#f57c00', '#7b1fa2', '#00838f', '#5d4037', '#c2185b'];

function el(tag: string, attrs: Record<string, string | number>, text?: string): SVGElement {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) {
    node.setAttribute(key, String(value));
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/**
 * The chart of `value` of `samples` per node, `width` × `height` pixels; `limit` draws a dashed
 * line (the spec's limit) when given. Carries `data-samples` (how many samples it draws).
 */
export function lineChart(
  title: string,
  unit: string,
  samples: ResourceSample[],
  value: (s: ResourceSample) => number,
  limit: number | null,
  width = 720,
  height = 220
): SVGSVGElement {
  const svg = el('svg', {
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    class: 'ma-chart',
    role: 'img',
    'aria-label': title,
    'data-samples': samples.length
  }) as SVGSVGElement;
  const left = 56;
  const right = 130;
  const top = 24;
  const bottom = 28;
  const plotW = width - left - right;
  const plotH = height - top - bottom;
  svg.append(el('text', { x: left, y: 16, class: 'ma-chart-title' }, title));
  if (samples.length === 0) {
    svg.append(el('text', { x: left, y: top + plotH / 2, class: 'ma-chart-empty' }, 'no samples yet'));
    return svg;
  }
  const t0 = samples[0].t;
  const t1 = Math.max(samples[samples.length - 1].t, t0 + 1);
  const peak = Math.max(...samples.map(value), limit ?? 0, 1);
  const yMax = peak * 1.1;
  const x = (t: number) => left + ((t - t0) / (t1 - t0)) * plotW;
  const y = (v: number) => top + plotH - (v / yMax) * plotH;
  // axes and a few grid lines with their values
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    svg.append(el('line', { x1: left, x2: left + plotW, y1: y(v), y2: y(v), class: 'ma-chart-grid' }));
    svg.append(el('text', { x: left - 6, y: y(v) + 4, class: 'ma-chart-tick', 'text-anchor': 'end' }, v.toFixed(0)));
  }
  svg.append(el('text', { x: left, y: height - 6, class: 'ma-chart-tick' }, '0 s'));
  svg.append(
    el('text', { x: left + plotW, y: height - 6, class: 'ma-chart-tick', 'text-anchor': 'end' }, `${Math.round(t1 - t0)} s`)
  );
  svg.append(el('text', { x: 4, y: top + 10, class: 'ma-chart-tick' }, unit));
  if (limit !== null) {
    svg.append(el('line', { x1: left, x2: left + plotW, y1: y(limit), y2: y(limit), class: 'ma-chart-limit' }));
    svg.append(el('text', { x: left + plotW + 6, y: y(limit) + 4, class: 'ma-chart-tick' }, `limit ${limit.toFixed(0)}`));
  }
  const nodes = [...new Set(samples.map(s => s.node))];
  nodes.forEach((node, i) => {
    const mine = samples.filter(s => s.node === node);
    const color = COLORS[i % COLORS.length];
    const points = mine.map(s => `${x(s.t).toFixed(1)},${y(value(s)).toFixed(1)}`).join(' ');
    svg.append(el('polyline', { points, fill: 'none', stroke: color, 'stroke-width': 2, 'data-node': node }));
    for (const s of mine.length <= 60 ? mine : []) {
      svg.append(el('circle', { cx: x(s.t), cy: y(value(s)), r: 2.5, fill: color }));
    }
    const legendY = top + 14 + i * 16 + (limit !== null ? 18 : 0);
    svg.append(el('rect', { x: left + plotW + 8, y: legendY - 9, width: 10, height: 10, fill: color }));
    svg.append(el('text', { x: left + plotW + 22, y: legendY, class: 'ma-chart-tick' }, node));
  });
  return svg;
}
