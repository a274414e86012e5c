/**
 * A plain SVG line chart of one quantity per node over time (the Resources tab): no chart
 * library, one polyline per node, the y axis scaled to what was used, each node's now / mean /
 * peak beside it.
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
 * A round step for about four grid lines up to `max`: 1, 2, 2.5 or 5 times a power of ten, so
 * the ticks read 0/5/10/15 or 0/250/500/750, never 28/55/83/110.
 */
export function niceStep(max: number): number {
  const raw = Math.max(max, 1e-9) / 4;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].find(m => m * power >= raw) ?? 10;
  return step * power;
}

/** The now / mean / peak of one node's series (its last, average and largest value). */
export interface Figures {
  node: string;
  now: number;
  mean: number;
  peak: number;
}

/** Per node (in order of first sample) the now / mean / peak of `value`. */
export function figures(samples: ResourceSample[], value: (s: ResourceSample) => number): Figures[] {
  const nodes = [...new Set(samples.map(s => s.node))];
  return nodes.map(node => {
    const values = samples.filter(s => s.node === node).map(value);
    return {
      node,
      now: values[values.length - 1],
      mean: values.reduce((a, b) => a + b, 0) / values.length,
      peak: Math.max(...values)
    };
  });
}

/** A figure as the chart shows it: whole from 10 up, one decimal from 1, two below; no trailing zeros. */
export function figure(v: number): string {
  const digits = Math.abs(v) >= 10 ? 0 : Math.abs(v) >= 1 ? 1 : 2;
  return digits ? v.toFixed(digits).replace(/\.?0+$/, '') : v.toFixed(0);
}

/**
 * The chart of `value` of `samples` per node, `width` × `height` pixels.
 *
 * 1. The y axis runs from 0 to a round value just above what was used (the peak of every
 *    node), with round ticks: a job using 3 % of a 400 % limit is drawn at its own scale.
 * 2. `limit` (the spec's) is a dashed line when it lies within that scale; otherwise its value
 *    is said in the legend ("limit 400 %, off the scale").
 * 3. Each node's legend line gives its now / mean / peak (`data-now`, `data-mean`, `data-peak`).
 *
 * Carries `data-samples` (how many samples it draws) and `data-max` (the top of the y axis).
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
  const right = 250;
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
  const used = Math.max(...samples.map(value), 0);
  const step = niceStep(used > 0 ? used * 1.05 : 4); // nothing used: an axis of 0..1
  const yMax = step * Math.max(1, Math.ceil((used * 1.05) / step));
  svg.setAttribute('data-max', String(yMax));
  const x = (t: number) => left + ((t - t0) / (t1 - t0)) * plotW;
  const y = (v: number) => top + plotH - (v / yMax) * plotH;
  // axes and round grid lines with their values
  for (let v = 0; v <= yMax + step / 1000; v += step) {
    svg.append(el('line', { x1: left, x2: left + plotW, y1: y(v), y2: y(v), class: 'ma-chart-grid' }));
    svg.append(el('text', { x: left - 6, y: y(v) + 4, class: 'ma-chart-tick', 'text-anchor': 'end' }, figure(v)));
  }
  svg.append(el('text', { x: left, y: height - 6, class: 'ma-chart-tick' }, '0 s'));
  svg.append(
    el('text', { x: left + plotW, y: height - 6, class: 'ma-chart-tick', 'text-anchor': 'end' }, `${Math.round(t1 - t0)} s`)
  );
  svg.append(el('text', { x: 4, y: top + 10, class: 'ma-chart-tick' }, unit));
  const legendX = left + plotW + 8;
  if (limit !== null) {
    const onScale = limit <= yMax;
    if (onScale) {
      svg.append(el('line', { x1: left, x2: left + plotW, y1: y(limit), y2: y(limit), class: 'ma-chart-limit' }));
    }
    svg.append(
      el(
        'text',
        { x: legendX, y: top + 4, class: 'ma-chart-tick ma-chart-limit-text', 'data-limit': limit },
        `limit ${figure(limit)} ${unit}${onScale ? '' : ', off the scale'}`
      )
    );
  }
  figures(samples, value).forEach((f, i) => {
    const mine = samples.filter(s => s.node === f.node);
    const color = COLORS[i % COLORS.length];
    const points = mine.map(s => `${x(s.t).toFixed(1)},${y(value(s)).toFixed(1)}`).join(' ');
    svg.append(el('polyline', { points, fill: 'none', stroke: color, 'stroke-width': 2, 'data-node': f.node }));
    for (const s of mine.length <= 60 ? mine : []) {
      svg.append(el('circle', { cx: x(s.t), cy: y(value(s)), r: 2.5, fill: color }));
    }
    const legendY = top + 22 + i * 30 + (limit !== null ? 4 : 0);
    svg.append(el('rect', { x: legendX, y: legendY - 9, width: 10, height: 10, fill: color }));
    svg.append(el('text', { x: legendX + 14, y: legendY, class: 'ma-chart-tick' }, f.node));
    svg.append(
      el(
        'text',
        {
          x: legendX + 14,
          y: legendY + 14,
          class: 'ma-chart-tick ma-chart-figures',
          'data-node': f.node,
          'data-now': f.now,
          'data-mean': f.mean,
          'data-peak': f.peak
        },
        `now ${figure(f.now)} · mean ${figure(f.mean)} · peak ${figure(f.peak)} ${unit}`
      )
    );
  });
  return svg;
}
