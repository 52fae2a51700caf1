// Generates `api.d.ts` from an OpenAPI document into a folder, copies program.ts beside it and
// type-checks it with `tsc --noEmit --strict`. Usage: node check.mjs <openapi.json> <folder>
import { copyFileSync, readFileSync, writeFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { join } from "node:path";
import openapiTS, { astToString } from "openapi-typescript";

const [specPath, folder] = process.argv.slice(2);
const spec = JSON.parse(readFileSync(specPath, "utf8"));
const generated = astToString(await openapiTS(spec));
writeFileSync(join(folder, "api.d.ts"), generated);
copyFileSync(new URL("./program.ts", import.meta.url), join(folder, "program.ts"));
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
try {
  execFileSync(
    process.execPath,
    [tsc, "--noEmit", "--strict", "--target", "es2022", "--module", "es2022", "--moduleResolution", "bundler", join(folder, "program.ts")],
    { encoding: "utf8", stdio: "pipe" },
  );
  console.log(JSON.stringify({ ok: true }));
} catch (error) {
  console.log(JSON.stringify({ ok: false, output: `${error.stdout}${error.stderr}` }));
  process.exitCode = 1;
}
