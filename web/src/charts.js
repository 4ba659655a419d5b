// Small SVG charts (no library): lines over time, drawn again whole when their data changes.

const SVG = 'http://www.w3.org/2000/svg';
export const PALETTE = ['#1f5fbf', '#d9480f', '#2b8a3e', '#862e9c', '#c2255c', '#0b7285', '#5c940d', '#e67700',
  '#364fc7', '#a61e4d', '#087f5b', '#495057'];

function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function clock(t, seconds) {
  const d = new Date(t * 1000);
  const two = (v) => String(v).padStart(2, '0');
  return `${two(d.getHours())}:${two(d.getMinutes())}${seconds ? `:${two(d.getSeconds())}` : ''}`;
}

// A round step for about `n` ticks over `span`.
function step(span, n) {
  const raw = span / n;
  const p = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

// series: [{name, points: [[t, v|null], ...]}]; from..to: the time shown (seconds); yMax: the top
// (the data's max when not given); format: a value's label. Returns a <figure>.
export function lineChart({ title, series, from, to, yMax, format = (v) => String(v), id }) {
  const W = 560, H = 210, L = 58, R = 12, T = 10, B = 26;
  let top = yMax;
  if (top === undefined) {
    top = 0;
    for (const s of series) for (const [, v] of s.points) if (v !== null && v > top) top = v;
    top = top > 0 ? top * 1.1 : 1;
  }
  const x = (t) => L + ((t - from) / Math.max(1, to - from)) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
  const g = el('g', { 'font-size': '12', fill: '#56606b' });
  const ys = step(top, 4);
  for (let v = 0; v <= top + 1e-9; v += ys) {
    g.append(el('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: '#e3e7ec' }));
    g.append(el('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end' }, format(v)));
  }
  const span = to - from;
  const xs = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600].find((v) => span / v <= 6) || 43200;
  for (let t = Math.ceil(from / xs) * xs; t <= to; t += xs) {
    g.append(el('line', { x1: x(t), x2: x(t), y1: T, y2: H - B, stroke: '#eef1f4' }));
    g.append(el('text', { x: x(t), y: H - B + 16, 'text-anchor': 'middle' }, clock(t, xs < 60)));
  }
  svg.append(g);
  const summary = [];
  series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    let d = '';
    let pen = false;
    let last = null;
    for (const [t, v] of s.points) {
      if (t < from || v === null || v === undefined) {
        pen = false;
        continue;
      }
      d += `${pen ? 'L' : 'M'}${x(t).toFixed(1)},${y(Math.min(v, top)).toFixed(1)}`;
      pen = true;
      last = v;
    }
    if (d) svg.append(el('path', { d, fill: 'none', stroke: color, 'stroke-width': '1.8', 'stroke-linejoin': 'round' }));
    summary.push(`${s.name}: ${last === null ? 'no data' : format(last)}`);
  });
  svg.setAttribute('aria-label', `${title}, last values: ${summary.join('; ')}`);
  const fig = document.createElement('figure');
  fig.className = 'panel chart';
  fig.style.margin = '0';
  if (id) fig.id = id;
  const cap = document.createElement('figcaption');
  cap.innerHTML = '<b></b>';
  cap.firstChild.textContent = title;
  fig.append(cap, svg);
  const legend = document.createElement('div');
  legend.className = 'legend';
  series.forEach((s, i) => {
    const span = document.createElement('span');
    const sw = document.createElement('i');
    sw.style.background = s.color || PALETTE[i % PALETTE.length];
    span.append(sw, s.name);
    legend.append(span);
  });
  fig.append(legend);
  let points = 0;
  let newest = null;
  for (const s of series) {
    for (const [t, v] of s.points) {
      if (t < from || v === null || v === undefined) continue;
      points++;
      if (newest === null || t > newest) newest = t;
    }
  }
  fig.dataset.points = String(points);
  // The time of the newest point drawn (the tests check it never goes back).
  if (newest !== null) fig.dataset.newest = String(newest);
  return fig;
}

