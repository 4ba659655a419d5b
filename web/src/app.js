// Tessera's dashboard: the machine's GPUs, jobs and history, kept current by the server's event
// stream. Routes: #/ (overview), #/jobs (queue and running, submit), #/jobs/<id> (one job).
import { ApiError, call, openStream, setToken, takeTokenFromAddress, token } from './api.js';
import { PALETTE, lineChart, topologyDiagram } from './charts.js';

const main = document.getElementById('main');
const S = {
  me: null, // {user, admin}
  info: null,
  gpus: [],
  links: [],
  simulated: false,
  summary: { jobs: {}, users: [] }, // counts of every job (GET /v1/summary)
  running: [], // the running jobs (the GPU tiles)
  jobs: [], // the jobs page's list: a page of the newest, filtered by the server
  quotas: [],
  acct: null, // the last 7 days' accounting: GPU-hours and efficiency per user (GET /v1/acct)
  offline: false, // the server does not answer: what is shown is as of `offlineSince`
  offlineSince: 0,
  history: { interval_s: 5, window_s: 3600, samples: [] },
  stopStream: null,
};

// ---- small helpers ----

function h(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'style') e.style.cssText = v; // CSSOM: allowed by the page's CSP, a style attribute is not
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const k of kids.flat()) if (k !== null && k !== undefined && k !== false) e.append(k);
  return e;
}

// replaceChildren without the nulls and falses that conditional parts leave.
function fill(parent, ...kids) {
  parent.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false));
}

function bytes(b) {
  if (b === null || b === undefined) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) {
    b /= 1024;
    i++;
  }
  return `${b >= 10 || i === 0 ? Math.round(b) : b.toFixed(1)} ${u[i]}`;
}

function pct(v) {
  return v === null || v === undefined ? '–' : `${Math.round(v * 100)}%`;
}

// A count as every view says it: thousands grouped ("10,000"), one decimal at most.
function count(v) {
  return (Math.round(v * 10) / 10).toLocaleString('en-US');
}

function ago(t) {
  if (!t) return '–';
  const s = Math.max(0, Date.now() / 1000 - t);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return new Date(t * 1000).toLocaleString();
}

function shape(job) {
  const r = (job.spec && job.spec.resources) || {};
  const parts = [];
  // A share (gpu_share, gpu_memory) is on each of `gpus` GPUs; without one, `gpus` are whole.
  const share = r.gpu_share !== undefined || r.gpu_memory !== undefined;
  // Elastic (gpus_max): its range; where it runs says how many it got.
  if (r.gpus && !share && r.gpus_max) parts.push(`${r.gpus}-${r.gpus_max} GPUs`);
  else if (r.gpus && !share) parts.push(`${r.gpus} GPU${r.gpus > 1 ? 's' : ''}`);
  if (r.gpu_share !== undefined) parts.push(`${typeof r.gpu_share === 'number' ? `${r.gpu_share}%` : r.gpu_share} share`);
  if (r.gpu_memory) parts.push(`${r.gpu_memory}`);
  if (share && r.gpus > 1) parts.push(`on ${r.gpus} GPUs`);
  if (r.model) parts.push(Array.isArray(r.model) ? r.model.join('|') : r.model);
  return parts.join(', ') || 'no GPU';
}

// Where a job was placed: its GPUs, or "no GPU" for a job that asked none.
function placedOn(p) {
  const gpus = (p && p.gpus) || [];
  return gpus.length ? `GPU${gpus.length > 1 ? 's' : ''} ${gpus.map((g) => g.index).join(', ')}` : 'no GPU';
}

// An elastic job resized while it ran: its GPUs over time, as a step chart and in words.
function sizesPanel(job) {
  const sizes = (job.placement && job.placement.sizes) || [];
  if (!sizes.length) return null;
  const to = job.ended_at || Math.max(Date.now() / 1000, sizes[sizes.length - 1].at + 1);
  const points = [];
  sizes.forEach((z, i) => {
    if (i > 0) points.push([z.at, sizes[i - 1].gpus]);
    points.push([z.at, z.gpus]);
  });
  points.push([to, sizes[sizes.length - 1].gpus]);
  const most = (job.spec.resources || {}).gpus_max || Math.max(...sizes.map((z) => z.gpus));
  const said = sizes.map((z) => `${z.gpus} GPU${z.gpus === 1 ? '' : 's'} from ${new Date(z.at * 1000).toLocaleTimeString()}`).join(', ');
  return [h('h2', {}, 'Size over time'),
    h('p', { id: 'sizes' }, `${said} (started again ${count(job.placement.restarts || 0)} times)`),
    lineChart({ id: 'chart-size', title: 'GPUs held', from: sizes[0].at, to, yMax: most,
      series: [{ name: 'GPUs', color: PALETTE[0], points }], format: count })];
}

function stateCell(s) {
  return h('span', { class: `state state-${s}` }, s);
}

function setLive(s) {
  const e = document.getElementById('live');
  e.className = `live ${s === 'live' ? 'on' : s === 'reconnecting' ? 'off' : ''}`;
  e.textContent = s === 'live' ? 'live' : s === 'reconnecting' ? 'reconnecting…' : s;
  if (s === 'reconnecting') setOffline(true);
  if (s === 'live' && S.offline) setOffline(false);
  if (s === 'signed-out') signIn('Your token is no longer accepted: sign in again.');
}

// Coalesces bursts of events into one refresh per animation frame (or per `ms`).
function debounce(fn, ms) {
  let timer = null;
  return () => {
    if (timer) return;
    timer = setTimeout(() => {
      timer = null;
      fn();
    }, ms);
  };
}

