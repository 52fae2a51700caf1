// Bundles use_stream_page.jsx with esbuild into dist/ (dist/index.html loads dist/page.js).
import { build } from "esbuild";
import { writeFile } from "node:fs/promises";

await build({
  entryPoints: ["use_stream_page.jsx"],
  bundle: true,
  outfile: "dist/page.js",
  format: "iife",
  jsx: "automatic",
  define: { "process.env.NODE_ENV": '"production"' },
  logLevel: "error",
});
await writeFile(
  "dist/index.html",
  '<!doctype html><html><head><meta charset="utf-8"><title>useStream</title>' +
    "<style>body{font-family:sans-serif;margin:2em}li{margin:.3em 0}.ai{color:#024}" +
    "form,section{border:1px solid #ccc;padding:1em;margin:1em 0}label{display:block;margin:.5em 0}</style>" +
    '</head><body><div id="root"></div><script src="page.js"></script></body></html>\n',
);
console.log(JSON.stringify({ built: "dist/index.html" }));
