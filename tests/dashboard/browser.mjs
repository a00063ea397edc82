// browser.mjs - drives a real browser (Debian's chromium, through
// playwright-core) against a live dashboard and checks that the page follows
// the job: it loads, the loss curve gains points without a reload, the event
// log starts at the first event, a fault
// shows in the event log and on the rank grid, training resumes, the
// full-page screenshot is not blank, and the page logged no errors.
//
//   node tests/dashboard/browser.mjs --url URL --shot OUT.png
//        [--fault-rank R] [--model TEXT] [--to-end] [--big] [--timeout S] [--chromium PATH]
//
// URL is the dashboard's address with its token (http://HOST:PORT/?token=T).
// --model: the header's job line must name this model (and its parameters).
// --big: a finished run with oversized files (`megascale dashboard`): an event detail of
//   512 KiB is shown cut, the checkpoints past the newest 200 are one line, a click on "show
//   each rank_up" redraws the log, and nothing went wrong; the live steps are skipped.
// --to-end: the page then follows the job to its end: it reads the end
// (state done) before the server exits, stops asking (body[data-gone]), and
// no request of it fails then (before, each endpoint's next poll was
// refused: ERR_CONNECTION_REFUSED in the console).
// Prints one "browser: ..." line per step passed and "browser: ok" at the
// end; exits 1 with "browser: FAIL: ..." (and still writes the screenshot),
// 2 on bad usage, 77 with "browser: SKIP: ..." when playwright-core
// (cd tests/dashboard && npm install --no-audit --no-fund) or chromium is
// missing. The page's data-* attributes it reads are listed in
// web/dashboard/dash.js.
import fs from 'node:fs';

const USAGE = 'usage: node browser.mjs --url URL --shot OUT.png [--fault-rank R] [--model TEXT] [--to-end] [--big] [--timeout S] [--chromium PATH]';
const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const MIN_COLOURS = 50; // distinct colours a rendered dashboard has at least

function parseArgs(argv) {
  const o = { url: null, shot: null, faultRank: null, model: null, toEnd: false, timeout: 180, chromium: '/usr/bin/chromium' };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i], v = argv[i + 1];
    const need = () => {
      if (v === undefined) usage(`${k} needs a value`);
      i++;
      return v;
    };
    if (k === '--url') o.url = need();
    else if (k === '--shot') o.shot = need();
    else if (k === '--fault-rank') o.faultRank = Number(need());
    else if (k === '--model') o.model = need();
    else if (k === '--to-end') o.toEnd = true;
    else if (k === '--big') o.big = true;
    else if (k === '--timeout') o.timeout = Number(need());
    else if (k === '--chromium') o.chromium = need();
    else if (k === '--help' || k === '-h') { console.log(USAGE); process.exit(0); }
    else usage(`unknown argument ${k}`);
  }
  if (!o.url || !o.shot) usage('--url and --shot are required');
  if (o.faultRank !== null && !(Number.isInteger(o.faultRank) && o.faultRank >= 0)) usage('--fault-rank must be a rank number');
  if (!(o.timeout > 0)) usage('--timeout must be a positive number of seconds');
  return o;
}

function usage(why) {
  console.error(`browser: ${why}\n${USAGE}`);
  process.exit(2);
}

function skip(why) {
  console.log(`browser: SKIP: ${why}`);
  process.exit(77);
}

const say = (msg) => console.log(`browser: ${msg}`);

const opt = parseArgs(process.argv.slice(2));
const deadline = Date.now() + opt.timeout * 1000;
const left = () => Math.max(1, deadline - Date.now());

let chromium;
try {
  ({ chromium } = await import('playwright-core'));
} catch (e) {
  skip(`playwright-core is not installed (cd tests/dashboard && npm install --no-audit --no-fund): ${e.message}`);
}
if (!fs.existsSync(opt.chromium)) skip(`${opt.chromium} is missing (Debian package chromium)`);

const errors = []; // console errors and uncaught exceptions of the page
let browser, page;

// What the page shows now, for failure messages.
async function pageState() {
  try {
    return await page.evaluate(() => {
      const q = (s) => document.querySelector(s);
      const loss = q('#loss-chart');
      const banner = q('#banner');
      return `ready=${document.body.dataset.ready || '-'} polls=${document.body.dataset.polls || 0}` +
        ` state=${q('#job-state') ? q('#job-state').textContent : '-'}` +
        ` loss points=${loss ? loss.dataset.points : '-'}` +
        ` fault rows=${document.querySelectorAll('#events tr[data-event="fault_detected"]').length}` +
        `${banner && !banner.hidden ? ` banner="${banner.textContent}"` : ''}`;
    });
  } catch (e) {
    return `(page not readable: ${e.message})`;
  }
}

// Waits, within the overall deadline, until fn(arg) is true in the page.
async function waitFor(what, fn, arg) {
  try {
    return await (await page.waitForFunction(fn, arg, { timeout: left(), polling: 200 })).jsonValue();
  } catch (e) {
    if (e.name !== 'TimeoutError') throw e;
    throw new Error(`timed out (--timeout ${opt.timeout} s) waiting for ${what}; the page: ${await pageState()}`);
  }
}