// ---- data ----

// The jobs page shows at most this many (the newest); the counts are the server's, of every job.
const PAGE = 500;

async function loadAll() {
  const [info, gpus, summary, running, quotas, history] = await Promise.all([
    call('GET', '/v1/info'),
    call('GET', '/v1/gpus'),
    call('GET', '/v1/summary'),
    call('GET', '/v1/jobs?state=running'),
    call('GET', '/v1/quotas'),
    call('GET', '/v1/history'),
  ]);
  S.info = info;
  S.me = info.caller;
  S.gpus = gpus.gpus;
  S.links = gpus.links || [];
  S.simulated = gpus.simulated;
  S.summary = summary;
  S.running = running.jobs;
  S.quotas = quotas.quotas;
  // Samples the stream brought while this was fetched are newer than the answer (read before they
  // were taken): kept, or a chart would go back to older data after showing the newer.
  const last = history.samples.length ? history.samples[history.samples.length - 1].at : -Infinity;
  for (const sample of S.history.samples) if (sample.at > last) history.samples.push(sample);
  S.history = history;
}

const refreshJobs = debounce(async () => {
  try {
    const [summary, running, gpus, quotas] = await Promise.all([
      call('GET', '/v1/summary'),
      call('GET', '/v1/jobs?state=running'),
      call('GET', '/v1/gpus'),
      call('GET', '/v1/quotas'),
    ]);
    S.summary = summary;
    S.running = running.jobs;
    S.gpus = gpus.gpus;
    S.quotas = quotas.quotas;
    if (view.reload) await view.reload();
    update();
  } catch (e) {
    if (e.status === 401) signIn(e.message);
  }
}, 150);

// May the signed-in user act on this job (cancel, hold, priority)? Its owner or an admin.
function mine(job) {
  return S.me && (S.me.admin || job.owner === S.me.user);
}

// The server does not answer (the stream broke and has not come back): say so, keep what is shown
// marked as old, and disable every action until it answers again.
function setOffline(off) {
  if (off && !S.offline) S.offlineSince = Date.now();
  S.offline = off;
  const banner = document.getElementById('offline');
  banner.hidden = !off;
  banner.textContent = off
    ? `The server does not answer: what is shown is as of ${new Date(S.offlineSince).toLocaleTimeString()}, and actions are off until it is back.`
    : '';
  document.body.classList.toggle('offline', off);
  disableActions();
}

function disableActions() {
  for (const e of main.querySelectorAll('button, input, select, textarea')) {
    if (S.offline) {
      if (!e.disabled) e.dataset.offline = '1';
      e.disabled = true;
    } else if (e.dataset.offline) {
      delete e.dataset.offline;
      e.disabled = false;
    }
  }
}

function onEvent(type, data) {
  if (type === 'hello' || type === 'reset') {
    // (Re)connected: what was missed while away comes as events; the rest is fetched again.
    loadAll().then(async () => {
      if (view.reload) await view.reload();
      update();
      // How many such reloads are shown (the tests wait for it).
      document.body.dataset.reloads = String(Number(document.body.dataset.reloads || 0) + 1);
    }).catch(() => {});
  } else if (type === 'job') {
    const j = S.jobs.find((x) => x.id === data.job);
    if (j) {
      j.state = data.state;
      j.reason = data.reason;
    }
    if (view.jobId === data.job) view.refreshJob();
    refreshJobs();
  } else if (type === 'gpu') {
    const g = S.gpus.find((x) => x.index === data.index);
    if (g) {
      g.healthy = data.healthy;
      g.health_reason = data.reason;
    }
    update();
    refreshJobs();
  } else if (type === 'sample') {
    const hs = S.history.samples;
    hs.push(data);
    // Bounded: the server's window, however long the page stays open.
    const keep = data.at - S.history.window_s;
    let drop = 0;
    while (drop < hs.length && hs[drop].at < keep) drop++;
    if (drop) hs.splice(0, drop);
    if (view.name === 'overview') view.charts();
  }
}

// ---- views ----

const view = { name: '', jobId: null, refreshJob: () => {}, charts: () => {}, update: () => {} };

function update() {
  view.update();
  disableActions();
}

function summary() {
  const healthy = S.gpus.filter((g) => g.healthy).length;
  const alloc = S.gpus.reduce((a, g) => a + (g.allocated_milli || 0), 0) / 1000;
  const c = S.summary.jobs || {};
  const card = (label, value, cls, id) => h('div', { class: `panel ${cls || ''}`, id }, h('b', {}, value), label);
  return h('div', { class: 'summary', 'aria-label': 'Summary' },
    card('GPUs healthy', `${healthy} of ${S.gpus.length}`, healthy < S.gpus.length ? 'unhealthy' : ''),
    card('GPUs allocated', `${alloc.toFixed(alloc % 1 ? 1 : 0)} of ${S.gpus.length}`),
    card('jobs running', count(c.running || 0), '', 'count-running'),
    card(c.held ? `jobs queued (${count(c.held)} held)` : 'jobs queued', count(c.queued || 0), '', 'count-queued'));
}

