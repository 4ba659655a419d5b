// The dashboard in a real browser (Debian's chromium, headless, through playwright-core) against a
// `tessera server` on a simulated DGX H100: what a user sees and may do, and what they may not.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, test } from 'node:test';
import { ADMIN_TOKEN, ME, OTHER, OTHER_TOKEN, Server, USER_TOKEN, launchBrowser, openPage } from './harness.mjs';

let server;
let browser;

before(async () => {
  server = await new Server({ extra: `quotas:\n  ${ME}: {gpus: 6}\n` }).start();
  browser = await launchBrowser();
});

after(async () => {
  if (browser) await browser.close();
  if (server) {
    if (server.proc) {
      const live = await server.api(ADMIN_TOKEN, 'GET', '/v1/jobs?state=queued,running');
      for (const j of live.body.jobs || []) await server.api(ADMIN_TOKEN, 'POST', `/v1/jobs/${j.id}/cancel`);
    }
    await server.remove();
  }
});

const sh = (cmd) => ['sh', '-c', cmd];

test('the overview shows every GPU, the topology, the quotas and charts with data', async () => {
  const page = await openPage(browser, server, USER_TOKEN);
  await page.waitForSelector('.tile');
  assert.equal(await page.locator('.tile').count(), 8);
  for (let i = 0; i < 8; i++) {
    const tile = page.locator(`.tile[data-gpu="${i}"]`);
    assert.match(await tile.innerText(), new RegExp(`GPU ${i}[\\s\\S]*NVIDIA H100 80GB HBM3[\\s\\S]*of 80 GiB`));
  }
  const topo = await page.locator('.topology svg').getAttribute('aria-label');
  assert.match(topo, /NVSwitch \(NV18\)/);
  assert.match(topo, /NUMA node 0: GPUs 0, 1, 2, 3; NUMA node 1: GPUs 4, 5, 6, 7/);
  assert.match(await page.locator('table').last().innerText(), new RegExp(`user ${ME}\\s+0 of 6`));
  assert.equal(await page.locator('#who').innerText(), ME);
  // Samples come every 0.5 s: the charts get points without a reload.
  await page.waitForFunction(() => Number(document.querySelector('#chart-jobs')?.dataset.points) >= 6, null, { timeout: 10000 });
  await page.waitForSelector('#live.on');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a job submitted in the page appears, runs, shows its log, and can be cancelled', async () => {
  const page = await openPage(browser, server, USER_TOKEN, '#/jobs');
  await page.fill('#f-command', 'echo $GREETING-from-the-page; sleep 60');
  await page.fill('#f-name', 'from-page');
  await page.fill('#f-gpus', '1');
  await page.click('#submit details summary');
  await page.fill('#f-env', 'GREETING=hello');
  await page.fill('#f-labels', 'team=nlp');
  await page.fill('#f-cpus', '0.5');
  await page.fill('#f-max_runtime_s', '600');
  await page.click('#submit button[type=submit]');
  await page.waitForURL(/#\/jobs\/\d+$/);
  const id = Number(page.url().match(/#\/jobs\/(\d+)$/)[1]);
  // Running, and said so by the stream (no reload), with its output.
  await page.waitForSelector('h1 .state-running', { timeout: 10000 });
  await page.waitForFunction(() => document.querySelector('#logs').textContent.includes('hello-from-the-page'), null, { timeout: 10000 });
  const job = (await server.api(USER_TOKEN, 'GET', `/v1/jobs/${id}`)).body;
  assert.equal(job.name, 'from-page');
  assert.equal(job.owner, ME);
  assert.deepEqual(job.spec.command, sh('echo $GREETING-from-the-page; sleep 60'));
  assert.deepEqual(job.spec.env, { GREETING: 'hello' });
  assert.deepEqual(job.spec.labels, { team: 'nlp' });
  assert.equal(job.spec.max_runtime_s, 600);
  assert.equal(job.spec.resources.cpus, 0.5);
  // The overview's tile of its GPU lists it.
  const gpu = job.placement.gpus[0].index;
  await page.evaluate(() => { location.hash = '#/'; });
  await page.waitForSelector(`.tile[data-gpu="${gpu}"] a[href="#/jobs/${id}"]`);
  // Cancel from its page: running work is asked about first; dismissed, nothing happens.
  await page.evaluate((j) => { location.hash = `#/jobs/${j}`; }, id);
  const asked = [];
  page.once('dialog', (d) => { asked.push(d.message()); d.dismiss(); });
  await page.click('#cancel');
  assert.match(asked[0], new RegExp(`Cancel job #${id} \\(from-page\\)\\? It is running`));
  assert.equal((await server.api(USER_TOKEN, 'GET', `/v1/jobs/${id}`)).body.state, 'running');
  page.once('dialog', (d) => d.accept());
  await page.click('#cancel');
  await page.waitForSelector('h1 .state-cancelled', { timeout: 10000 });
  assert.match(await page.locator('#events').innerText(), new RegExp(`cancelled\\s+cancelled by ${ME}`));
  // What it used of what it held, as `tessera eff` says: its run's length and GPU time, and no
  // figure where nothing was measured (a simulated GPU).
  await page.waitForFunction(() => /elapsed\s+[\d.,]+ s\b/.test(document.querySelector('dl#efficiency')?.innerText || ''));
  const eff = (await server.api(USER_TOKEN, 'GET', `/v1/jobs/${id}`)).body.efficiency;
  assert.equal(eff.running, false);
  assert.match(await page.locator('dl#efficiency').innerText(), new RegExp(`GPUs held\\s+1, ${eff.gpu_hours.toFixed(3)} GPU-hours`));
  assert.match(await page.locator('dl#efficiency').innerText(), /GPU busy\s+–/);
  // The overview's last 7 days: this user's line, their GPU-hours as acct gives them.
  await page.evaluate(() => { location.hash = '#/'; });
  await page.waitForFunction((me) => [...document.querySelectorAll('#efficiency tbody tr')].some((r) => r.cells[0].textContent === me), ME);
  const acct = (await server.api(USER_TOKEN, 'GET', `/v1/acct?since=${Math.floor(Date.now() / 1000 - 7 * 86400)}&until=${Math.ceil(Date.now() / 1000)}`)).body;
  const line = acct.by_user.find((l) => l.key === ME);
  const row = await page.locator('#efficiency tbody tr', { hasText: ME }).first().innerText();
  assert.match(row, new RegExp(`${ME}\\s+${line.jobs}\\s+`));
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

// A CUDA program (the fake driver, under the intercept library) whose 1 GiB limit refused an
// allocation: its page says so beside its peak, as `tessera eff` does.
test('a job whose GPU memory limit refused allocations says so on its page', async () => {
  const client = process.env.TESSERA_CUDA_CLIENT;
  assert.ok(client, 'TESSERA_CUDA_CLIENT: set it to the test CUDA program (ctest does)');
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs',
    { command: [client, 'link', 'alloc:500', 'alloc:800'], resources: { gpu_share: '50%', gpu_memory: '1GiB' } });
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const page = await openPage(browser, server, USER_TOKEN, `#/jobs/${sub.body.id}`);
  await page.waitForSelector('h1 .state-succeeded', { timeout: 15000 });
  const eff = (await server.api(USER_TOKEN, 'GET', `/v1/jobs/${sub.body.id}`)).body.efficiency;
  assert.equal(eff.gpu_memory_refused, 1, JSON.stringify(eff));
  await page.waitForFunction(() => /GPU memory refused/.test(document.querySelector('dl#efficiency')?.innerText || ''));
  const shown = await page.locator('dl#efficiency').innerText();
  assert.match(shown, /GPU memory peak\s+500 MiB of 1\.0 GiB \(48\.8%\)/);
  assert.match(shown, /GPU memory refused\s+1 allocation at its limit; it asked for 1\.3 GiB at most/);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

// A CUDA program that launches a kernel every 20 ms on half a GPU: the overview lists it among the
// jobs that left GPU time idle, with the figures `tessera acct` gives (most_idle).
test('the overview says which jobs left the most GPU time idle', async () => {
  const client = process.env.TESSERA_CUDA_CLIENT;
  assert.ok(client, 'TESSERA_CUDA_CLIENT: set it to the test CUDA program (ctest does)');
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs',
    { name: 'mostly-idle', command: [client, 'link', 'work:1500:500:1:20000:0:1500'], resources: { gpu_share: '50%', gpu_memory: '1GiB' } });
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const id = sub.body.id;
  const page = await openPage(browser, server, USER_TOKEN, `#/jobs/${id}`);
  await page.waitForSelector('h1 .state-succeeded', { timeout: 15000 });
  await page.evaluate(() => { location.hash = '#/'; });
  await page.waitForSelector(`#most-idle tr[data-job="${id}"]`);
  const acct = (await server.api(USER_TOKEN, 'GET', `/v1/acct?since=${Math.floor(Date.now() / 1000 - 7 * 86400)}&until=${Math.ceil(Date.now() / 1000)}`)).body;
  const line = acct.most_idle.find((j) => j.id === id);
  assert.ok(line, JSON.stringify(acct.most_idle));
  assert.ok(line.gpu_busy_pct < 60, `a kernel every 20 ms keeps little of half a GPU busy: ${JSON.stringify(line)}`);
  const row = await page.locator(`#most-idle tr[data-job="${id}"]`).innerText();
  assert.match(row, new RegExp(`#${id}\\s+mostly-idle\\s+${ME}\\s+${line.gpu_hours.toFixed(4)}\\s+${line.gpu_busy_pct.toFixed(1)}%\\s+${line.idle_gpu_hours.toFixed(4)}`));
  // A link to the job's page.
  await page.click(`#most-idle tr[data-job="${id}"] a`);
  await page.waitForURL(new RegExp(`#/jobs/${id}$`));
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a share of several GPUs is said as one, on its GPUs', async () => {
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs',
    { command: sh('sleep 60'), resources: { gpus: 2, gpu_share: '50%', gpu_memory: '10GiB' }, hold: true });
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const page = await openPage(browser, server, USER_TOKEN, `#/jobs/${sub.body.id}`);
  await page.waitForFunction(() => /50% share, 10240MiB, on 2 GPUs/.test(document.body.textContent));
  await server.api(USER_TOKEN, 'POST', `/v1/jobs/${sub.body.id}/cancel`);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an elastic job says its range of GPUs', async () => {
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs',
    { command: sh('sleep 60'), resources: { gpus: 1, gpus_max: 2 }, hold: true });
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const page = await openPage(browser, server, USER_TOKEN, `#/jobs/${sub.body.id}`);
  await page.waitForFunction(() => [...document.querySelectorAll('dt')].some((dt) => dt.textContent === 'asks' && dt.nextElementSibling.textContent === '1-2 GPUs'));
  await server.api(USER_TOKEN, 'POST', `/v1/jobs/${sub.body.id}/cancel`);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an elastic job resized while it runs shows its size over time', async () => {
  // One GPU held by another job; the elastic one starts on the rest and grows onto it when it is
  // given back (resized by restart: stopped and started again on them all).
  const hog = await server.api(USER_TOKEN, 'POST', '/v1/jobs', { command: sh('sleep 60'), resources: { gpus: 1 } });
  assert.equal(hog.status, 201, JSON.stringify(hog.body));
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs',
    { command: sh('sleep 60'), resources: { gpus: 1, gpus_max: 8 }, resize: { by: 'restart' } });
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const page = await openPage(browser, server, USER_TOKEN, `#/jobs/${sub.body.id}`);
  await page.waitForSelector('h1 .state-running', { timeout: 10000 });
  await server.api(USER_TOKEN, 'POST', `/v1/jobs/${hog.body.id}/cancel`);
  await page.waitForFunction(() => /GPUs? from .*, \d GPUs from .* \(started again 1 times\)/.test((document.querySelector('#sizes') || {}).textContent || ''), null, { timeout: 15000 });
  assert.ok(await page.$('#chart-size svg'));
  await server.api(USER_TOKEN, 'POST', `/v1/jobs/${sub.body.id}/cancel`);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a job on no GPU is said to be on none, in the list and on its page', async () => {
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs', { name: 'cpu-only', command: sh('sleep 60') });
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const page = await openPage(browser, server, USER_TOKEN, `#/jobs/${sub.body.id}`);
  await page.waitForSelector('h1 .state-running', { timeout: 10000 });
  await page.waitForFunction(() => [...document.querySelectorAll('dt')].some((dt) => dt.textContent === 'placed on' && dt.nextElementSibling.textContent === 'no GPU'));
  await page.evaluate(() => { location.hash = '#/jobs'; });
  await page.waitForFunction((id) => {
    const row = document.querySelector(`#jobs-table tr[data-job="${id}"]`);
    return row && /no GPU\s*$/.test(row.innerText) && !/GPU \d/.test(row.innerText);
  }, sub.body.id);
  await server.api(USER_TOKEN, 'POST', `/v1/jobs/${sub.body.id}/cancel`);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a bad value gets the API\'s message beside its field, and nothing is submitted', async () => {
  const before = (await server.api(USER_TOKEN, 'GET', '/v1/jobs')).body.jobs.length;
  const page = await openPage(browser, server, USER_TOKEN, '#/jobs');
  await page.fill('#f-command', 'true');
  await page.fill('#f-gpus', '100');
  await page.click('#submit button[type=submit]');
  await page.waitForFunction(() => document.querySelector('#f-gpus-err').textContent !== '');
  assert.match(await page.locator('#f-gpus-err').innerText(), /^resources\.gpus: /);
  assert.equal(await page.locator('#f-gpus').getAttribute('aria-invalid'), 'true');
  await page.fill('#f-gpus', '');
  await page.fill('#f-gpu_memory', 'lots');
  await page.click('#submit button[type=submit]');
  await page.waitForFunction(() => document.querySelector('#f-gpu_memory-err').textContent !== '');
  assert.match(await page.locator('#f-gpu_memory-err').innerText(), /^resources\.gpu_memory: /);
  // One of the more options: the section opens on the field the API names.
  await page.fill('#f-gpu_memory', '');
  // Typed while the section is closed (as a browser's autofill would): the error opens it.
  await page.evaluate(() => { document.querySelector('#f-max_runtime_s').value = '-5'; });
  await page.click('#submit button[type=submit]');
  await page.waitForFunction(() => document.querySelector('#f-max_runtime_s-err').textContent !== '');
  assert.match(await page.locator('#f-max_runtime_s-err').innerText(), /^max_runtime_s: /);
  assert.equal(await page.locator('#submit details').getAttribute('open'), '');
  assert.ok(await page.locator('#f-max_runtime_s').isVisible());
  assert.equal((await server.api(USER_TOKEN, 'GET', '/v1/jobs')).body.jobs.length, before);
  assert.ok(page.url().endsWith('#/jobs'));
  await page.context().close();
});

test('another user sees the job but is offered no cancel, hold or priority; the API refuses them too', async () => {
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs', { command: sh('sleep 60'), resources: { gpus: 1 }, hold: true });
  assert.equal(sub.status, 201);
  const id = sub.body.id;
  const page = await openPage(browser, server, OTHER_TOKEN, `#/jobs/${id}`);
  await page.waitForSelector('h1 .state-held');
  assert.equal(await page.locator('#who').innerText(), OTHER);
  assert.equal(await page.locator('#cancel, #hold, #priority').count(), 0);
  assert.match(await page.locator('.actions').first().innerText(), new RegExp(`${ME}'s job: only its owner or an admin may change it`));
  // What the page does not offer, the API refuses (a page is no access control).
  const refused = await server.api(OTHER_TOKEN, 'POST', `/v1/jobs/${id}/cancel`);
  assert.equal(refused.status, 403);
  assert.match(refused.body.message, new RegExp(`belongs to ${ME}; only its owner or an admin may cancel it`));
  // Its logs are its owner's.
  assert.match(await page.locator('#logs').innerText(), /owner and admins/);
  const job = (await server.api(USER_TOKEN, 'GET', `/v1/jobs/${id}`)).body;
  assert.equal(job.state, 'queued');
  assert.equal(job.priority, 0);
  await page.context().close();

  // Its owner may: the new priority and its event show.
  const own = await openPage(browser, server, USER_TOKEN, `#/jobs/${id}`);
  await own.waitForSelector('#priority');
  await own.fill('#priority', '-5');
  await own.click('#set-priority');
  await own.waitForFunction(() => /priority 0 -> -5 by/.test(document.querySelector('#events').textContent));
  assert.equal((await server.api(USER_TOKEN, 'GET', `/v1/jobs/${id}`)).body.priority, -5);
  // Above the ceiling (0 for users who are not admins): refused, said.
  await own.fill('#priority', '50');
  await own.click('#set-priority');
  await own.waitForFunction(() => /above .*ceiling of 0/.test(document.querySelector('#action-err').textContent));
  assert.deepEqual(own.errors, []);
  await own.context().close();
  await server.api(USER_TOKEN, 'POST', `/v1/jobs/${id}/cancel`);
});

test('a GPU\'s health event turns its tile red within a second', async () => {
  const page = await openPage(browser, server, USER_TOKEN);
  await page.waitForSelector('.tile[data-gpu="5"]');
  await page.waitForSelector('#live.on');
  assert.equal(await page.locator('.tile[data-gpu="5"].unhealthy').count(), 0);
  const res = await server.api(ADMIN_TOKEN, 'POST', '/v1/gpus/5/simulate', { xid: 79 });
  assert.equal(res.status, 202);
  const t0 = Date.now();
  await page.waitForSelector('.tile[data-gpu="5"].unhealthy', { timeout: 1000 });
  const took = Date.now() - t0;
  assert.ok(took <= 1000, `took ${took} ms`);
  assert.match(await page.locator('.tile[data-gpu="5"]').innerText(), /XID 79/);
  // Only an admin may do that.
  assert.equal((await server.api(USER_TOKEN, 'POST', '/v1/gpus/4/simulate', { xid: 79 })).status, 403);
  await page.context().close();
});

test('no token or a wrong one shows the sign-in page, never a stack trace; signing in works', async () => {
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(`${server.url}/`);
  await page.waitForSelector('form[aria-label="Sign in"]');
  await page.fill('#token', 'not-a-token-at-all-0000');
  await page.click('form[aria-label="Sign in"] button');
  await page.waitForSelector('form[aria-label="Sign in"] .alert');
  assert.equal(await page.locator('form[aria-label="Sign in"] .alert').innerText(), 'unknown bearer token');
  await page.fill('#token', USER_TOKEN);
  await page.click('form[aria-label="Sign in"] button');
  await page.waitForSelector('.tile');
  // A token that stops working (here: signed out) goes back to the sign-in page.
  await page.click('#signout');
  await page.waitForSelector('form[aria-label="Sign in"]');
  assert.equal(await page.evaluate(() => sessionStorage.getItem('tessera.token')), null);
  await context.close();
});

test('the page survives the server restarting: it reconnects and shows what changed meanwhile', async () => {
  const page = await openPage(browser, server, USER_TOKEN, '#/jobs');
  await page.waitForSelector('#jobs-table');
  await page.waitForSelector('#live.on');
  await server.stop();
  await page.waitForSelector('#live.off', { timeout: 10000 });
  await server.start();
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs', { name: 'after-restart', command: sh('sleep 30'), resources: { gpus: 1 } });
  await page.waitForSelector('#live.on', { timeout: 15000 });
  await page.waitForSelector(`#jobs-table tr[data-job="${sub.body.id}"]`, { timeout: 10000 });
  assert.match(await page.locator(`#jobs-table tr[data-job="${sub.body.id}"]`).innerText(), /after-restart/);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

// The stream's hello reloads the page's data; samples the stream brings while /v1/history is
// fetched are newer than its answer. The answer is held here until the page has drawn such a
// sample: applying it must not take the charts back to older data.
test('a reload of the page\'s data keeps the samples the stream drew while the history was fetched', async () => {
  let calls = 0;
  let take;
  const held = new Promise((resolve) => { take = resolve; });
  const page = await openPage(browser, server, USER_TOKEN, '#/', (p) => p.route('**/v1/history', async (route) => {
    // The first is the page's start; the second, the stream's hello.
    if (++calls !== 2) return route.continue();
    const response = await route.fetch();
    take({ route, response, body: await response.json() });
  }));
  const { route, response, body } = await held;
  assert.ok(body.samples.length > 0, 'the server has samples');
  const answered = body.samples[body.samples.length - 1].at;
  // Every drawing of the jobs chart from now on, by the newest point it shows.
  await page.evaluate(() => {
    window.drawn = [];
    const note = () => {
      const chart = document.querySelector('#chart-jobs');
      if (chart && chart.dataset.newest) window.drawn.push(Number(chart.dataset.newest));
    };
    note();
    new MutationObserver(note).observe(document.getElementById('main'), { childList: true, subtree: true });
  });
  await page.waitForFunction((t) => Number(document.querySelector('#chart-jobs')?.dataset.newest) > t, answered, { timeout: 10000 });
  assert.equal(await page.evaluate(() => document.body.dataset.reloads), undefined, 'the held reload is not applied yet');
  await route.fulfill({ response });
  await page.waitForSelector('body[data-reloads="1"]');
  const drawn = await page.evaluate(() => window.drawn);
  assert.ok(drawn.some((t) => t > answered), `a sample newer than the answer was drawn: ${drawn}`);
  for (let i = 1; i < drawn.length; i++) {
    assert.ok(drawn[i] >= drawn[i - 1], `the chart went back from ${drawn[i - 1]} to ${drawn[i]} (drawn: ${drawn}; the answer ended at ${answered})`);
  }
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

// Accessibility by axe-core's WCAG 2 A and AA rules (labels, names, contrast, landmarks...): every
// page kind, no violation. (axe is injected past the page's CSP, which would refuse it.)
test('every page passes axe-core\'s WCAG 2 A and AA checks', async () => {
  const axe = createRequire(import.meta.url).resolve('axe-core/axe.min.js');
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs', { name: 'a11y', command: sh('echo out; echo err >&2; sleep 30'), resources: { gpus: 1 } });
  const context = await browser.newContext({ bypassCSP: true, viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  const check = async (what) => {
    await page.addScriptTag({ path: axe });
    const found = await page.evaluate(async () => {
      const r = await window.axe.run(document, { runOnly: ['wcag2a', 'wcag2aa'] });
      return r.violations.map((v) => `${v.id} (${v.impact}): ${v.help}: ${v.nodes.map((n) => n.target.join(' ')).slice(0, 3).join(', ')}`);
    });
    assert.deepEqual(found, [], `${what}:\n${found.join('\n')}`);
  };
  await page.goto(`${server.url}/`);
  await page.waitForSelector('form[aria-label="Sign in"]');
  await check('sign-in page');
  await page.fill('#token', USER_TOKEN);
  await page.click('form[aria-label="Sign in"] button');
  await page.waitForSelector('.tile');
  await page.waitForFunction(() => Number(document.querySelector('#chart-jobs')?.dataset.points) > 0);
  await check('overview');
  await page.evaluate(() => { location.hash = '#/jobs'; });
  await page.waitForSelector('#jobs-table');
  await check('jobs');
  await page.evaluate((id) => { location.hash = `#/jobs/${id}`; }, sub.body.id);
  await page.waitForFunction(() => document.querySelector('#errs') && !document.querySelector('#errs').hidden);
  await check('a job');
  await context.close();
  await server.api(USER_TOKEN, 'POST', `/v1/jobs/${sub.body.id}/cancel`);
});

// At a lab's scale: the counts come from the server (every job), not from a list the page holds;
// the tiles from the running jobs; the filters from every user. Then the server stops: the page
// says so and offers no action until it is back.
test('at 10,000 queued tasks and 8 running jobs the counts, tiles and filters are right; a stopped server is said and disables actions', async () => {
  const big = await new Server().start();
  try {
    const running = [];
    for (let i = 0; i < 8; i++) {
      const r = await big.api(USER_TOKEN, 'POST', '/v1/jobs', { name: `run-${i}`, command: sh('sleep 600'), resources: { gpus: 1 } });
      assert.equal(r.status, 201);
      running.push(r.body.id);
    }
    await big.until(USER_TOKEN, '/v1/summary', (b) => b.jobs.running === 8, 15000);
    const arr = await big.api(USER_TOKEN, 'POST', '/v1/jobs', { name: 'sweep', array: '0-9999', command: sh('true'), resources: { gpus: 1 } });
    assert.equal(arr.status, 201, JSON.stringify(arr.body));
    const theirs = await big.api(OTHER_TOKEN, 'POST', '/v1/jobs', { name: 'theirs', command: sh('true'), resources: { gpus: 2 } });
    assert.equal(theirs.status, 201, JSON.stringify(theirs.body));

    const page = await openPage(browser, big, USER_TOKEN);
    await page.waitForSelector('#count-queued');
    assert.match(await page.locator('#count-running').innerText(), /^8\b/);
    assert.match(await page.locator('#count-queued').innerText(), /^10,001\b/);
    // The chart says the same count the same way (it said 10001 beside the summary's 10,001).
    await page.waitForFunction(() => /queued: 10,001;/.test(document.querySelector('#chart-jobs svg')?.getAttribute('aria-label') || ''), null, { timeout: 10000 });
    const axis = await page.$$eval('#chart-jobs text', (ts) => ts.map((t) => t.textContent));
    assert.ok(axis.some((t) => /^\d{1,3}(,\d{3})+$/.test(t)), `the axis groups thousands: ${axis}`);
    for (let g = 0; g < 8; g++) {
      const links = await page.locator(`.tile[data-gpu="${g}"] li a`).allInnerTexts();
      assert.equal(links.length, 1, `GPU ${g}: ${links}`);
      assert.match(links[0], /run-\d/);
    }
    await page.evaluate(() => { location.hash = '#/jobs'; });
    await page.waitForSelector('body[data-route="#/jobs"]');
    const users = await page.locator('#flt-user option').allInnerTexts();
    assert.ok(users.includes(ME) && users.includes(OTHER), users.join(', '));
    // The array is one row, its tasks counted; the caption says how many jobs there are in all.
    assert.match(await page.locator(`#jobs-table tr[data-job="${arr.body.id}"]`).innerText(), /array 0-9999: 10,000 tasks \(10,000 queued\)/);
    assert.match(await page.locator('#jobs-table caption').innerText(), /of 10,009 jobs/);
    await page.selectOption('#flt-state', 'running');
    await page.waitForFunction(() => document.querySelectorAll('#jobs-table tbody tr').length === 8);
    await page.selectOption('#flt-state', '');
    await page.selectOption('#flt-user', OTHER);
    await page.waitForFunction(() => document.querySelectorAll('#jobs-table tbody tr').length === 1);
    assert.match(await page.locator('#jobs-table tbody tr').innerText(), /theirs/);

    // The server stops: said, and the submit form and filters are off; back, they are on again.
    await page.waitForSelector('#live.on');
    await big.stop();
    await page.waitForSelector('#offline:not([hidden])', { timeout: 10000 });
    assert.match(await page.locator('#offline').innerText(), /does not answer: what is shown is as of .*actions are off/);
    assert.equal(await page.locator('#submit button[type=submit]').isDisabled(), true);
    assert.equal(await page.locator('#flt-state').isDisabled(), true);
    await big.start();
    await page.waitForFunction(() => document.querySelector('#offline').hidden, null, { timeout: 15000 });
    assert.equal(await page.locator('#submit button[type=submit]').isDisabled(), false);
    assert.deepEqual(page.errors, []);
    await page.context().close();
  } finally {
    if (big.proc) {
      for (const j of (await big.api(ADMIN_TOKEN, 'GET', '/v1/jobs?state=queued,running&arrays=fold')).body.jobs || [])
        await big.api(ADMIN_TOKEN, 'POST', `/v1/jobs/${j.id}/cancel`);
    }
    await big.remove();
  }
});

// A phone: at 390 px no page is wider than the screen (tables scroll in their own box).
test('at 390 px wide no page overflows the screen', async () => {
  const sub = await server.api(USER_TOKEN, 'POST', '/v1/jobs', { name: 'narrow', command: sh('echo a-rather-long-line-of-output; sleep 30'), resources: { gpus: 1 } });
  assert.equal(sub.status, 201);
  const context = await browser.newContext({ viewport: { width: 390, height: 844 } });
  const page = await context.newPage();
  await page.goto(`${server.url}/#token=${USER_TOKEN}`);
  for (const route of ['#/', '#/jobs', `#/jobs/${sub.body.id}`]) {
    await page.evaluate((r) => { location.hash = r; }, route);
    await page.waitForSelector(`body[data-route="${route}"]`);
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(width <= 390, `${route}: the page is ${width} px wide`);
    if (route === '#/jobs') {
      // Every job's reason (or where it runs) on screen, not behind a sideways scroll, in a block
      // a thumb's scroll can pass (a table row there was 234 px tall with its reason hidden).
      await page.waitForSelector(`#jobs-table tr[data-job="${sub.body.id}"]`);
      const row = await page.evaluate((id) => {
        const tr = document.querySelector(`#jobs-table tr[data-job="${id}"]`);
        const last = tr.lastElementChild.getBoundingClientRect();
        return { height: tr.getBoundingClientRect().height, right: last.right, width: last.width, text: tr.lastElementChild.textContent };
      }, sub.body.id);
      assert.ok(row.right <= 390 && row.width > 0, `the reason cell ends at ${row.right} px: ${JSON.stringify(row)}`);
      assert.ok(row.height <= 120, `a job's row is ${row.height} px tall`);
      assert.match(row.text, /GPU \d|waits|queued|reserved|behind|no GPU/);
    }
    if (route === '#/') {
      // The topology stays readable (its smallest text at least 8 px), scrolling in its own box.
      const topo = await page.evaluate(() => {
        const svg = document.querySelector('.topology svg');
        const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
        const sizes = [...svg.querySelectorAll('text')].map((t) => Number(t.getAttribute('font-size') || 12) * scale);
        const box = svg.parentElement;
        return { smallest: Math.min(...sizes), box: box.getBoundingClientRect().right, scrolls: box.scrollWidth > box.clientWidth };
      });
      assert.ok(topo.smallest >= 8, `the topology's smallest text is ${topo.smallest.toFixed(1)} px`);
      assert.ok(topo.box <= 390 && topo.scrolls, JSON.stringify(topo));
    }
  }
  await context.close();
  await server.api(USER_TOKEN, 'POST', `/v1/jobs/${sub.body.id}/cancel`);
});
