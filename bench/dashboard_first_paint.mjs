// The dashboard's first paint (issue 19: under 1 s for 8 GPUs and 500 jobs; issue 34: and with
// 10,000 queued array tasks more): a server on a simulated DGX H100 with 500 jobs (8 running, 92
// ended, 400 queued), then a 10,000-task array, the overview and the jobs page loaded
// afresh ROUNDS times in Debian's chromium (headless). Prints first contentful paint, the time until
// every GPU tile is there, and the time until the 500-row job table is, as median and worst.
//   TESSERA_BIN=build/test/tessera node bench/dashboard_first_paint.mjs [ROUNDS]
import { ADMIN_TOKEN, Server, USER_TOKEN, launchBrowser } from '../web/test/harness.mjs';

const rounds = Number(process.argv[2] || 10);
const server = await new Server().start();
const browser = await launchBrowser();
const stat = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return `median ${s[Math.floor(s.length / 2)].toFixed(0)} ms, worst ${s[s.length - 1].toFixed(0)} ms`;
};
try {
  const sh = (c) => ['sh', '-c', c];
  const t0 = Date.now();
  for (let i = 0; i < 8; i++) await server.api(USER_TOKEN, 'POST', '/v1/jobs', { name: `run-${i}`, command: sh('sleep 600'), resources: { gpus: 1 } });
  await server.until(USER_TOKEN, '/v1/jobs?state=running', (b) => b.jobs.length === 8);
  const batch = async (n, spec) => {
    for (let i = 0; i < n; i += 20) {
      await Promise.all(Array.from({ length: Math.min(20, n - i) }, () => server.api(USER_TOKEN, 'POST', '/v1/jobs', spec)));
    }
  };
  await batch(92, { name: 'done', command: sh('true') });
  await batch(400, { name: 'waiting', command: sh('sleep 600'), resources: { gpus: 1 } });
  await server.until(USER_TOKEN, '/v1/jobs?state=succeeded', (b) => b.jobs.length === 92);
  const jobs = await fetch(`${server.url}/v1/jobs?limit=2000`, { headers: { Authorization: `Bearer ${USER_TOKEN}` } });
  const jobsBytes = (await jobs.text()).length;
  console.log(`500 jobs submitted in ${((Date.now() - t0) / 1000).toFixed(1)} s; /v1/jobs is ${(jobsBytes / 1024).toFixed(0)} KiB`);
  const measure = async (label) => {
    const fcp = [], tiles = [], table = [];
    for (let r = 0; r < rounds; r++) {
      for (const [path, out] of [['#/', tiles], ['#/jobs', table]]) {
        const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
        const page = await context.newPage();
        await page.goto(`${server.url}/#token=${USER_TOKEN}`);
        if (path === '#/jobs') {
          await page.waitForSelector('.tile');
          const start = await page.evaluate(() => { location.hash = '#/jobs'; return performance.now(); });
          await page.waitForSelector('#jobs-table tbody tr:nth-child(500)');
          out.push((await page.evaluate(() => performance.now())) - start);
        } else {
          await page.waitForSelector('.tile:nth-child(8)');
          out.push(await page.evaluate(() => performance.now()));
          fcp.push(await page.evaluate(() => performance.getEntriesByName('first-contentful-paint')[0].startTime));
        }
        await context.close();
      }
    }
    console.log(`${label}: first contentful paint: ${stat(fcp)}`);
    console.log(`${label}: overview with every GPU tile (from navigation): ${stat(tiles)}`);
    console.log(`${label}: jobs page with 500 rows (from the click): ${stat(table)}`);
  };
  await measure('500 jobs');
  // A lab's sweep on top: 10,000 queued array tasks (the page shows counts of all, a page of rows).
  await server.api(USER_TOKEN, 'POST', '/v1/jobs', { name: 'sweep', array: '0-9999', command: sh('true'), resources: { gpus: 1 } });
  await server.until(USER_TOKEN, '/v1/summary', (b) => b.jobs.queued >= 10400);
  await measure('10,500 jobs');
} finally {
  await browser.close();
  for (const j of (await server.api(ADMIN_TOKEN, 'GET', '/v1/jobs?state=queued,running&arrays=fold')).body.jobs || []) {
    await server.api(ADMIN_TOKEN, 'POST', `/v1/jobs/${j.id}/cancel`);
  }
  await server.remove();
}
