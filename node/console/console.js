// The Baton operator console: read-only views over the public API, kept live by the event
// stream. No framework and no network beyond the node that served this page. Everything
// shown comes from the API, which never returns a session id; the token lives in this tab's
// session storage only.
'use strict';

const EVENTS_KEPT = 1000;
const HISTORY_EVENTS = 200;
const LEASE_PAGE = 500;
const TASK_PAGE = 200;
const METRICS_EVERY_MS = 2000;
const CHART_POINTS = 60;
const EVENT_TYPES = ['granted', 'released', 'expired', 'queued', 'left_line', 'kv_written',
  'kv_deleted', 'task_enqueued', 'task_claimed', 'task_completed', 'task_failed',
  'task_released', 'task_expired', 'task_dead'];

const state = {
  token: sessionStorage.getItem('baton.token') || '',
  namespace: sessionStorage.getItem('baton.namespace') || 'default',
  view: 'overview',
  events: [],
  head: 0,
  // The revision the views' first loads already show: older events are history, not news.
  shownFrom: 0,
  follower: 0,
  leases: new Map(),
  prefix: '',
  leaseCursor: null,
  selected: null,
  queues: [],
  queue: null,
  taskState: 'claimed',
  tasks: [],
  samples: [],
};

// ---- helpers ----

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function seconds(ms) {
  if (ms < 1000) return `${Math.max(0, Math.round(ms))}ms`;
  const total = Math.ceil(ms / 1000);
  const minutes = Math.floor(total / 60);
  const rest = total % 60;
  if (minutes === 0) return `${rest}s`;
  return rest === 0 ? `${minutes}m` : `${minutes}m${rest}s`;
}

function encodePath(path) {
  return path.split('/').map(encodeURIComponent).join('/');
}

class Refused extends Error {
  constructor(status, problem) {
    super(problem && problem.message ? problem.message : `HTTP ${status}`);
    this.status = status;
    this.code = problem && problem.code;
  }
}

async function api(path, options = {}) {
  const headers = { 'Baton-Namespace': state.namespace, ...(options.headers || {}) };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const response = await fetch(path, { ...options, headers });
  if (!response.ok) {
    let problem = null;
    try { problem = await response.json(); } catch (_) { /* not JSON */ }
    throw new Refused(response.status, problem);
  }
  return response;
}

async function json(path) {
  return (await api(path)).json();
}

function say(text) {
  const box = document.getElementById('message');
  box.textContent = text || '';
  box.hidden = !text;
}

// A refusal as the operator should read it; 401 asks for a token.
function failed(error) {
  if (error instanceof Refused && error.status === 401) {
    document.getElementById('login').hidden = false;
    say(state.token
      ? `The token was refused (401 ${error.code}): ${error.message}. Enter a valid token.`
      : 'This cluster wants a token (401): enter one below.');
  } else if (error instanceof Refused && error.status === 403) {
    document.getElementById('login').hidden = false;
    say(`This token may not read this (403 ${error.code}): ${error.message}. Use another token, or another namespace.`);
  } else {
    say(`Baton did not answer: ${error.message}`);
  }
}

// ---- the event stream ----

function setLive(live) {
  const badge = document.getElementById('live');
  badge.textContent = live ? 'live' : 'offline';
  badge.className = `live ${live ? 'on' : 'off'}`;
}