// The machine's GPUs and how they are linked: NUMA nodes as boxes, NVLink as lines (an NVSwitch
// fabric as one bar its GPUs hang from), health as each GPU's colour.
export function topologyDiagram(gpus, links) {
  const n = gpus.length;
  const bw = 96, bh = 54, gap = 18, pad = 16;
  const numaOf = (g) => (g.numa_node === null || g.numa_node === undefined ? -1 : g.numa_node);
  const order = [...gpus].sort((a, b) => numaOf(a) - numaOf(b) || a.index - b.index);
  const pos = new Map();
  let cx = pad;
  let prev = null;
  for (const g of order) {
    if (prev !== null && numaOf(g) !== prev) cx += gap * 2;
    pos.set(g.index, cx);
    cx += bw + gap;
    prev = numaOf(g);
  }
  const W = Math.max(cx - gap + pad, 300);
  const nv = links.filter((l) => l.nvlinks > 0);
  const switched = nv.length > 0 && nv.every((l) => l.nvswitch) && nv.length === (n * (n - 1)) / 2;
  const rowY = switched ? 70 : 40 + Math.min(n, 8) * 9;
  const H = rowY + bh + 40;
  // Shrunk to fit down to 80% (its smallest text 9 px), no further: on a narrow screen (a phone) it
  // keeps that size and scrolls sideways in its own box rather than become unreadable.
  const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
  svg.style.minWidth = `${Math.round(W * 0.8)}px`; // through the CSSOM: the page's CSP has no inline styles
  const words = [];
  // NUMA boxes
  const groups = new Map();
  for (const g of order) {
    const k = numaOf(g);
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(g);
  }
  for (const [k, gs] of groups) {
    const x0 = pos.get(gs[0].index) - 8;
    const x1 = pos.get(gs[gs.length - 1].index) + bw + 8;
    svg.append(el('rect', { x: x0, y: rowY - 8, width: x1 - x0, height: bh + 34, rx: 6, fill: '#f1f4f8', stroke: '#c9d1db' }));
    svg.append(el('text', { x: x0 + 6, y: rowY + bh + 20, 'font-size': 11, fill: '#56606b' },
      k < 0 ? 'NUMA node unknown' : `NUMA node ${k}`));
    words.push(`NUMA node ${k < 0 ? 'unknown' : k}: GPUs ${gs.map((g) => g.index).join(', ')}`);
  }
  if (switched) {
    const x0 = pad, x1 = W - pad;
    svg.append(el('rect', { x: x0, y: 14, width: x1 - x0, height: 18, rx: 4, fill: '#2b8a3e' }));
    svg.append(el('text', { x: (x0 + x1) / 2, y: 27, 'text-anchor': 'middle', 'font-size': 11, fill: '#fff' },
      `NVSwitch fabric (${nv[0].label} between every pair)`));
    for (const g of gpus) {
      const x = pos.get(g.index) + bw / 2;
      svg.append(el('line', { x1: x, x2: x, y1: 32, y2: rowY, stroke: '#2b8a3e', 'stroke-width': 3 }));
    }
    words.push(`every GPU linked to every other through NVSwitch (${nv[0].label})`);
  } else {
    for (const l of nv) {
      const xa = pos.get(l.a) + bw / 2, xb = pos.get(l.b) + bw / 2;
      const h = Math.min(rowY - 12, 18 + Math.abs(xb - xa) / 8);
      svg.append(el('path', { d: `M${xa},${rowY} C${xa},${rowY - h} ${xb},${rowY - h} ${xb},${rowY}`, fill: 'none', stroke: '#2b8a3e', 'stroke-width': 2 }));
      words.push(`GPU ${l.a}–${l.b} ${l.label}`);
    }
    if (!nv.length) words.push('no NVLink: GPUs talk over PCIe');
  }
  for (const g of gpus) {
    const x = pos.get(g.index);
    const bad = !g.healthy;
    svg.append(el('rect', { x, y: rowY, width: bw, height: bh, rx: 5, fill: bad ? '#f9dcda' : '#fff', stroke: bad ? '#b3261e' : '#1f5fbf', 'stroke-width': 2 }));
    svg.append(el('text', { x: x + bw / 2, y: rowY + 22, 'text-anchor': 'middle', 'font-size': 13, 'font-weight': 600 }, `GPU ${g.index}`));
    const share = Math.round((g.allocated_milli || 0) / 10);
    svg.append(el('text', { x: x + bw / 2, y: rowY + 40, 'text-anchor': 'middle', 'font-size': 11, fill: '#56606b' },
      bad ? 'unhealthy' : `${share}% allocated`));
  }
  svg.setAttribute('aria-label', `Topology: ${words.join('; ')}`);
  return svg;
}
