/* dash.js - the browser side of the live dashboard of `megascale launch`.
 *
 * Polls five JSON endpoints of the dashboard server (api/status, api/metrics,
 * api/events, api/heatmap, api/checkpoints), each once a second with one
 * request in flight at a time, and redraws the page in place: Chart.js 3
 * line charts (global `Chart`, served as static/chart.js), a canvas heat map,
 * the rank grid, the event log and the checkpoint table. Every request
 * carries the job's token, which the server writes into <meta name=ms-token>.
 *
 * The tests read the page through data-* attributes (tests/dashboard/
 * browser.mjs): body[data-ready], body[data-polls], canvas[data-points],
 * #grid [data-rank][data-state][data-faults], #events tr[data-event][data-seq],
 * #checkpoints tbody tr[data-step]. Keep them when changing the markup.
 */
'use strict';
(() => {
  const FAST_MS = 1000; // poll period while the job runs
  const SLOW_MS = 5000; // once it has ended and the supervisor is gone
  const FETCH_TIMEOUT_MS = 10000;
  const MAX_EVENT_ROWS = 2000; // the log keeps the newest rows only
  const ENDED = new Set(['done', 'failed', 'stopped']);
  const RANK_STATES = ['starting', 'running', 'slow', 'hung', 'dead', 'evicted', 'stopped', 'done', 'unknown'];

  const $ = (sel) => document.querySelector(sel);
  const token = readToken();

  // What the page has received so far. Metrics rows are kept once, raw, so
  // the x-axis toggle can rebuild every series from them.
  const st = {
    ended: false,
    closing: false, // the server exits once each endpoint is read again (the job ended)
    closed: new Set(), // the endpoints read for the last time
    polls: 0,
    t0: null, // the job's start, epoch s: wall-time x = wall - t0
    xMode: 'step',
    epoch: null,
    sinceStep: -1, // the since of the next api/metrics call (-1: from the first, step 0's val too)
    valSince: -1, // its val_since: the validation points have their own cursor (step N's comes
    //               after step N's train point: a poll between the two must not skip it)
    rows: [], // train steps: {step, wall, loss, lr, grad_norm, tok_s, mfu, ms}
    val: [], // {step, wall, y}
    chartsDirty: false,
    nextSeq: -1, // the since of the next api/events call (-1: from the first, seq 0)
    events: [],
    faultMarks: [], // {step, time}: dashed lines on every chart
    rankUpGroup: null, // the newest row when it collapses rank_up events
    errors: new Map(), // endpoint -> message, shown in the banner
    heat: null,
    chartsPending: false, // a draw of the charts is asked for the next frame
    gridKey: '',
    nodesKey: '',
    ckptKey: '',
  };

  function readToken() {
    const meta = document.querySelector('meta[name="ms-token"]');
    const t = meta ? meta.content : '';
    if (/^[0-9a-f]{32}$/i.test(t)) return t;
    // Served without substitution (a file:// copy): take it from the address.
    return new URLSearchParams(location.search).get('token') || t;
  }

  /* ---------- formatting: every number on the page goes through these ---------- */

  const nf0 = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
  const isNum = (x) => typeof x === 'number' && Number.isFinite(x);
  const dash = '—';

  function fmtInt(n) { return isNum(n) ? nf0.format(Math.round(n)) : dash; }
  function fmtPct(x, digits = 1) { return isNum(x) ? `${(x * 100).toFixed(digits)}%` : dash; }
  function fmtLoss(x) { return isNum(x) ? x.toFixed(3) : dash; }
  function fmtBytes(b) {
    if (!isNum(b)) return dash;
    if (b < 1e3) return `${b} B`;
    if (b < 1e6) return `${(b / 1e3).toFixed(1)} KB`;
    if (b < 1e9) return `${(b / 1e6).toFixed(1)} MB`;
    return `${(b / 1e9).toFixed(2)} GB`;
  }
  function fmtMs(ms) {
    if (!isNum(ms)) return dash;
    if (ms < 10) return `${ms.toFixed(2)} ms`;
    if (ms < 1000) return `${ms.toFixed(1)} ms`;
    return `${(ms / 1000).toFixed(2)} s`;
  }
  function fmtSec(s) {
    if (!isNum(s)) return dash;
    if (s < 0) return 'none'; // the summary's -1: nothing recovered (it read -1000.00 ms)
    if (s < 1) return fmtMs(s * 1000);
    if (s < 60) return `${s.toFixed(1)} s`;
    return fmtDuration(s);
  }
  function fmtDuration(s) {
    if (!isNum(s)) return dash;
    if (s < 60) return `${s.toFixed(1)} s`;
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = Math.floor(s % 60);
    const two = (v) => String(v).padStart(2, '0');
    return h > 0 ? `${h} h ${two(m)} m` : `${m} m ${two(sec)} s`;
  }
  function fmtClock(epoch) {
    if (!isNum(epoch)) return dash;
    return new Date(epoch * 1000).toLocaleTimeString(undefined,
      { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
  }
  function fmtSince(t) { return isNum(t) ? `+${fmtDuration(t)}` : dash; }
  function fmtNum(x) {
    if (!isNum(x)) return String(x);
    if (Number.isInteger(x)) return fmtInt(x);
    if (Math.abs(x) < 1e-3) return x.toExponential(2);
    return String(Number(x.toPrecision(4)));
  }
  function fmtCompact(x) { // axis ticks and big counts: 41k, 1.2M, 3.4G
    if (!isNum(x)) return '';
    const a = Math.abs(x);
    if (a >= 1e9) return `${Number((x / 1e9).toPrecision(3))}G`;
    if (a >= 1e6) return `${Number((x / 1e6).toPrecision(3))}M`;
    if (a >= 1e3) return `${Number((x / 1e3).toPrecision(3))}k`;
    return String(Number(x.toPrecision(3)));
  }
  const esc = (s) => String(s).replace(/[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));

  /* ---------- fetching and polling ---------- */

  class NetError extends Error {} // the server did not answer well: banner, retry

  async function getJson(path, params = {}) {
    const q = new URLSearchParams(Object.assign({}, params, { token }));
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    let res;
    try {
      res = await fetch(`${path}?${q}`, { cache: 'no-store', signal: ctl.signal });
    } catch (e) {
      throw new NetError(`${path}: ${e.name === 'AbortError' ? 'no answer in 10 s' : e.message}`);
    } finally {
      clearTimeout(timer);
    }
    if (!res.ok) throw new NetError(`${path}: HTTP ${res.status} ${res.statusText}`);
    try {
      return await res.json();
    } catch (e) {
      throw new NetError(`${path}: not JSON (${e.message})`);
    }
  }

  // Runs fn now and again a period after each finish, so one request per
  // endpoint is in flight at most. A failure shows in the banner; the loop
  // goes on. A bug in the drawing code is logged too, so tests see it.
  function poll(name, fn) {
    const loop = async () => {
      try {
        // A read begun once the server said it is closing (the job's end)
        // is this endpoint's last: then the loop stops, and the server,
        // which waits for every endpoint's last read, exits with nothing
        // asked of it after (no refused connections in the console).
        const last = st.closing;
        await fn(last);
        setError(name, null);
        if (last || (name === 'status' && st.closing)) {
          st.closed.add(name);
          if (st.closed.size === POLLED.length) serverGone();
          return;
        }
      } catch (e) {
        if (e instanceof NetError && st.ended) {
          // The job ended and its supervisor is gone (with it this server
          // and its token): nothing more will come, so this loop stops.
          serverGone();
          return;
        } else if (e instanceof NetError) {
          setError(name, `dashboard server unreachable: ${e.message}`);
        } else {
          setError(name, `dashboard error in ${name}: ${e.message}`);
          console.error(e);
        }
      }
      setTimeout(loop, st.closing ? 0 : st.ended ? SLOW_MS : FAST_MS);
    };
    loop();
  }

  function serverGone() {
    st.errors.clear();
    const b = $('#banner');
    b.hidden = false;
    b.className = 'banner ended'; // an end, not an error (it was drawn in the error's red)
    b.textContent = 'the job has ended and the dashboard server has exited: this is the run as it ended '
      + '(`megascale dashboard RUN_DIR` serves it again)';
    const live = $('#live');
    live.textContent = 'ended';
    live.className = 'live off';
    document.body.dataset.gone = '1';
  }

  function setError(name, msg) {
    if (msg) st.errors.set(name, msg); else st.errors.delete(name);
    const b = $('#banner');
    // The status endpoint's message first: it is the one the page hangs on.
    const msgs = [...st.errors.entries()].sort((a, b2) => (b2[0] === 'status') - (a[0] === 'status')).map((e) => e[1]);
    b.hidden = msgs.length === 0;
    if (msgs.length) b.className = 'banner';
    const others = msgs.length > 1 ? ` (${msgs.length - 1} more request${msgs.length > 2 ? 's' : ''} failing)` : '';
    b.textContent = msgs.length ? `${msgs[0]}${others}; retrying` : '';
    if (name === 'status' && msg) { // until the next good status poll
      const live = $('#live');
      live.textContent = 'no connection';
      live.className = 'live off';
    }
  }

  /* ---------- status: bottom line, summary, rank grid, nodes ---------- */

  async function pollStatus() {
    const s = await getJson('api/status');
    renderStatus(s);
    st.polls += 1;
    document.body.dataset.polls = String(st.polls);
    document.body.dataset.ready = '1';
  }

  function renderStatus(s) {
    const job = s.job || {};
    st.ended = ENDED.has(job.state) && s.live === false;
    st.closing = st.ended && s.closing === true;
    if (st.t0 === null && isNum(job.started)) st.t0 = job.started;

    const live = $('#live');
    live.textContent = s.live ? 'live' : 'not live';
    live.className = `live ${s.live ? 'on' : 'off'}`;
    live.title = s.live ? 'the supervisor is running' : 'no supervisor is running: the run as it was left';
    $('#run-dir').textContent = s.run_dir || '';
    // what the files do not say: the events file gone, a job whose driver is gone
    const notice = $('#notice');
    notice.hidden = !s.warning;
    notice.textContent = s.warning || '';
    $('#updated').textContent = `updated ${fmtClock(isNum(s.now) ? s.now : Date.now() / 1000)}`;
    document.title = `${job.state || '?'} ${job.step ?? ''}${isNum(job.steps) ? `/${job.steps}` : ''} · MegaScale-C`;

    renderBottomLine(job, s.last, s.layout);
    renderSummary(s.summary);
    renderGrid(s.layout, s.ranks || []);
    renderNodes(s.nodes || []);
  }

  function setStat(id, text, tone) {
    const el = $(id);
    el.textContent = text;
    el.classList.remove('good', 'warn', 'bad');
    if (tone) el.classList.add(tone);
  }

  function renderBottomLine(job, last, layout) {
    const pill = $('#job-state');
    pill.textContent = job.state || dash;
    pill.className = `state-pill st-${job.state || 'none'}`;

    setStat('#bl-step', fmtInt(job.step));
    if (isNum(job.steps)) $('#bl-step').insertAdjacentHTML('beforeend', ` <small>/ ${esc(fmtInt(job.steps))}</small>`);
    const frac = isNum(job.step) && isNum(job.steps) && job.steps > 0 ? Math.min(1, job.step / job.steps) : 0;
    $('#bl-progress').style.width = `${(frac * 100).toFixed(1)}%`;

    const e = job.ettr;
    setStat('#bl-ettr', fmtPct(e), !isNum(e) ? null : e >= 0.9 ? 'good' : e >= 0.7 ? 'warn' : 'bad');
    setStat('#bl-restarts', fmtInt(job.restarts), job.restarts > 0 ? 'warn' : null);
    setStat('#bl-faults', fmtInt(job.faults), job.faults > 0 ? 'bad' : null);
    setStat('#bl-toks', fmtInt(last && last.tok_s));
    setStat('#bl-mfu', fmtPct(last && last.mfu));
    setStat('#bl-loss', fmtLoss(last && last.loss));
    setStat('#bl-wall', fmtDuration(job.wall_s));

    setStat('#bl-tokens', fmtCompact(job.tokens) || dash);
    $('#bl-tokens').title = isNum(job.tokens) ? `${fmtInt(job.tokens)} tokens trained` : '';

    const parts = [];
    if (job.model) {
      parts.push(isNum(job.params) ? `model ${job.model}, ${fmtCompact(job.params)} params`
        : `model ${job.model}`);
    }
    if (layout) parts.push(`dp ${layout.dp} × pp ${layout.pp} × tp ${layout.tp}`);
    if (isNum(job.attempt)) parts.push(`attempt ${job.attempt}`);
    if (job.outcome) parts.push(`outcome ${job.outcome}`);
    $('#job-info').textContent = parts.join(' · ');
  }

  function renderSummary(sum) {
    const box = $('#summary');
    box.hidden = !sum;
    if (!sum) return;
    const faults = sum.faults && typeof sum.faults === 'object'
      ? Object.entries(sum.faults).map(([k, v]) => `${k} ${v}`).join(', ') || 'none' : dash;
    const items = [
      ['outcome', sum.outcome || dash], ['steps', fmtInt(sum.steps)], ['steps redone', fmtInt(sum.steps_redone)],
      ['restarts', fmtInt(sum.restarts)], ['faults', faults], ['wall', fmtDuration(sum.wall_s)], ['ETTR', fmtPct(sum.ettr)],
      ['detect p50 / max', `${fmtSec(sum.detect_p50_s)} / ${fmtSec(sum.detect_max_s)}`],
      ['recover p50 / max', `${fmtSec(sum.recover_p50_s)} / ${fmtSec(sum.recover_max_s)}`],
    ];
    $('#summary-body').innerHTML = `<div class="kv">${
      items.map(([k, v]) => `<span>${esc(k)} <b>${esc(v)}</b></span>`).join('')}</div>`;
  }

  // One small table per pipeline stage, dp rows × tp columns. Ranks without
  // coordinates (no layout known yet) go into one row.
  function renderGrid(layout, ranks) {
    const coord = (r) => isNum(r.dp) && isNum(r.pp) && isNum(r.tp);
    let html;
    if (ranks.length === 0) {
      html = '<p class="muted">no ranks yet</p>';
    } else if (!ranks.every(coord)) {
      html = `<table class="stage"><tr>${ranks.map(rankCell).join('')}</tr></table>`;
    } else {
      const dim = (k) => Math.max(layout && isNum(layout[k]) ? layout[k] : 0, ...ranks.map((r) => r[k] + 1));
      const [ndp, npp, ntp] = [dim('dp'), dim('pp'), dim('tp')];
      const at = new Map(ranks.map((r) => [`${r.dp},${r.pp},${r.tp}`, r]));
      const stages = [];
      for (let p = 0; p < npp; p++) {
        let t = `<table class="stage"><caption>pipeline stage ${p}</caption><tr><th></th>`;
        for (let k = 0; k < ntp; k++) t += `<th>tp ${k}</th>`;
        t += '</tr>';
        for (let d = 0; d < ndp; d++) {
          t += `<tr><th>dp ${d}</th>`;
          for (let k = 0; k < ntp; k++) {
            const r = at.get(`${d},${p},${k}`);
            t += r ? rankCell(r) : '<td class="rank"><span class="muted">—</span></td>';
          }
          t += '</tr>';
        }
        stages.push(`${t}</table>`);
      }
      html = stages.join('');
    }
    $('#layout-text').textContent = layout
      ? `${layout.world} ranks: dp ${layout.dp} × pp ${layout.pp} × tp ${layout.tp}` : '';
    if (html === st.gridKey) return; // unchanged: keep the DOM (and any open tooltip)
    st.gridKey = html;
    $('#grid').innerHTML = html;
  }

  function rankCell(r) {
    const state = r.state || 'unknown';
    const faults = isNum(r.faults) ? r.faults : 0;
    const where = [r.node, r.host && r.host !== r.node ? r.host : null].filter(Boolean).join(' · ');
    const meta = [`step ${fmtInt(r.step)}`];
    if (isNum(r.compute_ms)) meta.push(fmtMs(r.compute_ms));
    if (isNum(r.beat_age_s) && r.beat_age_s >= 2) meta.push(`beat ${fmtSec(r.beat_age_s)} ago`);
    const said = r.last_state ? ` (last said ${r.last_state}; no driver watches it)` : '';
    const title = [`rank ${r.rank}: ${state}${said}`, isNum(r.dp) ? `dp ${r.dp} pp ${r.pp} tp ${r.tp}` : 'layout not known yet',
      `node ${r.node || dash}, host ${r.host || dash}`,
      `step ${r.step ?? dash}, compute ${fmtMs(r.compute_ms)}, last beat ${fmtSec(r.beat_age_s)} ago`,
      `faults ${faults}${r.last_fault ? ` (last: ${r.last_fault})` : ''}`].join('\n');
    const badge = faults > 0
      ? `<span class="badge" title="${esc(r.last_fault || 'faults')}">${faults} fault${faults > 1 ? 's' : ''}</span>` : '';
    return `<td class="rank st-${esc(state)}" data-rank="${esc(r.rank)}" data-state="${esc(state)}"` +
      ` data-faults="${faults}" data-node="${esc(r.node || '')}" data-host="${esc(r.host || '')}" title="${esc(title)}">` +
      `<div class="head"><span class="r">r${esc(r.rank)}</span><span class="st">${esc(state)}</span>${badge}</div>` +
      `<div class="where">${esc(where || dash)}</div><div class="meta">${esc(meta.join(' · '))}</div></td>`;
  }

  function renderNodes(nodes) {
    const html = nodes.length === 0
      ? '<tr class="empty"><td colspan="3">no nodes reported</td></tr>'
      : nodes.map((n) => `<tr data-node="${esc(n.node)}" data-state="${esc(n.state)}"><td class="mono">${esc(n.node)}</td>` +
        `<td><span class="chip ${esc(n.state)}">${esc(n.state)}</span></td><td>${esc(n.reason || '')}</td></tr>`).join('');
    if (html === st.nodesKey) return;
    st.nodesKey = html;
    $('#nodes tbody').innerHTML = html;
  }

  function renderStateLegend() {
    $('#state-legend').innerHTML = RANK_STATES.map(
      (s) => `<span><i style="background:var(--st-${s})"></i>${s}</span>`).join('');
  }

  /* ---------- metrics: the charts ---------- */

  // key: the metrics column; label: in tooltips; fmt: ticks (and tooltips
  // unless tip is given).
  const CHARTS = [
    { id: 'loss-chart', key: 'loss', label: 'train loss', color: '#2f6fdf', fmt: fmtNum, val: true },
    { id: 'lr-chart', key: 'lr', label: 'lr', color: '#7a4fd0', fmt: (v) => (isNum(v) ? v.toExponential(1) : '') },
    { id: 'gradnorm-chart', key: 'grad_norm', label: 'grad norm', color: '#0f8b8d', fmt: fmtNum },
    { id: 'toks-chart', key: 'tok_s', label: 'tokens/s', color: '#1e9e5a', fmt: fmtCompact, tip: fmtInt },
    { id: 'mfu-chart', key: 'mfu', label: 'MFU', color: '#d9822b', fmt: (v) => fmtPct(v) },
    { id: 'ms-chart', key: 'ms', label: 'step time', color: '#5b6472', fmt: (v) => `${fmtCompact(v)} ms`, tip: fmtMs },
  ];
  const charts = []; // {spec, chart, canvas, pts, valPts}

  // Draws a dashed red line at each detected fault, on every chart.
  const faultLines = {
    id: 'msFaultLines',
    afterDatasetsDraw(chart) {
      const xs = chart.scales.x, area = chart.chartArea, ctx = chart.ctx;
      if (!xs || st.faultMarks.length === 0) return;
      ctx.save();
      ctx.strokeStyle = 'rgba(214, 59, 59, 0.75)';
      ctx.lineWidth = 1;
      ctx.setLineDash([4, 3]);
      for (const m of st.faultMarks) {
        const v = xOf(m.step, m.time);
        if (!isNum(v)) continue;
        const px = xs.getPixelForValue(v);
        if (px < area.left || px > area.right) continue;
        ctx.beginPath();
        ctx.moveTo(px, area.top);
        ctx.lineTo(px, area.bottom);
        ctx.stroke();
      }
      ctx.restore();
    },
  };

  function xOf(step, wall) {
    if (st.xMode === 'step') return step;
    return isNum(wall) && isNum(st.t0) ? wall - st.t0 : null;
  }

  function makeCharts() {
    if (typeof Chart === 'undefined') {
      setError('chart.js', 'dashboard error: static/chart.js did not load; charts are off');
      return;
    }
    Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
    Chart.defaults.font.size = 11;
    Chart.defaults.color = '#687385';
    for (const spec of CHARTS) {
      const canvas = document.getElementById(spec.id);
      const c = { spec, canvas, pts: [], valPts: [] };
      const datasets = [{ label: spec.label, data: c.pts, borderColor: spec.color, backgroundColor: spec.color,
        borderWidth: 1.5, pointRadius: 0, pointHitRadius: 6, tension: 0 }];
      if (spec.val) {
        datasets.push({ label: 'val loss', data: c.valPts, borderColor: '#e0641b', backgroundColor: '#e0641b',
          borderWidth: 1.5, pointRadius: 3, pointHoverRadius: 4, tension: 0 });
      }
      const tip = spec.tip || spec.fmt;
      c.chart = new Chart(canvas, {
        type: 'line',
        data: { datasets },
        plugins: [faultLines],
        options: {
          animation: false, // live data: redraw at once
          parsing: false, // points are {x, y} already: needed for decimation
          normalized: true, // x is sorted and unique per dataset
          responsive: true,
          maintainAspectRatio: false,
          interaction: { mode: 'nearest', axis: 'x', intersect: false },
          scales: {
            x: { type: 'linear', title: { display: true, text: 'step' }, ticks: { maxTicksLimit: 8 },
              grid: { color: '#eef1f5' } },
            y: { ticks: { callback: (v) => spec.fmt(v), maxTicksLimit: 6 }, grid: { color: '#eef1f5' } },
          },
          plugins: {
            legend: { display: false },
            decimation: { enabled: true, algorithm: 'lttb', samples: 1000, threshold: 1000 },
            tooltip: {
              callbacks: {
                title: (items) => (items.length ? xLabel(items[0].parsed.x) : ''),
                label: (item) => `${item.dataset.label}: ${tip(item.parsed.y)}`,
              },
            },
          },
        },
      });
      charts.push(c);
    }
  }

  function xLabel(x) { return st.xMode === 'step' ? `step ${fmtInt(x)}` : `${fmtDuration(x)} since start`; }

  // final: the endpoint's last read (begun once the server said it closes; the server waits
  // for the last read of each, not for one already in flight, before it exits).
  const fin = (final) => (final ? { final: 1 } : {});

  async function pollMetrics(final) {
    // Page through "more" replies at once; an epoch change means the server
    // dropped its points (steps redone after a restart): start from 0.
    for (let page = 0; page < 100; page++) {
      const m = await getJson('api/metrics', { since: st.sinceStep, val_since: st.valSince, ...fin(final) });
      if (st.epoch !== null && m.epoch !== st.epoch) {
        st.epoch = m.epoch;
        clearMetrics();
        continue;
      }
      st.epoch = m.epoch;
      if (isNum(m.t0) && st.t0 !== m.t0) {
        st.t0 = m.t0;
        if (st.xMode === 'wall') st.chartsDirty = true;
      }
      addSteps(m.columns, m.steps || []);
      addVal(m.val || []);
      if (!m.more) break;
    }
    updateCharts();
  }

  function clearMetrics() {
    st.sinceStep = -1;
    st.valSince = -1;
    st.rows = [];
    st.val = [];
    st.chartsDirty = true;
  }

  function addSteps(columns, steps) {
    if (steps.length === 0) return;
    const cols = columns || ['step', 'wall', 'loss', 'lr', 'grad_norm', 'tok_s', 'mfu', 'ms'];
    const idx = Object.fromEntries(cols.map((c, i) => [c, i]));
    for (const a of steps) {
      const row = {};
      for (const c of cols) row[c] = a[idx[c]];
      // A step at or before the last one kept replaces the tail (the server
      // should have changed epoch; keep x sorted for the decimation anyway).
      if (st.rows.length && row.step <= st.rows[st.rows.length - 1].step) {
        while (st.rows.length && st.rows[st.rows.length - 1].step >= row.step) st.rows.pop();
        st.chartsDirty = true;
      }
      st.rows.push(row);
      if (!st.chartsDirty) {
        for (const c of charts) pushPoint(c.pts, xOf(row.step, row.wall), row[c.spec.key]);
      }
    }
    st.sinceStep = st.rows.length ? st.rows[st.rows.length - 1].step : st.sinceStep;
  }

  function addVal(val) {
    for (const [step, wall, y] of val) {
      if (st.val.length && step <= st.val[st.val.length - 1].step) {
        while (st.val.length && st.val[st.val.length - 1].step >= step) st.val.pop();
        st.chartsDirty = true;
      }
      st.val.push({ step, wall, y });
      st.valSince = step;
      const loss = charts.find((c) => c.spec.val);
      if (loss && !st.chartsDirty) pushPoint(loss.valPts, xOf(step, wall), y);
    }
  }

  function pushPoint(pts, x, y) { if (isNum(x) && isNum(y)) pts.push({ x, y }); }

  // Rebuilds every series from the raw rows (after a toggle, an epoch change
  // or a replaced tail), then redraws the charts and their data-points.
  function updateCharts() {
    const dirty = st.chartsDirty;
    if (st.chartsDirty) {
      st.chartsDirty = false;
      for (const c of charts) {
        c.pts = [];
        for (const r of st.rows) pushPoint(c.pts, xOf(r.step, r.wall), r[c.spec.key]);
        if (c.spec.val) {
          c.valPts = [];
          for (const v of st.val) pushPoint(c.valPts, xOf(v.step, v.wall), v.y);
        }
      }
    }
    for (const c of charts) {
      // Redraw only a chart whose points changed (the page costs the
      // training host nothing it need not).
      const key = `${c.pts.length}:${c.valPts.length}:${st.xMode}:${st.faultMarks.length}:` +
        `${c.pts.length ? c.pts[c.pts.length - 1].x : ''}`;
      if (key === c.drawn && !dirty) continue;
      c.drawn = key;
      // Assign rather than push into dataset.data: the decimation plugin
      // turns that property into a getter for its decimated copy.
      const ds = c.chart.data.datasets;
      ds[0].data = c.pts;
      if (c.spec.val) ds[1].data = c.valPts;
      c.chart.options.scales.x.title.text = st.xMode === 'step' ? 'step' : 'wall time since start (s)';
      c.chart.update('none');
      c.canvas.dataset.points = String(c.pts.length);
      if (c.spec.val) c.canvas.dataset.valPoints = String(c.valPts.length);
    }
  }

  function setXMode(mode) {
    if (mode === st.xMode) return;
    st.xMode = mode;
    st.chartsDirty = true;
    updateCharts();
  }

  /* ---------- events ---------- */

  // Every page there is, then drawn once: a log of 100,000 events was drawn row by row, page
  // after page (the newest event showed after half a minute, the page frozen meanwhile); many
  // new events rebuild the table's newest rows in one go.
  async function pollEvents(final) {
    const batch = [];
    try {
      for (let page = 0; page < 100; page++) {
        const r = await getJson('api/events', { since: st.nextSeq, ...fin(final) });
        const evs = r.events || [];
        for (const e of evs) batch.push(e);
        if (isNum(r.next)) st.nextSeq = r.next;
        else if (evs.length) st.nextSeq = evs[evs.length - 1].seq;
        if (!r.more) break;
      }
    } finally { // the pages read before a failed one are kept (the next poll asks past them)
      for (const e of batch) addEvent(e);
      if (batch.length > MAX_EVENT_ROWS / 8) redrawEvents();
      else for (const e of batch) showEvent(e);
    }
  }

  function addEvent(e) {
    st.events.push(e);
    if (st.events.length > MAX_EVENT_ROWS * 2) st.events.splice(0, st.events.length - MAX_EVENT_ROWS);
    if (e.event === 'fault_detected') {
      st.faultMarks.push({ step: e.step, time: e.time });
      drawChartsSoon();
    }
  }

  // A long text cut for the table (an event's detail may be 1 MiB: 30 of them froze the page
  // for half a minute); the events file has it whole.
  const MAX_SHOWN = 2000;
  function cut(v) {
    const s = String(v);
    return s.length > MAX_SHOWN ? `${s.slice(0, MAX_SHOWN)}… (${fmtInt(s.length - MAX_SHOWN)} more characters)` : s;
  }

  // The charts drawn once a frame, however many faults arrive in it: one draw a fault drew
  // every mark so far each time (30,000 faults stalled the page for seconds).
  function drawChartsSoon() {
    if (st.chartsPending) return;
    st.chartsPending = true;
    requestAnimationFrame(() => {
      st.chartsPending = false;
      for (const c of charts) c.chart.draw();
    });
  }

  const HIDDEN_FIELDS = new Set(['seq', 'time', 't', 'event', 'rank', 'node', 'host', 'step', 'detail']);

  function eventTone(e) {
    switch (e.event) {
      case 'fault_detected': case 'job_failed': return 'ev-bad';
      case 'evict': case 'anomaly': case 'beat_rejected': case 'ctl_rejected': return 'ev-warn';
      case 'diag': return e.ok === false || e.error || e.reported === false ? 'ev-warn' : '';
      case 'ctl': return e.ok === false ? 'ev-warn' : '';
      case 'recovered': case 'job_done': return 'ev-good';
      case 'rank_up': return 'ev-quiet';
      default: return '';
    }
  }

  function fieldText(k, v) {
    if (v === null || v === undefined) return `${k}=${dash}`;
    if (typeof v === 'object') {
      const inner = Array.isArray(v) ? v.join(',') : Object.entries(v).map(([a, b]) => `${a}:${b}`).join(',');
      return `${k}=${cut(inner)}`;
    }
    if (isNum(v) && /_s$/.test(k)) return `${k}=${fmtSec(v)}`;
    if (isNum(v) && /_ms$/.test(k)) return `${k}=${fmtMs(v)}`;
    if (isNum(v) && k === 'bytes') return `${k}=${fmtBytes(v)}`;
    if (Number.isInteger(v)) return `${k}=${v}`; // pids, counts, steps: no separators
    return `${k}=${isNum(v) ? fmtNum(v) : cut(v)}`;
  }

  function eventWhere(e) {
    const parts = [];
    if (isNum(e.rank) && e.rank >= 0) parts.push(`r${e.rank}`);
    if (e.node) parts.push(e.node);
    if (e.host && e.host !== e.node) parts.push(e.host);
    return parts.join(' · ');
  }

  function eventCells(e, event, details) {
    const where = eventWhere(e); // cut to the column's width (a long host name squeezed the details)
    return `<td class="t">${esc(fmtSince(e.t))}</td><td class="clock">${esc(fmtClock(e.time))}</td>` +
      `<td class="ev">${esc(event)}</td><td class="where" title="${esc(where)}">${esc(where)}</td>` +
      `<td class="step">${isNum(e.step) ? esc(fmtInt(e.step)) : ''}</td><td class="details">${details}</td>`;
  }

  function showEvent(e, tbody = $('#events tbody')) {
    const empty = tbody.querySelector('tr.empty');
    if (empty) empty.remove();
    const collapse = e.event === 'rank_up' && !$('#show-rank-up').checked;
    if (collapse && st.rankUpGroup) { // one more rank in the newest group
      const g = st.rankUpGroup;
      g.ranks.push(e.rank);
      g.tr.dataset.count = String(g.ranks.length);
      g.tr.querySelector('td.details').textContent = rankUpText(g.ranks);
      return;
    }
    const tr = document.createElement('tr');
    tr.dataset.event = e.event;
    tr.dataset.seq = String(e.seq);
    if (e.event === 'fault_detected' && e.kind) tr.dataset.kind = e.kind;
    const tone = eventTone(e);
    if (tone) tr.className = tone;
    if (collapse) {
      st.rankUpGroup = { tr, ranks: [e.rank] };
      tr.dataset.count = '1';
      tr.innerHTML = eventCells({ t: e.t, time: e.time }, 'rank_up', esc(rankUpText([e.rank])));
    } else {
      st.rankUpGroup = null;
      const rest = Object.keys(e).filter((k) => !HIDDEN_FIELDS.has(k) && e[k] !== '').map((k) => fieldText(k, e[k]));
      const lead = e.detail ? `${esc(cut(e.detail))}${rest.length ? ' · ' : ''}` : '';
      tr.innerHTML = eventCells(e, e.event, lead + rest.map((s) => {
        const i = s.indexOf('=');
        return `<span class="k">${esc(s.slice(0, i))}=</span>${esc(s.slice(i + 1))}`;
      }).join(' '));
    }
    tbody.insertBefore(tr, tbody.firstChild); // newest first
    while (tbody.rows.length > MAX_EVENT_ROWS) tbody.deleteRow(-1);
  }

  function rankUpText(ranks) {
    const n = ranks.length;
    return `${n} rank${n > 1 ? 's' : ''} up: ${ranks.map((r) => `r${r}`).join(' ')}`;
  }

  // The table built aside and put in place once (row by row in the page, 2,000 rows took
  // 3 s to show after a click on "show each rank_up").
  function redrawEvents() {
    const old = $('#events tbody');
    const tbody = document.createElement('tbody');
    st.rankUpGroup = null;
    for (const e of st.events) showEvent(e, tbody); // (rows past MAX_EVENT_ROWS trimmed)
    if (st.events.length === 0) tbody.innerHTML = '<tr class="empty"><td colspan="6">no events yet</td></tr>';
    old.replaceWith(tbody);
  }

  /* ---------- heat map ---------- */

  // Diverging blue → white → red over log2(ratio) in [-1, 1] (0.5x .. 2x):
  // red is slower than the step's (lower) median over the rank's pipeline stage,
  // or, for a stage of one rank, than the rank's own early speed.
  const HEAT_STOPS = [[33, 102, 172], [103, 169, 207], [247, 247, 247], [239, 138, 98], [178, 24, 43]];
  function heatColor(ratio) {
    if (!isNum(ratio) || ratio <= 0) return '#e9ecf1';
    const t = (Math.max(-1, Math.min(1, Math.log2(ratio))) + 1) / 2 * (HEAT_STOPS.length - 1);
    const i = Math.min(HEAT_STOPS.length - 2, Math.floor(t)), f = t - i;
    const c = HEAT_STOPS[i].map((v, k) => Math.round(v + (HEAT_STOPS[i + 1][k] - v) * f));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  async function pollHeatmap(final) {
    const h = await getJson('api/heatmap', fin(final));
    // Redraw only when it changed: new steps, other ranks or stragglers.
    const s = h.steps || [];
    const key = `${s.length}:${s[0]}:${s[s.length - 1]}:${(h.ranks || []).length}:${h.stragglers}`;
    st.heat = h;
    if (key === st.heatKey) return;
    st.heatKey = key;
    drawHeatmap();
  }

  // s cut with an ellipsis to w pixels (fillText's maxWidth squeezed a long node name flat).
  function fitText(ctx, s, w) {
    if (ctx.measureText(s).width <= w) return s;
    let lo = 0, hi = s.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (ctx.measureText(`${s.slice(0, mid)}…`).width <= w) lo = mid; else hi = mid - 1;
    }
    return `${s.slice(0, lo)}…`;
  }

  function heatGeometry(h, width) {
    const nr = h.ranks.length, ns = h.steps.length;
    const rowH = nr <= 16 ? 22 : nr <= 64 ? 10 : 4;
    const labelW = rowH >= 10 ? 170 : 40;
    const top = 4, axisH = 22;
    const colW = ns > 0 ? (width - labelW - 8) / ns : 0;
    return { nr, ns, rowH, labelW, top, axisH, colW, height: top + nr * rowH + axisH };
  }

  function drawHeatmap() {
    const h = st.heat;
    const canvas = $('#heatmap');
    const steps = (h && h.steps) || [], ranks = (h && h.ranks) || [];
    const width = canvas.parentElement.clientWidth;
    if (width === 0) return;
    const g = heatGeometry({ steps, ranks }, width);
    const height = Math.max(g.height, 60);
    const dpr = window.devicePixelRatio || 1;
    // Resize only when the size changes: a resize lays the page out again.
    if (canvas.width !== Math.round(width * dpr)) canvas.width = Math.round(width * dpr);
    if (canvas.height !== Math.round(height * dpr)) canvas.height = Math.round(height * dpr);
    if (canvas.style.height !== `${height}px`) canvas.style.height = `${height}px`;
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = `11px ${getComputedStyle(document.body).fontFamily}`;
    ctx.textBaseline = 'middle';
    if (steps.length === 0 || ranks.length === 0) {
      ctx.fillStyle = '#687385';
      ctx.fillText('no per-rank timings yet', 8, 24);
    } else {
      const strag = new Set(h.stragglers || []);
      for (let r = 0; r < g.nr; r++) {
        const y = g.top + r * g.rowH;
        const row = (h.ratio && h.ratio[r]) || [];
        for (let s = 0; s < g.ns; s++) {
          ctx.fillStyle = heatColor(row[s]);
          const x0 = g.labelW + s * g.colW;
          // 1px gaps when the cells are wide enough keep white cells visible.
          ctx.fillRect(x0, y, Math.max(1, g.colW - (g.colW > 4 ? 1 : 0)), g.rowH - (g.rowH > 6 ? 1 : 0));
        }
        const isStrag = strag.has(ranks[r]);
        if (g.rowH >= 10) {
          ctx.fillStyle = isStrag ? '#d63b3b' : '#3b4656';
          ctx.font = `${isStrag ? '600 ' : ''}11px ${getComputedStyle(document.body).fontFamily}`;
          const label = (h.labels && h.labels[r]) || `r${ranks[r]}`;
          ctx.fillText(fitText(ctx, isStrag ? `⚠ ${label}` : label, g.labelW - 8), 4, y + g.rowH / 2);
        }
        if (isStrag) {
          ctx.strokeStyle = '#d63b3b';
          ctx.lineWidth = 2;
          ctx.strokeRect(g.labelW - 1, y, g.ns * g.colW + 1, g.rowH - 1);
        }
      }
      // Step numbers under the columns, about every 60 px.
      ctx.fillStyle = '#687385';
      ctx.font = `10px ${getComputedStyle(document.body).fontFamily}`;
      ctx.textAlign = 'center';
      const every = Math.max(1, Math.ceil(60 / Math.max(1, g.colW)));
      const yAxis = g.top + g.nr * g.rowH + g.axisH / 2;
      for (let s = 0; s < g.ns; s += every) ctx.fillText(String(steps[s]), g.labelW + (s + 0.5) * g.colW, yAxis);
      ctx.textAlign = 'left';
    }
    canvas.dataset.steps = String(steps.length);
    canvas.dataset.ranks = String(ranks.length);
    const strags = (h && h.stragglers) || [];
    $('#heat-note').textContent = `${strags.length ? `stragglers: ${strags.map((r) => `r${r}`).join(', ')}` : 'no stragglers'}` +
      `${h && isNum(h.threshold) ? ` · detector threshold ${h.threshold}` : ''} · grey: no data`;
  }

  function heatHover(ev) {
    const h = st.heat, tip = $('#heat-tip'), canvas = $('#heatmap');
    if (!h || !h.steps || !h.steps.length) { tip.hidden = true; return; }
    const g = heatGeometry(h, canvas.clientWidth);
    const r = Math.floor((ev.offsetY - g.top) / g.rowH), s = Math.floor((ev.offsetX - g.labelW) / g.colW);
    if (r < 0 || r >= g.nr || s < 0 || s >= g.ns) { tip.hidden = true; return; }
    const ratio = h.ratio && h.ratio[r] ? h.ratio[r][s] : null;
    const ms = h.compute_ms && h.compute_ms[r] ? h.compute_ms[r][s] : null;
    const label = (h.labels && h.labels[r]) || `r${h.ranks[r]}`;
    const strag = (h.stragglers || []).includes(h.ranks[r]) ? ' · straggler' : '';
    tip.innerHTML = `<b>${esc(label)}</b>${esc(strag)}<br>step ${esc(h.steps[s])} · compute ${esc(fmtMs(ms))}` +
      ` · ${isNum(ratio) ? `${ratio.toFixed(2)}× ${h.against && h.against[r] === 'own'
        ? 'its own early speed (the only rank of its stage)' : 'the stage median'}` : 'no data'}`;
    tip.hidden = false;
    const x = Math.min(ev.offsetX + 14, canvas.clientWidth - tip.offsetWidth - 4);
    tip.style.left = `${Math.max(0, x)}px`;
    tip.style.top = `${ev.offsetY + 14}px`;
  }

  function drawHeatScale() {
    const c = $('#heat-scale'), ctx = c.getContext('2d');
    for (let x = 0; x < c.width; x++) {
      ctx.fillStyle = heatColor(Math.pow(2, (x / (c.width - 1)) * 2 - 1));
      ctx.fillRect(x, 0, 1, c.height);
    }
  }

  /* ---------- checkpoints ---------- */

  // The newest MAX_CKPT_ROWS, drawn only when the list changed: 4,096 rows formatted and
  // compared on every poll held the page for a second each time.
  const MAX_CKPT_ROWS = 200;
  async function pollCheckpoints(final) {
    const r = await getJson('api/checkpoints', fin(final));
    const all = r.checkpoints || [];
    const key = `${all.length}|${JSON.stringify(all[0] || null)}|${JSON.stringify(all[all.length - 1] || null)}|${st.t0}`;
    if (key === st.ckptKey) return;
    st.ckptKey = key;
    const list = all.slice().sort((a, b) => b.step - a.step).slice(0, MAX_CKPT_ROWS); // newest first
    const more = all.length - list.length;
    const html = list.length === 0
      ? '<tr class="empty"><td colspan="6">no checkpoints yet</td></tr>'
      : list.map((c) => `<tr data-step="${esc(c.step)}"><td>${esc(fmtInt(c.step))}</td><td>${esc(fmtBytes(c.bytes))}</td>` +
        `<td>${esc(fmtMs(c.stall_ms))}</td><td>${esc(fmtMs(c.persist_ms))}</td>` +
        `<td>${esc(isNum(c.wall) && isNum(st.t0) ? fmtSince(c.wall - st.t0) : dash)}</td><td>${esc(fmtClock(c.wall))}</td></tr>`).join('') +
        (more > 0 ? `<tr class="more"><td colspan="6">… ${esc(fmtInt(more))} older checkpoint${more > 1 ? 's' : ''} (in the metrics file)</td></tr>` : '');
    $('#checkpoints tbody').innerHTML = html;
  }

  /* ---------- start ---------- */

  function start() {
    renderStateLegend();
    drawHeatScale();
    redrawEvents();
    makeCharts();
    for (const input of document.querySelectorAll('input[name="xaxis"]')) {
      if (input.checked) st.xMode = input.value; // a reload may restore the choice
      input.addEventListener('change', () => { if (input.checked) setXMode(input.value); });
    }
    $('#show-rank-up').addEventListener('change', redrawEvents);
    const canvas = $('#heatmap');
    canvas.addEventListener('mousemove', heatHover);
    canvas.addEventListener('mouseleave', () => { $('#heat-tip').hidden = true; });
    new ResizeObserver(() => drawHeatmap()).observe(canvas.parentElement);

    for (const [name, fn] of POLLED) poll(name, fn);
  }

  const POLLED = [['status', pollStatus], ['metrics', pollMetrics], ['events', pollEvents],
    ['heatmap', pollHeatmap], ['checkpoints', pollCheckpoints]];
  start();
})();
