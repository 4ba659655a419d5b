// Regenerates docs/img/dashboard-overview.png and docs/img/dashboard-job.png: a server on a
// simulated DGX H100 with a few demo jobs, photographed in Debian's chromium.
// Run by scripts/dashboard-screenshots (which builds tessera first); TESSERA_BIN names the binary.
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ADMIN_TOKEN, ME, Server, USER_TOKEN, launchBrowser, openPage } from './test/harness.mjs';

const docs = join(dirname(fileURLToPath(import.meta.url)), '..', 'docs', 'img');
const server = new Server({ extra: `quotas:\n  ${ME}: {gpus: 6, gpu_share: 7, gpu_memory: 600GiB}\n` });
await server.start();
const browser = await launchBrowser();
try {
  const submit = (spec) => server.api(USER_TOKEN, 'POST', '/v1/jobs', spec);
  const sh = (cmd) => ['sh', '-c', cmd];
  await submit({ name: 'llm-pretrain', command: sh('echo "step 1 loss 2.31"; echo "step 2 loss 2.12"; sleep 600'), resources: { gpus: 4, topology: 'require' } });
  await submit({ name: 'finetune', command: sh('echo "epoch 1"; sleep 600'), resources: { gpus: 2 } });
  await submit({ name: 'notebook-a', command: sh('sleep 600'), resources: { gpu_share: '30%', gpu_memory: '20GiB' } });
  await submit({ name: 'notebook-b', command: sh('sleep 600'), resources: { gpu_share: '50%', gpu_memory: '30GiB' } });
  const big = await submit({ name: 'sweep', command: sh('sleep 600'), resources: { gpus: 4 } });
  await server.api(ADMIN_TOKEN, 'POST', '/v1/gpus/7/simulate', { xid: 79 });
  // Some history to draw.
  await new Promise((r) => setTimeout(r, 6000));
  const page = await openPage(browser, server, USER_TOKEN);
  await page.waitForSelector('.tile');
  await page.waitForTimeout(1500);
  await page.screenshot({ path: join(docs, 'dashboard-overview.png'), fullPage: true });
  await page.evaluate((id) => { location.hash = `#/jobs/${id}`; }, big.body.id);
  await page.waitForSelector('#events tbody tr');
  await page.screenshot({ path: join(docs, 'dashboard-job.png'), fullPage: true });
  console.log(`wrote ${join(docs, 'dashboard-overview.png')} and dashboard-job.png`);
} finally {
  await browser.close();
  for (const j of (await server.api(ADMIN_TOKEN, 'GET', '/v1/jobs?state=queued,running')).body.jobs) {
    await server.api(ADMIN_TOKEN, 'POST', `/v1/jobs/${j.id}/cancel`);
  }
  await server.remove();
}
