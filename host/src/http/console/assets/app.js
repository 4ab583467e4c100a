// The ebb console. Plain JavaScript, no dependency: the host serves this file as is.
// Every value from the host is written with textContent (never as markup), and the page's
// content security policy allows no inline script, so a message body cannot run here.
'use strict';
(() => {
  const TOKEN_KEY = 'ebb-token';
  const POISON_LIMIT = 500;
  const POISON_PAGE = 25;
  const $ = (id) => document.getElementById(id);
  const state = {
    role: 'admin', rows: new Map(), trs: new Map(), times: [], series: new Map(), kept: 360,
    selected: null, poison: [], poisonPage: 0, stream: null, detailTimer: null, sampleEvery: 10000,
    poisonLoading: null, poisonAgain: false,
    // Partitioned queues: logical name → { tr, parts }; the ones shown open.
    groups: new Map(), expanded: new Set(), downSince: null,
  };

  class Unauthorized extends Error {}
  // The host did not answer at all (not running, or the network): said in words, not as the
  // browser's "Failed to fetch".
  class HostDown extends Error {}

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  const setText = (node, text) => { const t = String(text); if (node.textContent !== t) node.textContent = t; };
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const fmt = (n, digits = 0) => (n === null || n === undefined) ? '–' : Number(n).toLocaleString(undefined, { maximumFractionDigits: digits });
  const usd = (n, digits = 2) => (n === null || n === undefined) ? '–' : '$' + Number(n).toFixed(digits);
  const ms = (n) => (n === null || n === undefined) ? '–' : (n >= 10000 ? fmt(n / 1000, 1) + ' s' : fmt(n) + ' ms');
  const time = (t) => { const d = new Date(t); return isNaN(d) ? String(t) : d.toLocaleString(); };
  const short = (hash) => hash ? hash.slice(0, 12) : '–';
  const clock = (t, seconds) => new Date(t).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: seconds ? '2-digit' : undefined });

  // Each cell carries its column's name, shown above it where a narrow screen stacks the
  // table's rows (the header row is hidden there).
  const heads = new Map();
  function labelRow(table, tr) {
    if (!heads.has(table.id)) heads.set(table.id, [...table.tHead.rows[0].cells].map((th) => th.getAttribute('aria-label') || th.textContent.trim()));
    const names = heads.get(table.id);
    [...tr.cells].forEach((td, i) => { if (names[i]) td.dataset.label = names[i]; });
    return tr;
  }

  function toast(text, bad) {
    const t = $('toast');
    t.textContent = text;
    t.className = bad ? 'show bad' : 'show';
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.className = ''; }, 4000);
  }

  // Runs an action, telling the operator what went wrong instead of throwing.
  function guard(action) {
    return (...args) => Promise.resolve().then(() => action(...args)).catch((e) => {
      if (!(e instanceof Unauthorized)) toast(e.message || String(e), true);
    });
  }

  // For what the page refreshes by itself: while the host is down the note at the top says
  // so once, rather than a toast every few seconds.
  function quiet(action) {
    return guard(() => Promise.resolve().then(action).catch((e) => { if (!(e instanceof HostDown)) throw e; }));
  }

  function authHeaders() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { Authorization: 'Bearer ' + token } : {};
  }

  async function call(path, options) {
    try {
      return await fetch(path, { headers: authHeaders(), cache: 'no-store', ...options });
    } catch (e) {
      if (e.name === 'AbortError') throw e;
      throw new HostDown('The host does not answer: is it running? Try again once it is back.');
    }
  }

  async function api(path, method = 'GET') {
    const res = await call(path, { method });
    if (res.status === 401) { needToken('the API asks for a token'); throw new Unauthorized(); }
    const type = res.headers.get('content-type') || '';
    const body = type.includes('json') ? await res.json() : null;
    if (!res.ok) throw new Error((body && body.error) || `${method} ${path}: ${res.status}`);
    return body;
  }

  // --- token and role -------------------------------------------------------------------

  function needToken(why) {
    if (state.stream) state.stream.abort();
    state.stream = null;
    $('login').hidden = false;
    link(false, 'needs a token');
    setText($('login-error'), sessionStorage.getItem(TOKEN_KEY) ? 'That token was refused.' : why);
    $('token').focus();
  }

  function setRole(role, name) {
    state.role = role;
    document.body.classList.toggle('read', role !== 'admin');
    setText($('who'), (name ? name + ' · ' : '') + (role === 'admin' ? 'admin' : 'read only'));
    $('sign-out').hidden = !sessionStorage.getItem(TOKEN_KEY);
  }

  // /whoami comes with named tokens; a host without it answers 404 and has one token, admin.
  async function whoami() {
    const res = await call('/whoami');
    if (res.status === 401) { needToken('the API asks for a token'); return false; }
    if (res.status === 404) { setRole('admin', null); return true; }
    if (!res.ok) throw new Error('whoami: ' + res.status);
    const me = await res.json();
    setRole(me.role === 'admin' ? 'admin' : 'read', me.name);
    return true;
  }

  // --- the event stream -----------------------------------------------------------------

  function link(up, text) {
    const l = $('link');
    setText(l, text || (up ? 'live' : 'reconnecting'));
    l.className = 'chip ' + (up ? 'ok' : 'bad');
  }

  // The live figures stopped coming (`why`, or null when they come again): the page says so
  // and since when, and greys what it shows, which is as of then.
  function down(why) {
    if (why === null) {
      state.downSince = null;
      $('down').hidden = true;
      document.body.classList.remove('stale');
      return;
    }
    state.downSince = state.downSince || Date.now();
    const since = new Date(state.downSince).toLocaleTimeString();
    setText($('down'), `${why} since ${since}: the figures below are as of then. Retrying…`);
    $('down').hidden = false;
    document.body.classList.add('stale');
  }

  async function stream() {
    const control = new AbortController();
    state.stream = control;
    let delay = 1000;
    while (!control.signal.aborted) {
      try {
        const res = await call('/events', { signal: control.signal });
        if (res.status === 401) { needToken('the API asks for a token'); return; }
        if (!res.ok) throw new Error(`The host answers ${res.status} to the live figures`);
        link(true);
        down(null);
        delay = 1000;
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          let from = Math.max(0, buffer.length - 1);
          buffer += value;
          let end;
          while ((end = buffer.indexOf('\n\n', from)) >= 0) {
            dispatch(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
            from = 0;
          }
        }
        if (control.signal.aborted) return;
        // The host closed the stream: it is stopping, or gone.
        down('The host does not answer');
        link(false, 'host down');
      } catch (e) {
        if (control.signal.aborted) return;
        const gone = e instanceof HostDown || e instanceof TypeError;
        down(gone ? 'The host does not answer' : e.message);
        link(false, gone ? 'host down' : 'reconnecting');
      }
      await sleep(delay);
      delay = Math.min(delay * 2, 30000);
    }
  }

  function dispatch(block) {
    let name = 'message';
    let data = '';
    for (const line of block.split('\n')) {
      if (line.startsWith('event: ')) name = line.slice(7);
      else if (line.startsWith('data: ')) data += line.slice(6);
    }
    if (!data) return;
    const message = JSON.parse(data);
    if (name === 'hello') hello(message);
    else if (name === 'update') update(message);
    else if (name === 'samples') samples(message);
  }

  function hello(message) {
    state.kept = message.samples_kept;
    state.sampleEvery = message.sample_every_ms || state.sampleEvery;
    state.times = message.history.times_ms;
    state.series = new Map(Object.entries(message.history.series));
    state.rows.clear();
    state.trs.clear();
    state.groups.clear();
    $('queues').tBodies[0].replaceChildren();
    host(message.host);
    // Rows are built off the document, then added at once: one layout for a thousand.
    const fresh = document.createDocumentFragment();
    for (const row of message.queues) setRow(row, fresh);
    $('queues').tBodies[0].append(fresh);
    applyFilter();
    for (const queue of state.trs.keys()) drawSpark(queue);
    setText($('spark-window'), sparkWindow());
    if (state.selected && state.rows.has(state.selected)) drawDetail();
    const linked = /^#poison\/(.+)$/.exec(location.hash);
    if (linked) openPoison(decodeURIComponent(linked[1]));
  }

  function update(message) {
    if (message.host) host(message.host);
    setText($('spark-window'), sparkWindow());
    // A pause that ended by itself is in the audit log: show it.
    if (message.queues.some((r) => !r.paused && (state.rows.get(r.queue) || {}).paused)) setTimeout(guard(loadAudit), 500);
    const poisoned = poisonedOf(logical());
    for (const row of message.queues) setRow(row);
    if (state.selected && message.queues.some((r) => r.queue === state.selected)) { detailHeader(); drawDetail(); }
    // A message poisoned meanwhile: the open list follows the stream.
    if (state.selected && poisonedOf(logical()) !== poisoned) quiet(loadPoison)();
  }

  function samples(message) {
    state.times.push(...message.times_ms);
    const excess = state.times.length - state.kept;
    if (excess > 0) state.times.splice(0, excess);
    for (const [queue, points] of Object.entries(message.series)) {
      const series = state.series.get(queue) || [];
      series.push(...points);
      if (series.length > state.kept) series.splice(0, series.length - state.kept);
      state.series.set(queue, series);
      drawSpark(queue);
    }
    setText($('spark-window'), sparkWindow());
    if (state.selected) drawDetail();
  }

  function host(h) {
    setText($('version'), 'ebb ' + h.version);
    const bus = $('bus');
    if (!h.bus) { setText(bus, 'no bus'); bus.className = 'chip'; }
    else { setText(bus, 'bus ' + (h.bus.connected ? 'connected' : 'down')); bus.className = 'chip ' + (h.bus.connected ? 'ok' : 'bad'); }
    setText($('cost-now'), `${usd(h.cost.usd_per_hour, 4)}/h · ${fmt(h.cost.transactions_per_hour)} tx/h`);
    setText($('cost-month'), `${usd(h.cost.usd_per_month)}/month (idle ${usd(h.cost.idle_usd_per_month)})`);
    const parts = h.partitions > h.queues ? ` (${h.partitions} partitions)` : '';
    setText($('queue-count'), `${h.queues}${parts}` + (h.paused ? `, ${h.paused} paused` : ''));
  }

  // --- the queue table ------------------------------------------------------------------

  const COLUMNS = ['name', 'depth', 'tasks', 'tput', 'pickup', 'tx', 'usd', 'rule', 'state'];

  function cellsOf(tr) {
    for (const c of COLUMNS) tr.append(el('td', '', c + (['depth', 'tasks', 'tput', 'pickup', 'tx', 'usd'].includes(c) ? ' n' : '')));
    tr.cells[0].append(el('span', null, 'qname'), el('span', null, 'troubles'));
  }

  function setRow(row, into) {
    const was = state.rows.get(row.queue);
    state.rows.set(row.queue, row);
    let tr = state.trs.get(row.queue);
    const created = !tr;
    const part = row.logical !== row.queue;
    if (!tr) {
      if (part && !state.groups.has(row.logical)) addGroup(row.logical, into);
      tr = el('tr', null, part ? 'part' : '');
      tr.dataset.queue = row.queue;
      cellsOf(tr);
      const spark = el('canvas', null, 'spark');
      spark.width = 160 * devicePixelRatio;
      spark.height = 28 * devicePixelRatio;
      const td = el('td', null, 'chart');
      td.append(spark);
      tr.append(td);
      labelRow($('queues'), tr);
      tr.addEventListener('click', () => select(row.queue));
      state.trs.set(row.queue, tr);
      if (part) { state.groups.get(row.logical).parts.add(row.queue); tr.hidden = !state.expanded.has(row.logical); }
      (into || $('queues').tBodies[0]).append(tr);
    }
    const cells = tr.cells;
    setText(cells[0].firstChild, row.queue);
    troubles(cells[0].lastChild, row, row.logical);
    setText(cells[1], fmt(row.depth));
    setText(cells[2], `${row.active_tasks} / ${row.target_tasks}`);
    setText(cells[3], fmt(row.throughput_per_sec, 2));
    setText(cells[4], row.pickup_latency_ms === null ? 'no pickups' : ms(row.pickup_latency_ms));
    setText(cells[5], row.cost ? fmt(row.cost.transactions_per_hour) : 'not metered');
    setText(cells[6], row.cost ? usd(row.cost.usd_per_month) : '–');
    const rule = row.rule;
    setText(cells[7], rule && rule.file ? `${rule.file} ${short(rule.sha256)} (${rule.contract})` : 'built-in');
    const [text, cls] = queueState(row);
    setText(cells[8], text);
    cells[8].className = 'state ' + cls;
    if (!(created && into)) drawSpark(row.queue);
    if (part && (created || JSON.stringify(was) !== JSON.stringify(row))) setGroup(row.logical);
  }

  // What needs a person, in the row itself: poison (a link to the list), a pause, a rule
  // quarantined, faulting or not loaded, storage not ready.
  function troubles(node, row, logical) {
    const list = [];
    if (row.poisoned > 0) list.push(['a', `${fmt(row.poisoned)} poisoned`, 'poison']);
    if (row.paused) list.push(['span', queueState(row)[0], 'paused']);
    const rule = row.rule;
    if (rule && rule.quarantined) list.push(['span', 'rule quarantined']);
    else if (rule && rule.state === 'error') list.push(['span', 'rule error']);
    else if (rule && rule.faulting) list.push(['span', 'rule faulting']);
    if (row.not_ready) list.push(['span', 'storage not ready', '', row.not_ready]);
    const key = JSON.stringify(list);
    if (node.dataset.key === key) return;
    node.dataset.key = key;
    node.replaceChildren(...list.map(([tag, text, cls, title]) => {
      const t = el(tag, text, 'trouble' + (cls ? ' ' + cls : ''));
      if (title) t.title = title;
      if (tag === 'a') {
        t.href = '#poison/' + encodeURIComponent(logical);
        t.addEventListener('click', (event) => { event.stopPropagation(); openPoison(logical); });
      }
      return t;
    }));
  }

  // A partitioned queue's row: its partitions' sums, shown or hidden under it.
  function addGroup(logical, into) {
    const tr = el('tr', null, 'group');
    tr.dataset.logical = logical;
    cellsOf(tr);
    tr.cells[0].prepend(el('button', '▸', 'expand'));
    tr.cells[0].children[0].type = 'button';
    tr.cells[0].children[0].setAttribute('aria-label', 'show partitions');
    tr.append(el('td', null, 'chart'));
    labelRow($('queues'), tr);
    tr.addEventListener('click', () => toggle(logical));
    state.groups.set(logical, { tr, parts: new Set() });
    (into || $('queues').tBodies[0]).append(tr);
  }

  function setGroup(logical) {
    const group = state.groups.get(logical);
    const rows = [...group.parts].map((q) => state.rows.get(q));
    const sum = (f) => rows.reduce((n, r) => n + (f(r) || 0), 0);
    const cells = group.tr.cells;
    setText(cells[0].children[1], `${logical} · ${rows.length} partitions`);
    setText(cells[1], fmt(sum((r) => r.depth)));
    setText(cells[2], `${sum((r) => r.active_tasks)} / ${sum((r) => r.target_tasks)}`);
    setText(cells[3], fmt(sum((r) => r.throughput_per_sec), 2));
    const worst = {
      poisoned: sum((r) => r.poisoned),
      paused: (rows.find((r) => r.paused) || {}).paused,
      rule: (rows.find((r) => r.rule && (r.rule.quarantined || r.rule.faulting || r.rule.state === 'error')) || {}).rule,
      not_ready: (rows.find((r) => r.not_ready) || {}).not_ready,
    };
    troubles(cells[0].lastChild, worst, logical);
  }

  function toggle(logical) {
    const open = !state.expanded.has(logical);
    if (open) state.expanded.add(logical); else state.expanded.delete(logical);
    const group = state.groups.get(logical);
    setText(group.tr.cells[0].firstChild, open ? '▾' : '▸');
    applyFilter();
    for (const q of group.parts) drawSpark(q);
  }

  function openPoison(logical) {
    const queue = [...state.rows.values()].find((r) => r.logical === logical);
    if (!queue) return;
    select(queue.queue);
    $('poison').scrollIntoView();
  }

  function queueState(row) {
    if (row.paused) return [row.paused.until_ms ? 'paused until ' + new Date(row.paused.until_ms).toLocaleTimeString() : 'paused', 'paused'];
    if (row.rule && row.rule.quarantined) return ['rule quarantined', 'quarantined'];
    if (row.rule && row.rule.state === 'error') return ['rule error', 'error'];
    return ['running', ''];
  }

  function applyFilter() {
    const term = $('filter').value.trim().toLowerCase();
    const matches = (name) => term === '' || name.toLowerCase().includes(term);
    let shown = 0;
    for (const [queue, tr] of state.trs) {
      const logical = state.rows.get(queue).logical;
      const match = matches(queue) || matches(logical);
      shown += match;
      // A partition shows under its open queue, or on its own when a filter names it.
      tr.hidden = !match || (logical !== queue && term === '' && !state.expanded.has(logical));
    }
    for (const [logical, group] of state.groups) group.tr.hidden = ![...group.parts].some((q) => matches(q) || matches(logical));
    $('filter-empty').hidden = shown > 0;
    setText($('filter-empty'), shown > 0 ? '' : `No queue matches "${$('filter').value.trim()}".`);
  }

  // The kept samples of a queue and, last, its live figures; a pickup latency is null where
  // nothing was picked up.
  function points(queue) {
    const series = state.series.get(queue) || [];
    const row = state.rows.get(queue);
    if (!row) return series;
    return series.concat([[row.depth, row.throughput_per_sec, row.pickup_latency_ms, row.active_tasks]]);
  }

  // The times of `points(queue)`: the kept samples' (the newest ones, if the queue's series
  // is shorter), then now.
  function timesOf(count) {
    return state.times.slice(Math.max(0, state.times.length - (count - 1))).concat([Date.now()]);
  }

  // What the charts hold, in words: "last 40 s", "last 12 min", "last hour".
  function span(ms) {
    if (ms < 90000) return `last ${Math.max(1, Math.round(ms / 1000))} s`;
    if (ms < 3570000) return `last ${Math.round(ms / 60000)} min`;
    return 'last hour';
  }
  const sparkWindow = () => 'Chart, ' + span(state.times.length ? Date.now() - state.times[0] : 0);

  // One line, broken where a value is null. `y` maps a value to its height.
  function line(ctx, values, color, x0, width, y) {
    const step = values.length > 1 ? width / (values.length - 1) : 0;
    ctx.strokeStyle = color;
    ctx.beginPath();
    let drawing = false;
    values.forEach((v, i) => {
      if (v === null || v === undefined) { drawing = false; return; }
      if (drawing) ctx.lineTo(x0 + i * step, y(v)); else ctx.moveTo(x0 + i * step, y(v));
      drawing = true;
    });
    ctx.stroke();
  }

  // Read once: asking for computed style while rows are being added forces a layout each time.
  let palette = null;
  const colors = () => {
    if (!palette) {
      const css = getComputedStyle(document.documentElement);
      palette = ['--depth', '--tput', '--pickup', '--tasks'].map((v) => css.getPropertyValue(v).trim());
    }
    return palette;
  };

  // A row's chart: depth in the top half, msg/s in the bottom half, each on its own scale
  // (two small strips, not two lines of different units on one).
  function drawSpark(queue) {
    const tr = state.trs.get(queue);
    if (!tr || tr.hidden) return;
    const canvas = tr.cells[COLUMNS.length].firstChild;
    const ctx = canvas.getContext('2d');
    const [depth, tput] = colors();
    const p = points(queue);
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.lineWidth = devicePixelRatio;
    const pad = devicePixelRatio;
    const half = canvas.height / 2;
    [[0, depth, 0], [1, tput, half]].forEach(([i, color, top]) => {
      const values = p.map((x) => x[i]);
      const max = Math.max(1, ...values);
      line(ctx, values, color, 0, canvas.width, (v) => top + half - pad - (Math.min(v, max) / max) * (half - 2 * pad));
    });
  }

  // --- one queue's detail ---------------------------------------------------------------

  function select(queue) {
    state.selected = queue;
    for (const [q, tr] of state.trs) tr.classList.toggle('selected', q === queue);
    $('detail').hidden = false;
    $('purge-confirm').value = '';
    $('purge').disabled = true;
    $('requeue-all-ask').hidden = true;
    detailHeader();
    drawDetail();
    clearInterval(state.detailTimer);
    state.detailTimer = setInterval(quiet(loadRule), 5000);
    guard(loadRule)();
    guard(loadPoison)();
  }

  function logical() {
    const row = state.rows.get(state.selected);
    return row ? row.logical : state.selected;
  }

  // The partitions of the selected queue (itself alone when it has none).
  function partitions() {
    const group = state.groups.get(logical());
    return group ? [...group.parts] : [state.selected];
  }

  function poisonedOf(name) {
    return [...state.rows.values()].reduce((n, r) => n + (r.logical === name ? r.poisoned : 0), 0);
  }

  function detailHeader() {
    const row = state.rows.get(state.selected);
    if (!row) return;
    const [text] = queueState(row);
    setText($('detail-title'), `${row.queue} · ${text} · ${fmt(row.processed)} processed, ${fmt(row.failed)} failed, ${fmt(row.poisoned)} poisoned`);
    $('pause').disabled = !!row.paused;
    $('resume').disabled = !row.paused;
    // A queue is paused whole: a partition holds an arbitrary share of its keys, so pausing
    // one would stop some keys' messages and not others.
    const parts = partitions().length;
    setText($('pause'), parts > 1 ? `Pause all ${parts} partitions` : 'Pause');
    setText($('resume'), parts > 1 ? `Resume all ${parts} partitions` : 'Resume');
    setText($('pause-scope'), parts > 1 ? `Pause and resume act on ${row.logical} as a whole, all ${parts} partitions.` : '');
  }

  // --- the detail chart: small multiples, each series on its own axis with its unit --------

  const SVG_NS = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // A round top for an axis: 1, 2 or 5 times a power of ten.
  function niceTop(max) {
    if (!(max > 0)) return 1;
    const p = 10 ** Math.floor(Math.log10(max));
    return [1, 2, 5, 10].map((m) => m * p).find((t) => t >= max * 0.999);
  }
  const compact = (n) => n >= 1e6 ? fmt(n / 1e6, 1) + 'M' : n >= 1e4 ? fmt(n / 1e3, 1) + 'k' : fmt(n, n < 10 ? 2 : 0);
  const TICK_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800].map((s) => s * 1000);

  const PANELS = [
    { name: 'Depth', unit: 'messages' },
    { name: 'Throughput', unit: 'msg/s' },
    { name: 'Pickup latency', unit: 'ms', none: 'no pickups' },
    { name: 'Dequeue tasks', unit: 'tasks' },
  ];

  function drawDetail() {
    const box = $('detail-chart');
    const width = Math.floor(box.clientWidth);
    if (!width || !state.selected) return;
    const p = points(state.selected);
    const times = timesOf(p.length);
    const from = times[0], to = times[times.length - 1];
    const held = span(to - from);
    setText($('chart-window'), `${held[0].toUpperCase() + held.slice(1)}: ${clock(from, to - from < 600000)}–${clock(to, to - from < 600000)}, a sample every ${state.sampleEvery / 1000} s (the host keeps the last hour).`);
    const cols = width >= 720 ? 2 : 1, gap = 16, ph = 140;
    const pw = (width - gap * (cols - 1)) / cols;
    const height = Math.ceil(PANELS.length / cols) * (ph + gap) - gap;
    const root = svg('svg', { width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': 'the queue over time' });
    const c = colors();
    PANELS.forEach((panel, i) => {
      const g = svg('g', { class: 'panel', transform: `translate(${(i % cols) * (pw + gap)},${Math.floor(i / cols) * (ph + gap)})` });
      let values = p.map((x) => (x[i] === null || x[i] === undefined ? null : Number(x[i])));
      let unit = panel.unit;
      const present = values.filter((v) => v !== null);
      if (unit === 'ms' && Math.max(0, ...present) >= 10000) { values = values.map((v) => (v === null ? null : v / 1000)); unit = 's'; }
      const now = values[values.length - 1];
      const top = niceTop(Math.max(0, ...values.filter((v) => v !== null)));
      const left = 44, right = pw - 8, y0 = 22, y1 = ph - 20;
      const y = (v) => y1 - (Math.min(v, top) / top) * (y1 - y0);
      const nowText = now === null ? (panel.none || '–') : compact(now);
      g.append(svg('text', { x: 0, y: 12, class: 'title' }, `${panel.name} (${unit}) · now ${nowText}`));
      for (const v of [0, top / 2, top]) {
        g.append(svg('line', { x1: left, x2: right, y1: y(v), y2: y(v), class: 'grid' }));
        g.append(svg('text', { x: left - 4, y: y(v) + 4, 'text-anchor': 'end', class: 'y' }, compact(v)));
      }
      // Clock times on the time axis, at round steps, no more than fit.
      const x = (t) => left + (to > from ? ((t - from) / (to - from)) * (right - left) : right - left);
      const most = Math.max(2, Math.floor((right - left) / 70));
      const step = TICK_STEPS.find((s) => (to - from) / s <= most) || 3600000;
      for (let t = Math.ceil(from / step) * step; t <= to; t += step) {
        const at = x(t), label = clock(t, step < 60000), half = label.length * 3.5 + 2;
        if (at < left + half || at > right - half) continue;
        g.append(svg('line', { x1: at, x2: at, y1: y1, y2: y1 + 4, class: 'axis' }));
        g.append(svg('text', { x: at, y: ph - 4, 'text-anchor': 'middle', class: 'x' }, label));
      }
      g.append(svg('line', { x1: left, x2: right, y1: y1, y2: y1, class: 'axis' }));
      let d = '', drawing = false;
      values.forEach((v, k) => {
        if (v === null) { drawing = false; return; }
        d += `${drawing ? 'L' : 'M'}${x(times[k]).toFixed(1)} ${y(v).toFixed(1)}`;
        drawing = true;
      });
      if (d) g.append(svg('path', { d, fill: 'none', stroke: c[i], 'stroke-width': 1.5 }));
      // A lone point draws no line: a dot shows it.
      if (present.length === 1 && values.length > 1) { const k = values.findIndex((v) => v !== null); g.append(svg('circle', { cx: x(times[k]), cy: y(values[k]), r: 2, fill: c[i] })); }
      if (panel.none && present.length === 0) g.append(svg('text', { x: (left + right) / 2, y: (y0 + y1) / 2, 'text-anchor': 'middle', class: 'none' }, panel.none));
      root.append(g);
    });
    box.replaceChildren(root);
  }

  function dl(node, pairs) {
    node.replaceChildren();
    for (const [k, v, cls] of pairs) { node.append(el('dt', k)); node.append(el('dd', v, cls)); }
  }

  async function loadRule() {
    if (!state.selected || $('detail').hidden) return;
    const queue = state.selected;
    const status = await api('/status');
    const q = (status.queues || []).find((x) => x.queue === queue);
    if (!q || queue !== state.selected) return;
    const r = q.rule || {};
    const pairs = [
      ['state', r.state || 'built-in', r.quarantined ? 'quarantined' : (r.state === 'error' ? 'error' : '')],
      ['file', r.file || 'built-in rule'],
      ['sha256', r.sha256 || '–', 'hash'],
      ['contract', r.contract || '–'],
      ['loaded at', r.loaded_at ? time(r.loaded_at) : '–'],
      ['decisions', fmt(r.decisions)],
      ['faults', `${fmt(r.faults)} (since start ${fmt(r.faults_total)})`],
    ];
    if (r.quarantine) pairs.push(['quarantined', `since ${time(r.quarantine.since)}: ${r.quarantine.reason}`, 'quarantined']);
    if (r.error) pairs.push(['error', r.error, 'error']);
    if (r.refused) pairs.push(['refused file', `${r.refused.file}: ${r.refused.reason}`, 'error']);
    if (r.last_error) pairs.push(['last error', r.last_error]);
    dl($('rule'), pairs);
    const swaps = $('swaps').tBodies[0];
    swaps.replaceChildren(...(r.swaps || []).slice().reverse().map((s) => {
      const tr = el('tr');
      tr.append(el('td', time(s.at)), el('td', s.file || 'removed: built-in rule'), el('td', short(s.sha256), 'hash'), el('td', s.contract || '–'));
      return labelRow($('swaps'), tr);
    }));
    if (!swaps.rows.length) { const tr = el('tr'); const td = el('td', 'no swap since start'); td.colSpan = 4; tr.append(td); swaps.append(tr); }
    const decisions = $('decisions').tBodies[0];
    decisions.replaceChildren(...(q.recent_decisions || []).slice().reverse().map((d) => {
      const i = d.inputs;
      const tr = el('tr');
      tr.append(el('td', new Date(d.at).toLocaleTimeString()), el('td', fmt(i.approximate_depth), 'n'), el('td', fmt(i.in_flight), 'n'),
        el('td', fmt(i.active_tasks), 'n'), el('td', fmt(i.throughput_per_sec, 2), 'n'), el('td', fmt(i.mean_handler_latency_ms, 1), 'n'),
        el('td', fmt(i.recent_failures), 'n'), el('td', i.oldest_message_age_ms === null ? '–' : fmt(i.oldest_message_age_ms), 'n'),
        el('td', d.value + (d.clamped ? ' (clamped)' : ''), 'n'), el('td', d.source));
      return labelRow($('decisions'), tr);
    }));
    if (!decisions.rows.length) empty(decisions, 'No decision yet.', 10);
  }

  // One row saying a list is empty.
  function empty(tbody, text, columns) {
    const tr = el('tr');
    const td = el('td', text, 'note');
    td.colSpan = columns;
    tr.append(td);
    tbody.replaceChildren(tr);
  }

  // --- pause and resume -----------------------------------------------------------------

  const scope = () => logical() + (partitions().length > 1 ? ` (all ${partitions().length} partitions)` : '');

  async function pause() {
    const length = $('pause-for').value.trim();
    const query = length ? '?for=' + encodeURIComponent(length) : '';
    await api(`/queues/${encodeURIComponent(logical())}/pause${query}`, 'POST');
    toast(`${scope()} paused` + (length ? ' for ' + length : ''));
    guard(loadAudit)();
  }

  async function resume() {
    await api(`/queues/${encodeURIComponent(logical())}/resume`, 'POST');
    toast(`${scope()} resumed`);
    guard(loadAudit)();
  }

  // --- poison ---------------------------------------------------------------------------

  // One listing of a queue at a time: a change while one is on its way asks for another
  // after it. Another queue's listing does not wait (its answer is dropped).
  function loadPoison() {
    const queue = logical();
    const loading = state.poisonLoading;
    if (loading && loading.queue === queue) { state.poisonAgain = true; return loading.done; }
    state.poisonAgain = false;
    const done = listPoison().finally(() => {
      if (state.poisonLoading !== current) return;
      state.poisonLoading = null;
      if (state.poisonAgain) { state.poisonAgain = false; quiet(loadPoison)(); }
    });
    const current = { queue, done };
    state.poisonLoading = current;
    return done;
  }

  async function listPoison() {
    const queue = logical();
    const tbody = $('poison').tBodies[0];
    try {
      const listing = await api(`/queues/${encodeURIComponent(queue)}/poison?limit=${POISON_LIMIT}`);
      if (queue !== logical()) return;
      // The host lists oldest first; the newest matter most to a person.
      const at = (m) => new Date(m.poisoned_at).getTime() || 0;
      state.poison = listing.messages.slice().sort((x, y) => at(y) - at(x));
      const count = listing.messages.length >= POISON_LIMIT ? `the oldest ${POISON_LIMIT} of ${listing.poison_queue}` : `${listing.messages.length} in ${listing.poison_queue}`;
      setText($('poison-note'), `${count}, newest first, as of ${clock(Date.now(), true)}; the list follows the live figures as messages are poisoned.`);
    } catch (e) {
      // Down: the list shown stays, greyed, as of then.
      if (e instanceof Unauthorized || e instanceof HostDown) throw e;
      state.poison = [];
      tbody.replaceChildren();
      setText($('poison-note'), e.message);
      return;
    }
    state.poisonPage = Math.min(state.poisonPage, Math.max(0, Math.ceil(state.poison.length / POISON_PAGE) - 1));
    renderPoison();
  }

  function renderPoison() {
    const tbody = $('poison').tBodies[0];
    const pages = Math.max(1, Math.ceil(state.poison.length / POISON_PAGE));
    const start = state.poisonPage * POISON_PAGE;
    // A refresh keeps what the operator ticked.
    const ticked = new Set([...$('poison').querySelectorAll('input.pick:checked')].map((b) => b.value));
    $('poison-all').checked = false;
    tbody.replaceChildren(...state.poison.slice(start, start + POISON_PAGE).map((m) => {
      const tr = el('tr');
      tr.dataset.id = m.id;
      const pick = el('td', null, 'admin-only');
      const box = el('input');
      box.type = 'checkbox';
      box.value = m.id;
      box.className = 'pick';
      box.checked = ticked.has(m.id);
      pick.append(box);
      const body = el('td', m.offloaded_bytes != null
        ? '(an offloaded message: its body is in the claim store)'
        : (m.preview_encoding === 'hex' ? 'hex: ' : '') + m.preview + (m.body_bytes > m.preview.length ? ' …' : ''), 'body');
      const act = el('td', null, 'admin-only');
      const again = el('button', 'Requeue');
      again.type = 'button';
      again.className = 'requeue-one';
      again.addEventListener('click', guard(() => requeue([m.id])));
      act.append(again);
      tr.append(pick, el('td', time(m.poisoned_at)), el('td', m.reason === null ? '(bare body: no reason kept)' : m.reason),
        el('td', m.dequeue_count === null ? '–' : m.dequeue_count, 'n'), el('td', fmt(m.offloaded_bytes != null ? m.offloaded_bytes : m.body_bytes), 'n'), body, act);
      return labelRow($('poison'), tr);
    }));
    if (!state.poison.length) empty(tbody, 'No poison message.', 7);
    setText($('poison-page'), `page ${state.poisonPage + 1} of ${pages}`);
    $('poison-prev').disabled = state.poisonPage === 0;
    $('poison-next').disabled = state.poisonPage >= pages - 1;
  }

  async function requeue(ids) {
    const queue = logical();
    const query = ids === 'all' ? 'all=true' : 'ids=' + ids.map(encodeURIComponent).join(',');
    const result = await api(`/queues/${encodeURIComponent(queue)}/poison/requeue?${query}`, 'POST');
    const skipped = result.skipped.length ? `, ${result.skipped.length} skipped (${result.skipped.map((s) => s.reason || s.id).join('; ')})` : '';
    toast(`${result.requeued} requeued to ${queue}${skipped}`, result.skipped.length > 0);
    await loadPoison();
    guard(loadAudit)();
  }

  async function purge() {
    const queue = logical();
    if ($('purge-confirm').value !== queue) return;
    const result = await api(`/queues/${encodeURIComponent(queue)}/poison/purge?confirm=${encodeURIComponent(queue)}`, 'POST');
    toast(`${result.purged} poison messages of ${queue} purged`);
    $('purge-confirm').value = '';
    $('purge').disabled = true;
    await loadPoison();
    guard(loadAudit)();
  }

  // --- audit ----------------------------------------------------------------------------

  async function loadAudit() {
    const { entries } = await api('/audit?limit=50');
    const tbody = $('audit').querySelector('tbody');
    tbody.replaceChildren(...entries.slice().reverse().map((e) => {
      const tr = el('tr');
      tr.append(el('td', time(e.at)), el('td', e.actor), el('td', e.action), el('td', e.target), el('td', e.result, e.result.startsWith('failed') ? 'error' : ''));
      return labelRow($('audit').querySelector('table'), tr);
    }));
    if (!entries.length) empty(tbody, 'No operator action yet.', 5);
  }

  // --- start ----------------------------------------------------------------------------

  async function start() {
    $('login').hidden = true;
    try {
      if (!(await whoami())) return;
    } catch (e) {
      if (!(e instanceof HostDown)) throw e;
      down('The host does not answer');
      link(false, 'host down');
      setTimeout(guard(start), 5000);
      return;
    }
    link(false, 'connecting');
    stream();
    await loadAudit();
  }

  function wire() {
    $('login-form').addEventListener('submit', (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $('token').value);
      $('token').value = '';
      guard(start)();
    });
    $('sign-out').addEventListener('click', () => { sessionStorage.removeItem(TOKEN_KEY); location.reload(); });
    $('filter').addEventListener('input', () => { applyFilter(); for (const q of state.trs.keys()) drawSpark(q); });
    $('detail-close').addEventListener('click', () => {
      $('detail').hidden = true;
      state.selected = null;
      clearInterval(state.detailTimer);
      for (const tr of state.trs.values()) tr.classList.remove('selected');
    });
    $('pause').addEventListener('click', guard(pause));
    $('resume').addEventListener('click', guard(resume));
    $('poison-refresh').addEventListener('click', guard(loadPoison));
    $('poison-prev').addEventListener('click', () => { state.poisonPage = Math.max(0, state.poisonPage - 1); renderPoison(); });
    $('poison-next').addEventListener('click', () => { state.poisonPage += 1; renderPoison(); });
    $('poison-all').addEventListener('change', (event) => { for (const box of $('poison').querySelectorAll('input.pick')) box.checked = event.target.checked; });
    $('requeue-selected').addEventListener('click', guard(() => {
      const ids = [...$('poison').querySelectorAll('input.pick:checked')].map((b) => b.value);
      if (!ids.length) throw new Error('select messages first');
      return requeue(ids);
    }));
    // Requeue all asks first, naming how many, as purge does.
    $('requeue-all').addEventListener('click', () => {
      const n = state.poison.length >= POISON_LIMIT ? `${POISON_LIMIT} or more` : String(state.poison.length);
      setText($('requeue-all-text'), `Put all ${n} poison messages of ${logical()} back on the queue?`);
      setText($('requeue-all-yes'), `Requeue ${n}`);
      $('requeue-all-ask').hidden = false;
    });
    $('requeue-all-no').addEventListener('click', () => { $('requeue-all-ask').hidden = true; });
    $('requeue-all-yes').addEventListener('click', guard(() => { $('requeue-all-ask').hidden = true; return requeue('all'); }));
    addEventListener('resize', () => { if (state.selected) drawDetail(); });
    $('purge-confirm').addEventListener('input', () => { $('purge').disabled = $('purge-confirm').value !== logical(); });
    $('purge').classList.add('danger');
    $('purge').addEventListener('click', guard(purge));
    setInterval(quiet(() => (state.stream ? loadAudit() : null)), 15000);
  }

  wire();
  guard(start)();
})();