function gpuTile(g) {
  const jobs = S.running.filter((j) => (g.jobs || []).includes(j.id));
  const memUsed = g.memory_used_bytes ?? (g.allocated_memory_mib ? g.allocated_memory_mib * 2 ** 20 : 0);
  const memFrac = g.memory_bytes ? Math.min(1, memUsed / g.memory_bytes) : 0;
  const title = `GPU ${g.index}`;
  return h('section', { class: `panel tile ${g.healthy ? '' : 'unhealthy'}`, 'data-gpu': g.index, 'aria-label': `${title}, ${g.healthy ? 'healthy' : 'unhealthy'}` },
    h('h3', {}, title, h('span', { class: 'badge' }, g.healthy ? 'healthy' : 'unhealthy')),
    h('div', { class: 'muted' }, g.model, g.sharing === 'mps' ? ' · MPS' : ''),
    g.healthy ? null : h('div', { class: 'alert' }, g.health_reason || 'unhealthy'),
    g.mps && g.mps.deaths > 0 ? h('div', { class: 'muted' }, `MPS daemon died ${g.mps.deaths}×, started ${g.mps.starts}×`) : null,
    h('div', {}, `memory ${bytes(memUsed)} of ${bytes(g.memory_bytes)}${g.memory_used_bytes === null ? ' allocated' : ''}`),
    h('div', { class: 'meter', role: 'meter', 'aria-label': 'memory', 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': Math.round(memFrac * 100) },
      h('span', { style: `width:${(memFrac * 100).toFixed(1)}%` })),
    h('div', {}, `allocated ${Math.round((g.allocated_milli || 0) / 10)}%`),
    h('div', { class: 'meter', role: 'meter', 'aria-label': 'allocated', 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': Math.round((g.allocated_milli || 0) / 10) },
      h('span', { style: `width:${Math.min(100, (g.allocated_milli || 0) / 10)}%` })),
    h('dl', { class: 'kv' },
      h('dt', {}, 'utilization'), h('dd', {}, pct(g.utilization)),
      h('dt', {}, 'temperature'), h('dd', {}, g.temperature_celsius === null ? '–' : `${g.temperature_celsius} °C`),
      h('dt', {}, 'power'), h('dd', {}, g.power_watts === null ? '–' : `${Math.round(g.power_watts)} W`)),
    h('ul', { 'aria-label': `jobs on GPU ${g.index}` },
      jobs.length ? jobs.map((j) => {
        const p = j.placement || {};
        const frac = p.milli_per_gpu && p.milli_per_gpu < 1000;
        return h('li', {}, h('a', { href: `#/jobs/${j.id}` }, `#${j.id} ${j.name || ''}`), ` ${j.owner} · `,
          frac ? `${Math.round(p.milli_per_gpu / 10)}% share${p.memory_mib_per_gpu ? `, ${bytes(p.memory_mib_per_gpu * 2 ** 20)}` : ''}` : 'whole GPU');
      }) : h('li', { class: 'muted' }, 'no job')));
}

function historySeries() {
  const hs = S.history.samples;
  const to = Math.max(Date.now() / 1000, hs.length ? hs[hs.length - 1].at : 0);
  // The last hour, or since the history begins (at least two minutes).
  const first = hs.length ? hs[0].at : to;
  const from = Math.min(to - 120, Math.max(first, to - Math.min(S.history.window_s, 3600)));
  const perGpu = (key, scale = 1) => S.gpus.map((g, i) => ({
    name: `GPU ${g.index}`,
    color: PALETTE[i % PALETTE.length],
    points: hs.map((s) => [s.at, s[key] && s[key][i] !== null && s[key][i] !== undefined ? s[key][i] * scale : null]),
  }));
  const hasUtil = hs.some((s) => s.util && s.util.some((v) => v !== null));
  const hasMem = hs.some((s) => s.mem && s.mem.some((v) => v !== null));
  return { hs, from, to, perGpu, hasUtil, hasMem };
}

function chartsPanel() {
  const { hs, from, to, perGpu, hasUtil, hasMem } = historySeries();
  const n = S.gpus.length;
  const wrap = h('div', { class: 'charts', id: 'charts' },
    lineChart({ id: 'chart-util', title: hasUtil ? 'Utilization per GPU' : 'Allocated share per GPU (no utilization: simulated machine)',
      series: perGpu(hasUtil ? 'util' : 'alloc', 100), from, to, yMax: 100, format: (v) => `${Math.round(v)}%` }),
    lineChart({ id: 'chart-mem', title: hasMem ? 'Memory used per GPU' : 'Memory allocated per GPU',
      series: perGpu(hasMem ? 'mem' : 'alloc_mem', 1 / 2 ** 30), from, to, format: (v) => `${Math.round(v)} GiB` }),
    lineChart({ id: 'chart-jobs', title: 'Jobs queued and running', from, to,
      series: [{ name: 'queued', color: '#e67700', points: hs.map((s) => [s.at, s.queued]) },
        { name: 'running', color: '#2b8a3e', points: hs.map((s) => [s.at, s.running]) }],
      format: count }),
    lineChart({ id: 'chart-alloc', title: 'GPUs allocated and idle', from, to, yMax: Math.max(1, n),
      series: [{ name: 'allocated', color: '#1f5fbf', points: hs.map((s) => [s.at, s.allocated]) },
        { name: 'idle', color: '#868e96', points: hs.map((s) => [s.at, s.healthy - s.busy]) }],
      format: count }));
  return wrap;
}

function quotaTable() {
  if (!S.quotas.length) return h('p', { class: 'muted' }, 'No quotas are set (quotas and group_quotas in the server\'s config).');
  const cell = (used, limit, fmt = count) => (limit === null ? `${fmt(used)} (no limit)` : `${fmt(used)} of ${fmt(limit)}`);
  return h('div', { class: 'scroll' }, h('table', {},
    h('thead', {}, h('tr', {}, ['Who', 'GPUs', 'Compute', 'Memory', 'Borrowing'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, S.quotas.map((q) => h('tr', {},
      h('td', {}, `${q.kind} ${q.name}`),
      h('td', {}, cell(q.used.gpus, q.limit.gpus)),
      h('td', {}, cell(q.used.gpu_milli, q.limit.gpu_milli, (v) => `${(v / 1000).toFixed(1)} GPU`)),
      h('td', {}, cell(q.used.gpu_memory_mib, q.limit.gpu_memory_mib, (v) => bytes(v * 2 ** 20))),
      h('td', {}, q.borrow ? `yes${q.cohort ? ` (cohort ${q.cohort})` : ''}` : 'no'))))));
}

// What each user used of what their jobs held over the last 7 days (`tessera acct`'s GPU BUSY and
// GPU MEM USED): a user sees their own line, an admin everyone's.
function efficiencyTable() {
  const lines = (S.acct && S.acct.by_user) || [];
  if (!lines.length) return h('p', { class: 'muted' }, 'No job ran in the last 7 days.');
  const p = (v) => (v === null || v === undefined ? '–' : `${v.toFixed(1)}%`);
  return h('div', { class: 'scroll' }, h('table', { id: 'efficiency' },
    h('thead', {}, h('tr', {}, ['User', 'Jobs', 'GPU-hours', 'GPU busy', 'GPU memory used'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, lines.map((l) => h('tr', {},
      h('td', {}, l.key),
      h('td', {}, count(l.jobs)),
      h('td', {}, l.gpu_hours.toFixed(2)),
      h('td', {}, p(l.gpu_busy_pct)),
      h('td', {}, p(l.gpu_memory_used_pct)))))));
}

// The measured jobs that left the most of what they held idle over the last 7 days (`tessera
// acct`'s most_idle), each a link to its page: where the idle GPU time went.
function idleJobsTable() {
  const jobs = (S.acct && S.acct.most_idle) || [];
  if (!jobs.length) return h('p', { class: 'muted' }, 'No measured job left GPU time idle in the last 7 days.');
  return h('div', { class: 'scroll' }, h('table', { id: 'most-idle' },
    h('thead', {}, h('tr', {}, ['Job', 'Name', 'Owner', 'GPU-hours', 'GPU busy', 'Idle GPU-hours'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, jobs.map((j) => h('tr', { 'data-job': j.id },
      h('td', {}, h('a', { href: `#/jobs/${j.id}` }, `#${j.id}`)),
      h('td', {}, j.name || ''),
      h('td', {}, j.owner),
      h('td', {}, j.gpu_hours.toFixed(4)),
      h('td', {}, `${j.gpu_busy_pct.toFixed(1)}%`),
      h('td', {}, j.idle_gpu_hours.toFixed(4)))))));
}

// A job's efficiency (GET /v1/jobs/N's `efficiency`, `tessera eff`): what it used of what it held.
function efficiencyList(e) {
  const p = (v) => (v === null || v === undefined ? '–' : `${v.toFixed(1)}%`);
  const of = (used, given, fmt) => (used === undefined ? '–' : `${fmt(used)}${given !== undefined ? ` of ${fmt(given)}` : ''}`);
  const mib = (v) => bytes(v * 2 ** 20);
  return h('dl', { class: 'kv panel', id: 'efficiency' },
    h('dt', {}, 'elapsed'), h('dd', {}, `${count(e.elapsed_s)} s${e.running ? ' so far' : ''}`),
    h('dt', {}, 'GPUs held'), h('dd', {}, `${count(e.gpus)}${e.share ? ' (a share)' : ''}, ${e.gpu_hours.toFixed(3)} GPU-hours`),
    h('dt', {}, 'GPU busy'), h('dd', {}, `${p(e.gpu_busy_pct)}${e.gpu_used_pct !== undefined ? `; it used ${p(e.gpu_used_pct)} of its GPU's time, past its share (idle time lent to it)` : ''}`),
    // A share whose launches waited for the GPU: how long, and what it would have used had they not.
    e.gpu_held_back_pct !== undefined ? [h('dt', {}, 'GPU held back'),
      h('dd', { class: 'warn' }, `its launches waited ${p(e.gpu_held_back_pct)} of its run; it would have used ${p(e.gpu_demand_pct)} of a GPU`)] : null,
    h('dt', {}, 'GPU memory peak'), h('dd', {}, `${of(e.gpu_memory_peak_mib, e.gpu_memory_given_mib, mib)}${e.gpu_memory_pct !== undefined ? ` (${p(e.gpu_memory_pct)})` : ''}`),
    // Allocations its GPU memory limit refused (the intercept library's count), with the most it asked.
    e.gpu_memory_refused ? [h('dt', {}, 'GPU memory refused'),
      h('dd', { class: 'warn' }, `${count(e.gpu_memory_refused)} allocation${e.gpu_memory_refused === 1 ? '' : 's'} at its limit; it asked for ${mib(e.gpu_memory_wanted_mib)} at most`)] : null,
    h('dt', {}, 'CPU'), h('dd', {}, e.cpu_seconds === undefined ? '–' : `${count(e.cpu_seconds)} s${e.cpu_pct !== undefined ? ` (${p(e.cpu_pct)} of ${count(e.cpus)} asked)` : ''}`),
    h('dt', {}, 'memory peak'), h('dd', {}, `${of(e.memory_peak_bytes, e.memory_limit_bytes, bytes)}${e.memory_pct !== undefined ? ` (${p(e.memory_pct)})` : ''}`));
}

function overview() {
  view.name = 'overview';
  const render = () => {
    fill(main,
      h('h1', {}, `GPUs of ${S.info ? S.info.hostname : ''}`),
      S.simulated ? h('div', { class: 'note' }, `Simulated machine (${S.info ? S.info.source : ''}): jobs get no real GPU; utilization is not measured.`) : null,
      summary(),
      h('h2', {}, 'Topology'),
      h('div', { class: 'panel topology scroll' }, topologyDiagram(S.gpus, S.links)),
      h('h2', {}, 'GPUs'),
      h('div', { class: 'tiles' }, S.gpus.map(gpuTile)),
      h('h2', {}, 'The last hour'),
      chartsPanel(),
      h('h2', {}, 'Quotas'),
      quotaTable(),
      h('h2', {}, 'Use of what was held, last 7 days'),
      efficiencyTable(),
      h('h2', {}, 'Jobs that left the most GPU time idle, last 7 days'),
      idleJobsTable());
  };
  view.update = render;
  view.charts = () => {
    const old = document.getElementById('charts');
    if (old) old.replaceWith(chartsPanel());
  };
  render();
  // The last 7 days' accounting, asked each time the overview is shown (not at every event: it
  // reads the period's jobs).
  // Whole seconds, rounded outward: `until` rounded down left out a job that ended in the last
  // half second.
  const now = Date.now() / 1000;
  call('GET', `/v1/acct?since=${Math.floor(now - 7 * 86400)}&until=${Math.ceil(now)}`).then((acct) => {
    S.acct = acct;
    if (view.name === 'overview') render();
  }, () => {});
}

function arrayNote(j) {
  const a = j.array;
  if (!a || !a.folded) return null;
  const states = Object.entries(a.states || {}).map(([s, n]) => `${count(n)} ${s}`).join(', ');
  return h('div', { class: 'muted' }, `array ${a.range}: ${count(a.tasks)} tasks (${states}${a.held ? `, ${count(a.held)} held` : ''})`);
}

function jobsTable(rows, total) {
  const shown = `${count(rows.length)} ${rows.length === 1 ? 'entry' : 'entries'}`;
  return h('div', { class: 'scroll' }, h('table', { id: 'jobs-table' },
    h('caption', { class: 'muted', style: 'text-align:left' },
      total > rows.length ? `${shown}, the newest (arrays folded) of ${count(total)} jobs` : shown),
    h('thead', {}, h('tr', {}, ['Job', 'Name', 'Owner', 'State', 'Asks', 'Priority', 'Submitted', 'Why / where'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, rows.map((j) => h('tr', { class: 'row', 'data-job': j.id },
      h('td', {}, h('a', { href: `#/jobs/${j.id}` }, `#${j.id}`)),
      h('td', {}, j.name || '', arrayNote(j)),
      h('td', {}, j.owner),
      h('td', {}, stateCell(j.held ? 'held' : j.state)),
      h('td', {}, shape(j)),
      h('td', {}, String(j.priority)),
      h('td', {}, ago(j.submitted_at)),
      h('td', {}, j.state === 'queued' ? (j.waiting || j.reason || '') : j.state === 'running' && j.placement
        ? placedOn(j.placement) : j.reason || ''))))));
}

function field(label, name, attrs = {}) {
  const id = `f-${name}`;
  return h('div', { class: `field ${attrs.wide ? 'wide' : ''}` },
    h('label', { for: id }, label),
    h('input', { id, name, ...attrs, wide: undefined, 'aria-describedby': `${id}-err` }),
    h('span', { class: 'err', id: `${id}-err`, role: 'alert' }));
}

// Which form field an API error is about ("resources.gpus: ..." names gpus; "env.X: ..." env).
const FIELD_OF = {
  command: 'command', name: 'name', priority: 'priority', 'resources.gpus': 'gpus',
  'resources.gpu_memory': 'gpu_memory', 'resources.gpu_share': 'gpu_share', 'resources.model': 'model',
  'resources.cpus': 'cpus', 'resources.memory': 'memory', max_runtime_s: 'max_runtime_s',
  grace_period_s: 'grace_period_s', env: 'env', labels: 'labels', workdir: 'workdir', image: 'image',
  array: 'array', after: 'after', ntasks: 'ntasks', tasks_per_gpu: 'tasks_per_gpu',
  task_failure: 'task_failure',
};

function fieldOf(message) {
  let best = null;
  for (const k of Object.keys(FIELD_OF)) {
    if (/^[:.[ ]/.test(message.slice(k.length)) && message.startsWith(k) && (!best || k.length > best.length)) best = k;
  }
  return best ? FIELD_OF[best] : null;
}

function area(label, name, placeholder) {
  const id = `f-${name}`;
  return h('div', { class: 'field wide' }, h('label', { for: id }, label),
    h('textarea', { id, name, rows: 2, cols: 40, placeholder, 'aria-describedby': `${id}-err` }),
    h('span', { class: 'err', id: `${id}-err`, role: 'alert' }));
}

// NAME=VALUE lines as an object; a line without '=' is kept whole as a name, for the API to refuse.
function pairs(text) {
  const out = {};
  for (const line of text.split('\n').map((l) => l.trim()).filter(Boolean)) {
    const eq = line.indexOf('=');
    if (eq < 0) out[line] = '';
    else out[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return out;
}

function submitForm() {
  const more = h('details', { class: 'more' }, h('summary', {}, 'More options (as tessera submit takes them)'),
    h('div', { class: 'form' },
      field('CPUs', 'cpus', { size: 5, placeholder: '2' }),
      field('Host memory', 'memory', { size: 8, placeholder: '16GiB' }),
      field('Max runtime (s)', 'max_runtime_s', { size: 7 }),
      field('Grace (s)', 'grace_period_s', { size: 5, placeholder: '30' }),
      field('Image', 'image', { size: 28, placeholder: 'nvcr.io/nvidia/pytorch:24.05-py3' }),
      field('Working directory', 'workdir', { size: 20 }),
      field('Array', 'array', { size: 10, placeholder: '0-99%8' }),
      field('After', 'after', { size: 14, placeholder: 'ok:12 any:13' }),
      field('Processes', 'ntasks', { size: 4, inputmode: 'numeric' }),
      field('Processes per GPU', 'tasks_per_gpu', { size: 4, inputmode: 'numeric' }),
      h('div', { class: 'field' }, h('label', { for: 'f-task_failure' }, 'When a process fails'),
        h('select', { id: 'f-task_failure', name: 'task_failure' }, h('option', { value: '' }, 'default (kill)'),
          h('option', { value: 'kill' }, 'kill the others'), h('option', { value: 'wait' }, 'wait for all')),
        h('span', { class: 'err', id: 'f-task_failure-err', role: 'alert' })),
      h('div', { class: 'field' }, h('label', {}, h('input', { type: 'checkbox', id: 'f-hold', name: 'hold' }), ' Hold')),
      h('div', { class: 'field' }, h('label', {}, h('input', { type: 'checkbox', id: 'f-no_preempt', name: 'no_preempt' }), ' Not preemptible')),
      area('Environment (NAME=VALUE per line)', 'env', 'A=1'),
      area('Labels (KEY=VALUE per line)', 'labels', 'team=nlp')));
  const form = h('form', { class: 'form panel', id: 'submit', 'aria-label': 'Submit a job', novalidate: true },
    field('Command (run by sh -c)', 'command', { required: true, wide: true, placeholder: 'python train.py' }),
    field('Name', 'name', { placeholder: 'optional' }),
    field('GPUs', 'gpus', { inputmode: 'numeric', size: 4 }),
    field('GPU share', 'gpu_share', { placeholder: '30%', size: 6 }),
    field('GPU memory', 'gpu_memory', { placeholder: '10GiB', size: 8 }),
    field('GPU model', 'model', { placeholder: 'H100', size: 10 }),
    field('Priority', 'priority', { inputmode: 'numeric', size: 5, placeholder: '0' }),
    h('button', { class: 'primary', type: 'submit' }, 'Submit'),
    h('div', { class: 'err', id: 'submit-err', role: 'alert' }),
    more);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    for (const e of form.querySelectorAll('.err')) e.textContent = '';
    for (const e of form.querySelectorAll('[aria-invalid]')) e.removeAttribute('aria-invalid');
    const v = (n) => form.elements[n].value.trim();
    const spec = { command: ['sh', '-c', v('command')], resources: {} };
    if (!v('command')) spec.command = [];
    // Numbers as numbers when they are; anything else goes as typed, for the API to judge.
    const num = (x) => (/^-?\d+(\.\d+)?$/.test(x) ? Number(x) : x);
    if (v('name')) spec.name = v('name');
    if (v('gpus')) spec.resources.gpus = num(v('gpus'));
    if (v('gpu_share')) spec.resources.gpu_share = v('gpu_share');
    if (v('gpu_memory')) spec.resources.gpu_memory = v('gpu_memory');
    if (v('model')) spec.resources.model = v('model');
    if (v('cpus')) spec.resources.cpus = num(v('cpus'));
    if (v('memory')) spec.resources.memory = v('memory');
    if (v('priority')) spec.priority = num(v('priority'));
    for (const k of ['max_runtime_s', 'grace_period_s', 'ntasks', 'tasks_per_gpu']) if (v(k)) spec[k] = num(v(k));
    for (const k of ['image', 'workdir', 'array', 'task_failure']) if (v(k)) spec[k] = v(k);
    if (v('after')) spec.after = v('after').split(/[\s,]+/).filter(Boolean);
    if (form.elements.hold.checked) spec.hold = true;
    if (form.elements.no_preempt.checked) spec.preemptible = false;
    if (v('env')) spec.env = pairs(v('env'));
    if (v('labels')) spec.labels = pairs(v('labels'));
    try {
      const job = await call('POST', '/v1/jobs', spec);
      form.reset();
      location.hash = `#/jobs/${job.id}`;
    } catch (e) {
      if (e.status === 401) return signIn(e.message);
      const name = fieldOf(e.message);
      const target = name ? form.elements[name] : null;
      if (target) {
        if (more.contains(target)) more.open = true;
        target.setAttribute('aria-invalid', 'true');
        document.getElementById(`f-${name}-err`).textContent = e.message;
        target.focus();
      } else {
        document.getElementById('submit-err').textContent = e.message;
      }
    }
  });
  return form;
}

function jobsView() {
  view.name = 'jobs';
  const users = () => (S.summary.users || []).map((u) => u.user);
  const sel = (label, id, values, reload) => h('div', { class: 'field' }, h('label', { for: id }, label),
    h('select', { id, onchange: () => (reload ? load() : drawTable()) }, h('option', { value: '' }, 'all'), values.map((x) => h('option', { value: x }, x))));
  const models = [...new Set(S.gpus.map((g) => g.model))].sort();
  const filters = h('div', { class: 'filters', role: 'search', 'aria-label': 'Filter jobs' },
    sel('User', 'flt-user', users(), true),
    sel('State', 'flt-state', ['queued', 'held', 'running', 'succeeded', 'failed', 'cancelled', 'preempted', 'lost'], true),
    sel('GPU model', 'flt-model', models));
  const tableBox = h('div', { id: 'jobs-box' });
  // User and state filter on the server (every job counts); the model, within the page shown.
  let total = 0;
  // Loads overlap (a filter changed while the last one is on its way, a reload from the stream):
  // only the newest one's answer is shown, never an older one arriving last.
  let loads = 0;
  async function load() {
    const mine = ++loads;
    const u = document.getElementById('flt-user').value;
    const st = document.getElementById('flt-state').value;
    const q = new URLSearchParams({ arrays: 'fold', limit: String(PAGE) });
    if (u) q.set('user', u);
    if (st) q.set('state', st);
    let jobs;
    try {
      jobs = (await call('GET', `/v1/jobs?${q}`)).jobs;
    } catch (e) {
      if (e.status === 401) return signIn(e.message);
      return; // unreachable: the banner says so; the list stays as it was
    }
    if (mine !== loads) return;
    S.jobs = jobs;
    const counts = u ? (S.summary.users || []).find((x) => x.user === u) || {} : S.summary.jobs || {};
    total = st ? counts[st] || 0 : counts.total || 0;
    drawTable();
  }
  function drawTable() {
    const m = document.getElementById('flt-model').value;
    const rows = S.jobs.filter((j) => !m || (j.placement && (j.placement.gpus || []).some((g) => S.gpus[g.index] && S.gpus[g.index].model === m)) ||
        (j.spec && j.spec.resources && [].concat(j.spec.resources.model || []).includes(m)))
      .slice().reverse();
    fill(tableBox, jobsTable(rows, m ? rows.length : total));
    disableActions();
  }
  fill(main, h('h1', {}, 'Jobs'), h('h2', {}, 'Submit'), submitForm(), h('h2', {}, 'Queue and history'), filters, tableBox);
  view.reload = load;
  view.update = () => {
    const userSel = document.getElementById('flt-user');
    for (const o of users()) {
      if (![...userSel.options].some((x) => x.value === o)) userSel.append(h('option', { value: o }, o));
    }
    drawTable();
  };
  return load();
}

function jobView(id) {
  view.name = 'job';
  view.jobId = id;
  const head = h('div', {});
  const body = h('div', {});
  const logs = h('pre', { id: 'logs', 'aria-label': 'Standard output', tabindex: 0 }, '');
  const errs = h('pre', { id: 'errs', 'aria-label': 'Standard error', tabindex: 0, hidden: true }, '');
  const offsets = { stdout: 0, stderr: 0 };
  const actionErr = h('div', { class: 'err', role: 'alert', id: 'action-err' });
  let job = null;
  let headSig = '';
  let logTimer = null;
  // The log is not in the event stream: read from where it was left, again every 2 s while the
  // job runs and this page is open, and once more when it ends.
  async function tail() {
    if (view.jobId !== id) return;
    clearTimeout(logTimer);
    logTimer = null;
    let ended = false;
    try {
      for (const stream of ['stdout', 'stderr']) {
        for (;;) {
          const r = await call('GET', `/v1/jobs/${id}/logs?stream=${stream}&offset=${offsets[stream]}`);
          ended = r.ended;
          if (!r.data) break;
          offsets[stream] = r.next_offset;
          const pane = stream === 'stdout' ? logs : errs;
          pane.textContent = (pane.textContent + r.data).slice(-200000);
          pane.hidden = false;
          pane.scrollTop = pane.scrollHeight;
        }
      }
    } catch (e) {
      if (e.status === 401) return signIn(e.message);
      if (!offsets.stdout && !offsets.stderr) logs.textContent = `(${e.message})`;
      ended = e.status === 403 || e.status === 404;
    }
    if (!ended && view.jobId === id) logTimer = setTimeout(tail, 2000);
  }
  function priorityControl(j) {
    const input = h('input', { id: 'priority', inputmode: 'numeric', size: 5, value: String(j.priority), 'aria-describedby': 'action-err' });
    return h('form', { class: 'actions', 'aria-label': 'Priority', onsubmit: (ev) => {
      ev.preventDefault();
      const v = input.value.trim();
      act('priority', { priority: /^-?\d+$/.test(v) ? Number(v) : v });
    } }, h('label', { for: 'priority' }, 'Priority'), input, h('button', { type: 'submit', id: 'set-priority' }, 'Set'));
  }
  async function act(what, body) {
    actionErr.textContent = '';
    try {
      await call('POST', `/v1/jobs/${id}/${what}`, body);
      await load();
    } catch (e) {
      if (e.status === 401) return signIn(e.message);
      actionErr.textContent = e.message;
    }
  }
  async function load() {
    try {
      job = await call('GET', `/v1/jobs/${id}`);
    } catch (e) {
      if (e.status === 401) return signIn(e.message);
      fill(main, h('h1', {}, `Job ${id}`), h('div', { class: 'alert' }, e.message));
      return;
    }
    const live = job.state === 'queued' || job.state === 'running';
    // The title and actions are drawn again only when they change: a value being typed (the
    // priority) survives the reloads that events bring.
    const sig = JSON.stringify([job.state, job.held, job.priority, job.stopping || '', job.name]);
    if (sig !== headSig) {
      headSig = sig;
      fill(head,
        h('h1', {}, `Job #${job.id} ${job.name || ''} `, stateCell(job.held ? 'held' : job.state)),
        h('div', { class: 'actions' },
          // Only where the user may act: another user's job offers nothing to press.
          mine(job) && live ? h('button', { class: 'danger', id: 'cancel', onclick: () => {
            // Running work is lost on cancel: asked first. A queued job loses nothing.
            if (job.state === 'running' && !window.confirm(`Cancel job #${job.id}${job.name ? ` (${job.name})` : ''}? It is running; its work so far is lost.`)) return;
            act('cancel');
          } }, 'Cancel') : null,
          mine(job) && job.state === 'queued' ? h('button', { id: 'hold', onclick: () => act(job.held ? 'release' : 'hold') }, job.held ? 'Release' : 'Hold') : null,
          mine(job) && job.state === 'queued' ? priorityControl(job) : null,
          !mine(job) && live ? h('span', { class: 'muted' }, `${job.owner}'s job: only its owner or an admin may change it`) : null,
          job.stopping ? h('span', { class: 'badge warn' }, `stopping: ${job.stopping}`) : null,
          actionErr));
    }
    fill(body,
      job.waiting ? h('div', { class: 'note', id: 'waiting' }, h('b', {}, 'Waiting: '), job.waiting) : null,
      h('dl', { class: 'kv panel' },
        h('dt', {}, 'owner'), h('dd', {}, job.owner),
        h('dt', {}, 'asks'), h('dd', {}, shape(job)),
        h('dt', {}, 'priority'), h('dd', {}, String(job.priority)),
        h('dt', {}, 'submitted'), h('dd', {}, ago(job.submitted_at)),
        h('dt', {}, 'started'), h('dd', {}, ago(job.started_at)),
        h('dt', {}, 'ended'), h('dd', {}, job.ended_at ? `${ago(job.ended_at)}, exit code ${job.exit_code ?? '–'}` : '–'),
        h('dt', {}, 'placed on'), h('dd', {}, job.placement ? placedOn(job.placement) : '–'),
        job.expected_start ? [h('dt', {}, 'expected start'), h('dd', {}, new Date(job.expected_start * 1000).toLocaleTimeString())] : null),
      job.efficiency ? [h('h2', {}, 'Use of what it held'), efficiencyList(job.efficiency)] : null,
      sizesPanel(job),
      h('h2', {}, 'Events'),
      h('div', { class: 'scroll' }, h('table', { id: 'events' },
        h('thead', {}, h('tr', {}, ['When', 'State', 'Why'].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, (job.events || []).map((e) => h('tr', {}, h('td', {}, new Date(e.at * 1000).toLocaleTimeString()), h('td', {}, stateCell(e.state)), h('td', {}, e.reason)))))),
      h('h2', {}, 'Spec'),
      h('pre', { 'aria-label': 'Spec' }, JSON.stringify(job.spec, null, 2)),
      job.details_hidden ? h('p', { class: 'muted' }, job.details_hidden) : null);
  }
  view.refreshJob = debounce(async () => {
    await load();
    tail();
    disableActions();
  }, 100);
  view.update = () => {};
  fill(main, h('p', {}, h('a', { href: '#/jobs' }, '← Jobs')), head, body, h('h2', {}, 'Log'), logs, errs);
  load().then(() => {
    tail();
    disableActions();
  });
}

function signIn(message) {
  started = false;
  delete document.body.dataset.route;
  if (S.stopStream) S.stopStream();
  S.stopStream = null;
  setToken('');
  view.name = 'signin';
  document.getElementById('signout').hidden = true;
  document.getElementById('who').textContent = '';
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', required: true, 'aria-describedby': 'token-help' });
  const form = h('form', { class: 'panel signin', 'aria-label': 'Sign in' },
    h('h1', {}, 'Sign in'),
    message ? h('div', { class: 'alert', role: 'alert' }, message) : null,
    h('div', { class: 'field' }, h('label', { for: 'token' }, 'API token'), input),
    h('p', { class: 'muted', id: 'token-help' }, 'A bearer token from the server\'s config (tcp.tokens). It is kept for this browser tab only.'),
    h('button', { class: 'primary', type: 'submit' }, 'Sign in'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    setToken(input.value.trim());
    start();
  });
  fill(main, form);
  input.focus();
}

// The page routes once it has its data (start); a hash change before that waits for it.
let started = false;

function route() {
  const hash = location.hash || '#/';
  for (const a of document.querySelectorAll('[data-nav]')) a.removeAttribute('aria-current');
  view.jobId = null;
  view.reload = null;
  let m;
  if ((m = hash.match(/^#\/jobs\/(\d+)$/))) {
    document.querySelector('[data-nav=jobs]').setAttribute('aria-current', 'page');
    jobView(Number(m[1]));
  } else if (hash === '#/jobs') {
    document.querySelector('[data-nav=jobs]').setAttribute('aria-current', 'page');
    // Shown once its list is there (the tests wait for the route).
    jobsView().then(() => { document.body.dataset.route = hash; });
    return;
  } else {
    document.querySelector('[data-nav=overview]').setAttribute('aria-current', 'page');
    overview();
  }
  document.body.dataset.route = hash; // what is shown (tests wait for it)
}

async function start() {
  if (!token()) return signIn('');
  try {
    await loadAll();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return signIn(e.message);
    fill(main, h('div', { class: 'alert' }, `The server did not answer: ${e.message}. Retrying…`));
    setTimeout(start, 2000);
    return;
  }
  document.getElementById('host').textContent = `${S.info.hostname}${S.simulated ? ' (simulated)' : ''}`;
  document.getElementById('who').textContent = `${S.me.user}${S.me.admin ? ' (admin)' : ''}`;
  const out = document.getElementById('signout');
  out.hidden = false;
  out.onclick = () => signIn('Signed out.');
  if (S.stopStream) S.stopStream();
  S.stopStream = openStream(onEvent, setLive);
  started = true;
  route();
}

window.addEventListener('hashchange', () => {
  if (started && view.name !== 'signin') route();
});
takeTokenFromAddress();
start();
