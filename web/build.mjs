// Builds the dashboard into the folder named by the first argument (CMake embeds what is there):
// app.js bundled and minified by esbuild, app.css minified, index.html as it is. Without esbuild
// (web/ has no node_modules: `npm ci` in web/, which scripts/run and scripts/test do), the sources
// as they are: the browser loads the modules itself.
import { copyFileSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = process.argv[2];
if (!out) {
  console.error('usage: node web/build.mjs OUT_DIR');
  process.exit(2);
}
const src = join(here, 'src');
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
let esbuild = null;
try {
  esbuild = await import('esbuild');
} catch {
  console.warn('web: esbuild is not installed (npm ci in web/): embedding the unbundled sources');
}
if (esbuild) {
  await esbuild.build({
    entryPoints: [join(src, 'app.js'), join(src, 'app.css')],
    bundle: true,
    minify: true,
    format: 'esm',
    target: ['chrome110', 'firefox110', 'safari16'],
    outdir: out,
    legalComments: 'none',
    logLevel: 'warning',
  });
  for (const f of readdirSync(src)) {
    if (f === 'index.html' || f.endsWith('.svg')) copyFileSync(join(src, f), join(out, f));
  }
} else {
  for (const f of readdirSync(src)) copyFileSync(join(src, f), join(out, f));
}
