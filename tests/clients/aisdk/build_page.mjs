// Bundles page/chat.jsx (React, @ai-sdk/react, ai) with esbuild into <out dir>/chat.js, beside page/index.html.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';

const out = process.argv[2];
mkdirSync(out, { recursive: true });
await build({
  entryPoints: ['page/chat.jsx'],
  bundle: true,
  outfile: `${out}/chat.js`,
  format: 'iife',
  jsx: 'automatic',
  minify: true,
  define: { 'process.env.NODE_ENV': '"production"' },
  logLevel: 'error',
});
copyFileSync('page/index.html', `${out}/index.html`);
console.log(JSON.stringify({ built: out }));