const lossPoints = () => page.$eval('#loss-chart', (el) => Number(el.dataset.points || 0));

// Decodes the PNG in a blank page and counts its distinct colours, over the
// whole image and inside rect (the loss chart, in page pixels).
async function shotColours(file, rect) {
  const blank = await browser.newPage();
  try {
    const b64 = fs.readFileSync(file).toString('base64');
    return await blank.evaluate(async ({ b64, rect }) => {
      const img = new Image();
      img.src = `data:image/png;base64,${b64}`;
      await img.decode();
      const c = document.createElement('canvas');
      c.width = img.naturalWidth;
      c.height = img.naturalHeight;
      const ctx = c.getContext('2d', { willReadFrequently: true });
      ctx.drawImage(img, 0, 0);
      const count = (x0, y0, w, h, stride) => {
        const d = ctx.getImageData(x0, y0, w, h).data;
        const seen = new Set();
        for (let y = 0; y < h; y += stride) {
          for (let x = 0; x < w; x += stride) {
            const i = (y * w + x) * 4;
            seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
          }
        }
        return seen.size;
      };
      const r = {
        x: Math.max(0, Math.floor(rect.x)), y: Math.max(0, Math.floor(rect.y)),
        w: Math.min(c.width - Math.floor(rect.x), Math.floor(rect.w)), h: Math.min(c.height - Math.floor(rect.y), Math.floor(rect.h)),
      };
      return { width: c.width, height: c.height, all: count(0, 0, c.width, c.height, 2),
        loss: r.w > 0 && r.h > 0 ? count(r.x, r.y, r.w, r.h, 1) : 0 };
    }, { b64, rect });
  } finally {
    await blank.close();
  }
}

async function run() {
  browser = await chromium.launch({ executablePath: opt.chromium, args: CHROMIUM_ARGS, timeout: left() });
  const context = await browser.newContext({ viewport: { width: 1440, height: 900 }, deviceScaleFactor: 1 });
  page = await context.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(`console: ${m.text()} (${m.location().url || 'page'})`);
  });
  page.on('pageerror', (e) => errors.push(`uncaught: ${e.message}`));
  page.on('requestfailed', (r) => errors.push(`request failed: ${r.url().replace(/token=[0-9a-f]+/, 'token=...')} (${r.failure()?.errorText})`));

  // 1. The page loads and its first status poll succeeds.
  const res = await page.goto(opt.url, { timeout: left(), waitUntil: 'load' });
  if (res && !res.ok()) throw new Error(`${opt.url} answered HTTP ${res.status()} ${res.statusText()} (a wrong token?)`);
  await waitFor('body[data-ready="1"] (the first api/status poll)', () => document.body.dataset.ready === '1');
  say(`page ready after ${await page.$eval('body', (b) => b.dataset.polls)} status poll(s)`);
  if (opt.model !== null) {
    const info = await waitFor(`#job-info naming "model ${opt.model}, ... params"`, (m) => {
      const t = document.querySelector('#job-info').textContent;
      return t.includes(`model ${m}, `) && / params/.test(t) ? t : false;
    }, opt.model);
    say(`job line: ${info}`);
  }

  if (opt.big) return checkBig();

  // 2. The loss curve has points and gains more while the job trains.
  const n1 = await waitFor('#loss-chart data-points >= 2', () => {
    const n = Number(document.querySelector('#loss-chart').dataset.points || 0);
    return n >= 2 ? n : false;
  });
  say(`loss chart has ${n1} points`);
  const n2 = await waitFor(`#loss-chart data-points > ${n1} (no reload)`, (n) => {
    const v = Number(document.querySelector('#loss-chart').dataset.points || 0);
    return v > n ? v : false;
  }, n1);
  say(`loss chart grew to ${n2} points without a reload`);
  const seen = await page.evaluate(() => ({
    ranks: document.querySelectorAll('#grid [data-rank]').length,
    steps: document.querySelector('#heatmap').dataset.steps,
    hranks: document.querySelector('#heatmap').dataset.ranks,
  }));
  say(`rank grid shows ${seen.ranks} ranks, heat map ${seen.steps} steps x ${seen.hranks} ranks`);
  if (Number(seen.steps) > 0) {
    // The first cell's tooltip names what its ratio is over (it said "× median" for both).
    await page.hover('#heatmap', { position: { x: 172, y: 8 }, timeout: left() });
    const tip = await waitFor('#heat-tip shown with a ratio or "no data"', () => {
      const t = document.querySelector('#heat-tip');
      return t && !t.hidden && t.textContent ? t.textContent : false;
    });
    if (!/× (the stage median|its own early speed)|no data/.test(tip)) throw new Error(`heat map tooltip: ${tip}`);
    say(`heat map tooltip: ${tip}`);
  }
  // The event log starts at the first event (seq 0: job_start).
  const first = await waitFor('the first event (#events tr[data-seq="0"])', () => {
    const tr = document.querySelector('#events tr[data-seq="0"]');
    return tr ? tr.dataset.event : false;
  });
  say(`event log has the first event (seq 0, ${first})`);

  // 3. The fault shows in the event log and on the rank grid.
  if (opt.faultRank !== null) {
    const row = await waitFor('an #events tr[data-event="fault_detected"] row', () => {
      const tr = document.querySelector('#events tr[data-event="fault_detected"]');
      return tr ? { seq: tr.dataset.seq, kind: tr.dataset.kind || '?', where: tr.querySelector('td.where')?.textContent } : false;
    });
    say(`event log has a fault_detected row (seq ${row.seq}, kind ${row.kind}, ${row.where || 'no rank'})`);
    const cell = await waitFor(`the grid cell [data-rank="${opt.faultRank}"] with data-faults >= 1`, (r) => {
      const el = document.querySelector(`#grid [data-rank="${r}"]`);
      return el && Number(el.dataset.faults) >= 1 ? { faults: el.dataset.faults, state: el.dataset.state } : false;
    }, opt.faultRank);
    say(`grid rank ${opt.faultRank} shows ${cell.faults} fault(s) (state ${cell.state})`);
  }

  // 4. Training goes on (after the fault: the curve may first shrink to the
  // checkpoint's step when the server drops redone steps), then the shot.
  const before = await lossPoints();
  const n3 = await waitFor('#loss-chart data-points to grow again with the job running', (n) => {
    const v = Number(document.querySelector('#loss-chart').dataset.points || 0);
    window.msLowest = Math.min(window.msLowest ?? n, v);
    const state = document.querySelector('#job-state').textContent;
    return v > window.msLowest && (state === 'running' || state === 'done') ? v : false;
  }, before);
  say(`loss chart grew to ${n3} points${opt.faultRank !== null ? ' after the fault' : ''}`);
  await checkShot();

  // 5. The job's end: read before the server goes, and nothing asked after.
  if (opt.toEnd) {
    const end = await waitFor('body[data-gone="1"] (the page read the end and stopped asking)', () => {
      return document.body.dataset.gone === '1' ? document.querySelector('#job-state').textContent : false;
    });
    if (end !== 'done') throw new Error(`the page stopped asking with the job ${end}, not done`);
    await page.waitForTimeout(Math.min(6000, left()));
    say(`the page read the job's end (${end}) and asked nothing after the server went`);
  }

  // 6. Nothing went wrong in the page.
  if (errors.length) throw new Error(`the page logged ${errors.length} error(s):\n  ${errors.join('\n  ')}`);
  say('no console errors');
}

