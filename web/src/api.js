// The server's API as the page speaks it: the bearer token (kept for this tab only), JSON calls
// whose errors carry the API's own message, and the event stream (/v1/stream, server-sent events
// read through fetch so that the token goes in a header, never in a URL).

const TOKEN_KEY = 'tessera.token';

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

export function setToken(t) {
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// A token handed over in the address ("#token=..."), as `scripts/run` prints it: kept, and taken
// out of the address bar and the history at once.
export function takeTokenFromAddress() {
  const m = location.hash.match(/^#token=([^&]+)/);
  if (!m) return;
  setToken(decodeURIComponent(m[1]));
  history.replaceState(null, '', location.pathname + '#/');
}

export async function call(method, path, body) {
  const headers = { Authorization: `Bearer ${token()}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, `the server cannot be reached (${e.message})`);
  }
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!res.ok) {
    const message = (data && data.message) || text || res.statusText;
    throw new ApiError(res.status, message);
  }
  return data;
}

// Reads the event stream and hands each event to `on(type, data, id)`. Reconnects after a break
// (the server restarting, say) with the last job event's id, backing off up to 10 s; `status(s)`
// hears 'live', 'reconnecting' or 'signed-out'. Returns a function that stops it.
export function openStream(on, status) {
  let stopped = false;
  let lastId = '';
  let controller = null;
  let delay = 500;
  async function once() {
    controller = new AbortController();
    const headers = { Authorization: `Bearer ${token()}` };
    if (lastId) headers['Last-Event-ID'] = lastId;
    const res = await fetch('/v1/stream', { headers, signal: controller.signal, cache: 'no-store' });
    if (res.status === 401) {
      status('signed-out');
      stopped = true;
      return;
    }
    if (!res.ok || !res.body) throw new Error(`stream: HTTP ${res.status}`);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let type = 'message';
        let id = '';
        const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          const v = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (field === 'event') type = v;
          else if (field === 'data') data.push(v);
          else if (field === 'id') id = v;
        }
        if (id) lastId = id;
        if (!data.length) continue;
        delay = 500;
        if (type === 'hello') status('live');
        let parsed;
        try {
          parsed = JSON.parse(data.join('\n'));
        } catch {
          continue;
        }
        on(type, parsed, id);
      }
    }
  }
  (async () => {
    while (!stopped) {
      try {
        await once();
      } catch (e) {
        if (stopped) return;
      }
      if (stopped) return;
      status('reconnecting');
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 10000);
    }
  })();
  return () => {
    stopped = true;
    if (controller) controller.abort();
  };
}
