// Bundles page/<entry> (React, @ai-sdk/react, ai) with esbuild into <out dir>/chat.js, beside page/index.html.
// Usage: node build_page.mjs <out dir> [package folder] [entry]. With a package folder (an
// npm project such as ../aisdk6), the page's own imports come from that folder's packages
// instead of this one's, so one page is tested against several versions of the AI SDK.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';

const [out, packages, entry = 'chat.jsx'] = process.argv.slice(2);
const page = path.resolve('page');

/** Resolves the bare imports of the page's files from `folder` (their dependencies resolve as usual). */
const packagesFrom = folder => ({
  name: 'packages-from',
  setup(bundle) {
    bundle.onResolve({ filter: /^[^./]/ }, async args => {
      if (args.pluginData?.redirected || !args.importer.startsWith(page + path.sep)) return undefined;
      return bundle.resolve(args.path, { kind: args.kind, resolveDir: folder, pluginData: { redirected: true } });
    });
  },
});

mkdirSync(out, { recursive: true });
await build({
  entryPoints: [`page/${entry}`],
  bundle: true,
  outfile: `${out}/chat.js`,
  format: 'iife',
  jsx: 'automatic',
  minify: true,
  define: { 'process.env.NODE_ENV': '"production"' },
  logLevel: 'error',
  plugins: packages ? [packagesFrom(path.resolve(packages))] : [],
});
copyFileSync('page/index.html', `${out}/index.html`);
console.log(JSON.stringify({ built: out, packages: packages ?? null }));
