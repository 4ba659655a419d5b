// Does an open dashboard grow? A server sampling every 50 ms with a 60 s window (what a day at the
// default 5 s would be, 72 times faster) while jobs come and go twice a second; the overview open the
// whole time in Debian's chromium. Prints, every 30 s, the page's JS heap after a garbage collection
// and the points its jobs chart draws (bounded by the window: 2 series x 1,200 samples).
//   TESSERA_BIN=build/test/tessera node bench/dashboard_soak.mjs [SECONDS]
import { ADMIN_TOKEN, Server, USER_TOKEN, launchBrowser, openPage } from '../web/test/harness.mjs';

const seconds = Number(process.argv[2] || 150);
const server = await new Server({ extra: 'history: {interval_s: 0.05, window_s: 60}\n' }).start();
const browser = await launchBrowser();
let stop = false;
try {
  const page = await openPage(browser, server, USER_TOKEN);
  await page.waitForSelector('.tile');
  const cdp = await page.context().newCDPSession(page);
  (async () => {
    while (!stop) {
      const j = await server.api(USER_TOKEN, 'POST', '/v1/jobs', { command: ['sh', '-c', 'sleep 0.3'], resources: { gpus: 1 } });
      if (j.status !== 201) break;
      await new Promise((r) => setTimeout(r, 500));
    }
  })();
  const t0 = Date.now();
  for (let t = 30; t <= seconds; t += 30) {
    await new Promise((r) => setTimeout(r, t0 + t * 1000 - Date.now()));
    await cdp.send('HeapProfiler.collectGarbage');
    const { usedSize } = await cdp.send('Runtime.getHeapUsage');
    const points = await page.evaluate(() => Number(document.querySelector('#chart-jobs').dataset.points));
    const jobs = (await server.api(USER_TOKEN, 'GET', '/v1/jobs')).body.jobs.length;
    console.log(`${t} s: heap ${(usedSize / 2 ** 20).toFixed(1)} MiB, jobs chart ${points} points, ${jobs} jobs stored, page errors ${page.errors.length}`);
  }
} finally {
  stop = true;
  await browser.close();
  for (const j of (await server.api(ADMIN_TOKEN, 'GET', '/v1/jobs?state=queued,running')).body.jobs || []) {
    await server.api(ADMIN_TOKEN, 'POST', `/v1/jobs/${j.id}/cancel`);
  }
  await server.remove();
}