// A finished run with oversized files: the long detail cut, the old checkpoints one line,
// the log redrawn on a click, no error.
async function checkBig() {
  const cutLen = await waitFor('an event detail cut ("more characters")', () => {
    for (const td of document.querySelectorAll('#events td.details')) {
      if (td.textContent.includes('more characters)')) return td.textContent.length;
    }
    return false;
  });
  if (cutLen > 5000) throw new Error(`the cut detail still has ${cutLen} characters`);
  say(`the long detail is shown cut (${cutLen} characters)`);
  const older = await waitFor('#checkpoints tr.more (the older checkpoints in one line)', () => {
    const tr = document.querySelector('#checkpoints tr.more');
    return tr ? `${document.querySelectorAll('#checkpoints tr[data-step]').length} rows + "${tr.textContent}"` : false;
  });
  say(`checkpoints: ${older}`);
  await page.click('#show-rank-up', { timeout: left() });
  const rows = await waitFor('the log redrawn with each rank_up', () => {
    const n = document.querySelectorAll('#events tr[data-event="rank_up"]').length;
    return n >= 2 ? n : false;
  });
  say(`"show each rank_up": ${rows} rank_up rows`);
  await page.screenshot({ path: opt.shot, fullPage: false, timeout: left() });
  if (errors.length) throw new Error(`the page logged ${errors.length} error(s):\n  ${errors.join('\n  ')}`);
  say('no console errors');
}

async function checkShot() {
  await page.screenshot({ path: opt.shot, fullPage: true, timeout: left() });
  const rect = await page.$eval('#loss-chart', (el) => {
    const r = el.getBoundingClientRect();
    return { x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height };
  });
  const c = await shotColours(opt.shot, rect);
  if (c.all < MIN_COLOURS) throw new Error(`screenshot ${opt.shot} looks blank: ${c.all} distinct colours (want >= ${MIN_COLOURS})`);
  if (c.loss < 3) throw new Error(`screenshot ${opt.shot}: the loss chart region is uniform (${c.loss} colours)`);
  say(`screenshot ${opt.shot} (${c.width}x${c.height}): ${c.all} distinct colours, loss chart ${c.loss}`);
}

let code = 0;
try {
  await run();
  say('ok');
} catch (e) {
  console.log(`browser: FAIL: ${e.message}`);
  if (errors.length && !/logged \d+ error/.test(e.message)) console.log(`browser: the page logged:\n  ${errors.join('\n  ')}`);
  if (page) await page.screenshot({ path: opt.shot, fullPage: true, timeout: 10000 }).then(
    () => console.log(`browser: the page as it was: ${opt.shot}`), () => {});
  code = 1;
} finally {
  if (browser) await browser.close().catch(() => {});
}
process.exit(code);
