// What the browser tests and the screenshot script share: a `tessera server` on a simulated
// machine with a TCP listener and tokens (in a temporary folder, removed by stop()), the API as a
// client of its own, and Debian's chromium driven by playwright-core (never a downloaded browser).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

export const ME = userInfo().username;
export const OTHER = 'nobody'; // another local account: its token may look, not touch ME's jobs
export const ADMIN_TOKEN = 'admin-token-0123456789';
export const USER_TOKEN = 'user-token-0123456789';
export const OTHER_TOKEN = 'other-token-0123456789';

function binary() {
  const b = process.env.TESSERA_BIN;
  if (!b) throw new Error('TESSERA_BIN: set it to the tessera binary (ctest does)');
  return b;
}

export class Server {
  constructor({ simulate = 'dgx-h100', extra = '' } = {}) {
    // Named as tests/test_main.cc names its folders: one left by a killed run (a ctest timeout) is
    // swept by the next test binary that starts.
    this.dir = mkdtempSync(join(tmpdir(), `tessera-tests-${process.pid}-`));
    this.simulate = simulate;
    this.extra = extra;
    this.port = 0;
    this.proc = null;
    this.log = '';
  }

  writeConfig() {
    // ME is an admin through its own token only when it is root: the admin token is root's.
    const root = process.getuid() === 0;
    writeFileSync(join(this.dir, 'server.yaml'), `tcp:
  listen: 127.0.0.1:${this.port}
  tokens:
    - {token: ${ADMIN_TOKEN}, user: root, admin: true}
    - {token: ${USER_TOKEN}, user: ${ME}, admin: false}
    - {token: ${OTHER_TOKEN}, user: ${OTHER}, admin: false}
allow_root_jobs: ${root}
${this.extra.includes('history:') ? '' : 'history: {interval_s: 0.5}\n'}confinement: {mode: off}
containers: {podman: ""}
preemption: {grace_period_s: 1}
${this.extra}`);
  }

  // Starts it (on the port it had before, when restarted) and waits until it listens.
  async start() {
    this.writeConfig();
    this.log = '';
    const args = ['server', '--socket', join(this.dir, 's.sock'), '--state-dir', join(this.dir, 'state'),
      '--simulate', this.simulate, '-c', join(this.dir, 'server.yaml')];
    this.proc = spawn(binary(), args, { stdio: ['ignore', 'pipe', 'pipe'] });
    // Its end: an exit, or a spawn that failed (no binary, not executable: then no exit comes).
    const exited = new Promise((resolve) => {
      this.proc.once('exit', (code) => resolve(code));
      this.proc.once('error', (e) => resolve(e.message));
    });
    this.exited = exited;
    let port;
    try {
      port = await this.listening(exited);
    } catch (e) {
      // Not listening: no process left behind, and - when it never started, so no caller holds it
      // to remove() - not its folder either.
      if (this.proc.exitCode === null) this.proc.kill('SIGKILL');
      await exited;
      this.proc = null;
      if (!this.url) rmSync(this.dir, { recursive: true, force: true });
      throw e;
    }
    this.port = port;
    this.url = `http://127.0.0.1:${port}`;
    return this;
  }

  // The port the server says it listens on, from its log (or why it did not start).
  listening(exited) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`server did not start:\n${this.log}`)), 15000);
      const take = (chunk) => {
        this.log += chunk;
        const m = this.log.match(/tcp port (\d+)/);
        if (m) {
          clearTimeout(timer);
          resolve(Number(m[1]));
        }
      };
      this.proc.stdout.on('data', take);
      this.proc.stderr.on('data', take);
      exited.then((code) => {
        clearTimeout(timer);
        reject(new Error(`server exited (${code}):\n${this.log}`));
      });
    });
  }

  async stop() {
    if (!this.proc) return;
    this.proc.kill('SIGTERM');
    await this.exited;
    this.proc = null;
  }

  async remove() {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }

  // One API call with a token; resolves to {status, body}.
  async api(token, method, path, body) {
    const res = await fetch(this.url + path, {
      method,
      headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let parsed = text;
    try {
      parsed = JSON.parse(text);
    } catch { /* not JSON */ }
    return { status: res.status, body: parsed };
  }

  // Polls the API until `pred(body)` holds (or the deadline passes: throws with what it saw).
  async until(token, path, pred, ms = 10000) {
    const end = Date.now() + ms;
    let last;
    while (Date.now() < end) {
      last = await this.api(token, 'GET', path);
      if (last.status === 200 && pred(last.body)) return last.body;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`${path}: condition not met in ${ms} ms; last: ${JSON.stringify(last && last.body).slice(0, 500)}`);
  }
}

export async function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    // As root (CI) chromium's sandbox cannot start; the pages are our own.
    args: process.getuid() === 0 ? ['--no-sandbox'] : [],
  });
}

// A page signed in with `token` (handed over in the address, as scripts/run prints it), failing the
// test on any error the page logs (a script error, a CSP refusal). `prepare(page)`, if given, runs
// before the page is loaded (to route its requests).
export async function openPage(browser, server, token, path = '#/', prepare = null) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(String(e)));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) page.errors.push(m.text());
  });
  if (prepare) await prepare(page);
  await page.goto(`${server.url}/#token=${token}`);
  // Signed in and shown: the page says which route it shows once it has its data.
  await page.waitForSelector('body[data-route="#/"]');
  if (path !== '#/') {
    await page.evaluate((p) => { location.hash = p; }, path);
    await page.waitForSelector(`body[data-route="${path}"]`);
  }
  return page;
}