// Follows `GET /v1/events` as server-sent events, resuming after the last revision seen.
async function follow() {
  const mine = ++state.follower;
  while (mine === state.follower) {
    try {
      const response = await api(`/v1/events?after=${state.head}`, {
        headers: { Accept: 'text/event-stream', 'Last-Event-ID': String(state.head) },
      });
      setLive(true);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      while (mine === state.follower) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n/g, '\n');
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          message(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
      reader.cancel().catch(() => {});
    } catch (error) {
      if (error instanceof Refused && (error.status === 401 || error.status === 403)) {
        setLive(false);
        failed(error);
        return;
      }
    }
    setLive(false);
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function message(block) {
  let type = 'message';
  const data = [];
  for (const line of block.split('\n')) {
    if (line.startsWith('event:')) type = line.slice(6).trim();
    else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
  }
  if (data.length === 0) return;
  if (type === 'error') {
    // Too old for the kept window: start again from the newest.
    state.head = 0;
    start().catch(failed);
    return;
  }
  applyEvent(JSON.parse(data.join('\n')));
}

function applyEvent(event) {
  if (event.revision <= state.head) return;
  state.head = event.revision;
  state.events.push(event);
  if (state.events.length > EVENTS_KEPT) state.events.shift();
  const kind = event.kind;
  // Only what happened after the views were loaded changes them: replaying the recent history
  // must not read every lease it names again.
  if (event.revision > state.shownFrom) {
    if (kind.resource !== undefined) refreshLease(kind.resource);
    if (kind.queue !== undefined) refreshQueues(kind.queue);
  }
  if (state.view === 'events') renderEvents();
  if (state.view === 'leases' && state.selected === kind.resource) renderDetail();
}

// ---- overview ----

async function overview() {
  const [cluster, queues] = await Promise.all([json('/v1/cluster'), json('/v1/queues?limit=1000')]);
  const tasks = queues.queues.reduce((sum, queue) =>
    sum + Object.values(queue.counts).reduce((a, b) => a + b, 0), 0);
  const leader = cluster.leader_id === null ? 'none' : `node ${cluster.leader_id}`;
  const cards = [
    ['leader', leader], ['term', cluster.term], ['applied index', cluster.commit_index],
    ['cluster time', seconds(cluster.cluster_time_ms)], ['revision', cluster.revision],
    ['sessions', cluster.sessions], ['leases', cluster.leases],
    [`tasks in ${state.namespace}`, tasks], ['answered by', `node ${cluster.node_id}`],
  ];
  document.getElementById('overview-cards').replaceChildren(...cards.map(([label, value]) =>
    el('div', { class: 'card' }, el('div', { class: 'label' }, label),
      el('div', { class: 'value' }, String(value)))));
  document.querySelector('#members tbody').replaceChildren(...cluster.members.map((member) =>
    el('tr', {}, el('td', {}, member.id), el('td', { class: 'mono' }, member.api_addr),
      el('td', { class: 'mono' }, member.peer_addr),
      el('td', {}, member.id === cluster.leader_id ? 'leader' : member.voter ? 'voter' : 'learner'))));
}

// Requests per second and p99 over the last interval, from this node's `/metrics`.
async function sampleMetrics() {
  const text = await (await api('/metrics')).text();
  let requests = 0;
  const buckets = new Map();
  for (const line of text.split('\n')) {
    if (line.startsWith('baton_http_requests_total{')) {
      requests += Number(line.slice(line.lastIndexOf(' ') + 1));
    } else if (line.startsWith('baton_http_request_duration_seconds_bucket{')) {
      const bound = line.match(/le="([^"]+)"/)[1];
      const count = Number(line.slice(line.lastIndexOf(' ') + 1));
      buckets.set(bound, (buckets.get(bound) || 0) + count);
    }
  }
  const sample = { at: performance.now(), requests, buckets };
  const previous = state.samples[state.samples.length - 1];
  if (previous) {
    const elapsed = (sample.at - previous.at) / 1000;
    sample.rps = Math.max(0, (requests - previous.requests) / elapsed);
    const total = (buckets.get('+Inf') || 0) - (previous.buckets.get('+Inf') || 0);
    sample.p99 = 0;
    if (total > 0) {
      const bounds = [...buckets.keys()].filter((bound) => bound !== '+Inf')
        .sort((a, b) => Number(a) - Number(b));
      const found = bounds.find((bound) =>
        buckets.get(bound) - (previous.buckets.get(bound) || 0) >= 0.99 * total);
      sample.p99 = found === undefined ? Infinity : Number(found) * 1000;
    }
  }
  state.samples.push(sample);
  if (state.samples.length > CHART_POINTS + 1) state.samples.shift();
  chart('chart-rps', 'rps-now', state.samples.map((s) => s.rps), (v) => `${v.toFixed(1)}/s`);
  chart('chart-p99', 'p99-now', state.samples.map((s) => s.p99), (v) =>
    (Number.isFinite(v) ? `≤ ${v.toFixed(1)} ms` : 'over the largest bucket'));
}

function chart(id, labelId, values, format) {
  const points = values.filter((value) => value !== undefined);
  const finite = points.filter(Number.isFinite);
  const top = Math.max(1e-9, ...finite);
  const step = 300 / Math.max(1, CHART_POINTS - 1);
  const coordinates = points.map((value, index) =>
    `${(index * step).toFixed(1)},${(58 - 56 * Math.min(1, (Number.isFinite(value) ? value : top) / top)).toFixed(1)}`);
  const svg = document.getElementById(id);
  svg.replaceChildren();
  const line = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
  line.setAttribute('points', coordinates.join(' '));
  svg.append(line);
  document.getElementById(labelId).textContent =
    points.length ? `now ${format(points[points.length - 1])}` : 'measuring…';
}

// ---- leases ----

async function loadLeases(more) {
  const cursor = more && state.leaseCursor ? `&cursor=${encodeURIComponent(state.leaseCursor)}` : '';
  const page = await json(`/v1/leases?prefix=${encodeURIComponent(state.prefix)}&limit=${LEASE_PAGE}${cursor}`);
  if (!more) state.leases = new Map();
  const now = performance.now();
  for (const lease of page.leases) {
    lease.deadline = now + lease.expires_in_ms;
    if (!state.leases.has(lease.resource)) state.leases.set(lease.resource, []);
    state.leases.get(lease.resource).push(lease);
  }
  state.leaseCursor = page.next_cursor || null;
  renderLeases();
}

const pending = new Set();
// A lease event on `resource`: its holders are read again (after the batch of events).
function refreshLease(resource) {
  if (!resource.startsWith(state.prefix) || pending.has(resource)) return;
  pending.add(resource);
  setTimeout(async () => {
    pending.delete(resource);
    try {
      const page = await json(`/v1/leases?prefix=${encodeURIComponent(resource)}&limit=100`);
      const now = performance.now();
      const holders = page.leases.filter((lease) => lease.resource === resource);
      for (const lease of holders) lease.deadline = now + lease.expires_in_ms;
      if (holders.length) state.leases.set(resource, holders);
      else state.leases.delete(resource);
      if (state.view === 'leases') renderLeases();
    } catch (error) { failed(error); }
  }, 50);
}

function denial(lease) {
  const left = lease.deadline - performance.now();
  return left > 0
    ? `held by ${lease.holder} (fence ${lease.fence}) for ${seconds(left)} more`
    : `held by ${lease.holder} (fence ${lease.fence}): expiring`;
}

function renderLeases() {
  const paths = [...state.leases.keys()].sort();
  const tree = document.getElementById('lease-tree');
  const rows = [];
  let previous = [];
  for (const path of paths) {
    const segments = path.split('/');
    let shared = 0;
    while (shared < segments.length - 1 && shared < previous.length && previous[shared] === segments[shared]) shared++;
    for (let depth = shared; depth < segments.length - 1; depth++) {
      rows.push(el('div', { class: 'dir', style: `padding-left:${0.8 + depth * 1.2}rem` },
        `${segments[depth]}/`));
    }
    previous = segments;
    for (const lease of state.leases.get(path)) {
      const labels = Object.entries(lease.labels || {}).filter(([key]) => key !== 'reason');
      rows.push(el('div', {
        class: `lease${state.selected === path ? ' selected' : ''}`,
        style: `padding-left:${0.8 + (segments.length - 1) * 1.2}rem`,
        'data-resource': path,
        onclick: () => { state.selected = path; renderLeases(); renderDetail(); },
      },
      el('div', {}, el('span', { class: 'path' }, segments[segments.length - 1]), ' ',
        el('span', { class: 'denial', 'data-deadline': lease.deadline, 'data-holder': lease.holder, 'data-fence': lease.fence }, denial(lease))),
      el('div', { class: 'meta' }, `${lease.mode}${lease.limit ? ` of ${lease.limit}` : ''}`,
        lease.covering ? ' (covering)' : '',
        lease.max_hold_ms ? ` · max hold ${seconds(lease.max_hold_ms)}` : '',
        lease.labels && lease.labels.reason ? ` · reason: ${lease.labels.reason}` : '',
        labels.length ? ' · ' : '', labels.map(([key, value]) => el('span', { class: 'chip' }, `${key}=${value}`)))));
    }
  }
  if (rows.length === 0) rows.push(el('p', { class: 'hint', style: 'padding: 0 .8rem' },
    state.prefix ? `No live lease under ${state.prefix}.` : 'No live lease.'));
  tree.replaceChildren(...rows);
  // For measuring: when the tree first showed (performance.getEntriesByName).
  if (performance.getEntriesByName('baton:leases-rendered').length === 0) {
    performance.mark('baton:leases-rendered');
  }
  const count = [...state.leases.values()].reduce((sum, holders) => sum + holders.length, 0);
  document.getElementById('lease-count').textContent =
    `${count} lease${count === 1 ? '' : 's'} shown${state.leaseCursor ? ' (more on the next page)' : ''}`;
  document.getElementById('more-leases').hidden = !state.leaseCursor;
}

function tick() {
  for (const span of document.querySelectorAll('.denial[data-deadline]')) {
    span.textContent = denial({ deadline: Number(span.dataset.deadline),
      holder: span.dataset.holder, fence: span.dataset.fence });
  }
}

function describe(event) {
  const kind = event.kind;
  const parts = [kind.resource || kind.key || (kind.queue && `${kind.queue}/${kind.task_id}`)];
  if (kind.holder) parts.push(kind.holder);
  if (kind.fence !== undefined) parts.push(`fence ${kind.fence}`);
  if (kind.mode) parts.push(kind.mode);
  if (kind.attempt !== undefined) parts.push(`attempt ${kind.attempt}`);
  if (kind.retry !== undefined) parts.push(kind.retry ? 'retried' : 'not retried');
  return parts.filter(Boolean).join(' · ');
}

function renderDetail() {
  const detail = document.getElementById('lease-detail');
  if (!state.selected) return;
  const events = state.events.filter((event) => event.kind.resource === state.selected).slice(-20).reverse();
  detail.replaceChildren(
    el('h2', { class: 'mono' }, state.selected),
    ...(state.leases.get(state.selected) || []).map((lease) =>
      el('p', {}, denial(lease), el('br'), el('span', { class: 'hint' }, `acquired ${lease.acquired_at}`))),
    el('h2', {}, 'Recent events'),
    events.length
      ? el('ol', {}, events.map((event) => el('li', {}, `#${event.revision} ${event.kind.type} · ${describe(event)}`)))
      : el('p', { class: 'hint' }, 'None since this page loaded its history.'));
}

// ---- queues ----

let queueTimer = null;
function refreshQueues(queue) {
  if (state.view !== 'queues' || queueTimer) return;
  queueTimer = setTimeout(() => {
    queueTimer = null;
    loadQueues().catch(failed);
    if (state.queue === queue) loadTasks().catch(failed);
  }, 200);
}

async function loadQueues() {
  state.queues = (await json('/v1/queues?limit=1000')).queues;
  if (!state.queue && state.queues.length) {
    state.queue = state.queues[0].queue;
    loadTasks().catch(failed);
  }
  const rows = state.queues.map((queue) => el('tr', {
    class: `clickable${state.queue === queue.queue ? ' selected' : ''}`,
    onclick: () => { state.queue = queue.queue; loadQueues().catch(failed); loadTasks().catch(failed); },
  }, el('td', { class: 'mono' }, queue.queue),
  ...['ready', 'waiting', 'claimed', 'done', 'dead'].map((name) => el('td', { class: 'num' }, queue.counts[name]))));
  if (rows.length === 0) rows.push(el('tr', {}, el('td', { colspan: 6, class: 'hint' }, `No queue in ${state.namespace}.`)));
  document.querySelector('#queue-table tbody').replaceChildren(...rows);
}

async function loadTasks() {
  if (!state.queue) return;
  const page = await json(`/v1/queues/${encodeURIComponent(state.queue)}/tasks?state=${state.taskState}&limit=${TASK_PAGE}`);
  const picker = el('select', { onchange: (event) => { state.taskState = event.target.value; loadTasks().catch(failed); } },
    ['ready', 'waiting', 'claimed', 'done', 'dead'].map((name) =>
      el('option', { value: name, selected: name === state.taskState }, name)));
  const rows = page.tasks.map((task) => el('tr', {},
    el('td', { class: 'mono' }, task.id), el('td', { class: `state-${task.state}` }, task.state),
    el('td', { class: 'num' }, `${task.attempt}/${task.max_attempts}`), el('td', { class: 'num' }, task.priority),
    el('td', {}, task.holder ? `${task.holder} (fence ${task.fence})` : ''),
    el('td', {}, task.note || ''), el('td', {}, task.reason || '')));
  if (rows.length === 0) rows.push(el('tr', {}, el('td', { colspan: 7, class: 'hint' }, `No ${state.taskState} task.`)));
  document.getElementById('queue-detail').replaceChildren(
    el('h2', {}, `Tasks of ${state.queue} `, picker),
    el('table', {}, el('thead', {}, el('tr', {}, ['id', 'state', 'attempt', 'priority', 'claimed by', 'note', 'last failure'].map((name) => el('th', {}, name)))),
      el('tbody', {}, rows)),
    page.next_cursor ? el('p', { class: 'hint' }, `The first ${TASK_PAGE} are shown.`) : '');
}

// ---- events ----

function renderEvents() {
  const type = document.getElementById('event-type').value;
  const prefix = document.getElementById('event-prefix').value;
  const shown = state.events.filter((event) => {
    const kind = event.kind;
    const what = kind.resource || kind.key || kind.queue || '';
    return (!type || kind.type === type) && what.startsWith(prefix);
  }).slice(-300).reverse();
  document.querySelector('#event-table tbody').replaceChildren(...shown.map((event) => el('tr', {},
    el('td', { class: 'num' }, event.revision), el('td', { class: 'num' }, seconds(event.cluster_time_ms)),
    el('td', {}, event.kind.type), el('td', {}, describe(event)), el('td', {}, event.by || ''))));
  document.getElementById('event-count').textContent = `${shown.length} of the last ${state.events.length} events`;
}

// ---- views and start ----

function show(view) {
  state.view = ['overview', 'leases', 'queues', 'events'].includes(view) ? view : 'overview';
  for (const section of document.querySelectorAll('.view')) section.hidden = section.id !== state.view;
  for (const link of document.querySelectorAll('nav a')) link.classList.toggle('active', link.dataset.view === state.view);
  const loads = { overview, leases: () => loadLeases(false), queues: loadQueues, events: async () => renderEvents() };
  loads[state.view]().catch(failed);
}

async function start() {
  say('');
  document.getElementById('login').hidden = true;
  const cluster = await json('/v1/cluster');
  state.shownFrom = cluster.revision;
  state.head = Math.max(0, cluster.revision - HISTORY_EVENTS);
  state.events = [];
  follow();
  show(location.hash.slice(1));
}

function setup() {
  const namespace = document.getElementById('namespace');
  namespace.value = state.namespace;
  namespace.addEventListener('change', () => {
    state.namespace = namespace.value.trim() || 'default';
    sessionStorage.setItem('baton.namespace', state.namespace);
    state.selected = null;
    state.queue = null;
    start().catch(failed);
  });
  document.getElementById('login').addEventListener('submit', (event) => {
    event.preventDefault();
    state.token = document.getElementById('token').value.trim();
    sessionStorage.setItem('baton.token', state.token);
    start().catch(failed);
  });
  document.getElementById('lease-filter').addEventListener('submit', (event) => {
    event.preventDefault();
    state.prefix = document.getElementById('prefix').value.trim();
    state.selected = null;
    loadLeases(false).catch(failed);
  });
  document.getElementById('more-leases').addEventListener('click', () => loadLeases(true).catch(failed));
  const types = document.getElementById('event-type');
  for (const type of EVENT_TYPES) types.append(el('option', { value: type }, type));
  types.addEventListener('change', renderEvents);
  document.getElementById('event-prefix').addEventListener('input', renderEvents);
  window.addEventListener('hashchange', () => show(location.hash.slice(1)));
  setInterval(tick, 1000);
  setInterval(() => {
    if (state.view === 'overview') {
      overview().catch(failed);
      sampleMetrics().catch(() => {});
    }
  }, METRICS_EVERY_MS);
  start().catch(failed);
}

setup();
