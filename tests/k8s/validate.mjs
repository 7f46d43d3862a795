// validate.mjs - validate Kubernetes manifests without a cluster.
//
//   node validate.mjs [--require-gpu] FILE...   schema + policy; the files are
//                                                one bundle (references are
//                                                followed between them), with
//                                                the objects of --with FILE
//                                                that no FILE replaces
//   node validate.mjs --rejected FILE...        each file must be refused, with
//                                                the text of its "# expect:" line
//                                                in one of the errors; the other
//                                                objects of the bundle come from
//                                                --with FILE (repeatable)
//
// An object replaces one of the same kind and name from an earlier --with
// file (FILEs come last): deploy/tls/ overlays deploy/ that way.
// Prints one line per file and a closing "validate: N passed, N failed".
// Exit status 1 when anything failed. Schemas: schema.mjs; rules: policy.mjs.
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";
import { validateObject } from "./schema.mjs";
import { checkPolicy } from "./policy.mjs";

/** The objects of a YAML file; a YAML error (a duplicate key too) throws. */
export function loadObjects(file) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"), { uniqueKeys: true });
  const out = [];
  for (const d of docs) {
    if (d.errors.length) throw new Error(`${file}: ${d.errors[0].message}`);
    const o = d.toJS();
    if (o !== null && o !== undefined) out.push(o);
  }
  return out;
}

const key = (o) => `${o.kind}/${o.metadata?.name}`;

/** LISTS (arrays of objects, one per file) as one bundle, later files replacing earlier ones' objects. */
function overlay(lists) {
  const out = [];
  for (const l of lists) {
    const names = new Set(l.map(key));
    const kept = out.filter((o) => !names.has(key(o)));
    out.length = 0;
    out.push(...kept, ...l);
  }
  return out;
}

async function errorsOf(objs, opts) {
  const errors = [];
  for (const o of objs)
    for (const e of await validateObject(o)) errors.push(`${o.kind} ${o.metadata?.name}: ${e}`);
  return errors.concat(checkPolicy(objs, opts));
}

async function main(argv) {
  const opts = { requireGpu: false };
  const files = [];
  const withFiles = [];
  let rejected = false;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--require-gpu") opts.requireGpu = true;
    else if (argv[i] === "--rejected") rejected = true;
    else if (argv[i] === "--with") withFiles.push(argv[++i]);
    else files.push(argv[i]);
  }
  let passed = 0;
  let failed = 0;
  if (!rejected) {
    const lists = [];
    for (const f of [...withFiles, ...files]) {
      try {
        lists.push(loadObjects(f).map((o) => Object.defineProperty(o, "__file", { value: f })));
      } catch (e) {
        console.log(`validate: FAIL ${f}: ${e.message}`);
        failed++;
      }
    }
    const objs = overlay(lists);
    const errors = await errorsOf(objs, opts);
    for (const e of errors) console.log(`validate: FAIL ${e}`);
    if (errors.length) failed++;
    else passed++;
    console.log(`validate: ${objs.length} objects from ${files.length} files` +
      (errors.length ? `: ${errors.length} errors` : ": valid"));
  } else {
    const base = overlay(withFiles.map((f) => loadObjects(f)));
    for (const f of files) {
      const text = readFileSync(f, "utf8");
      const want = text.match(/^# expect: (.*)$/m)?.[1]?.trim();
      if (!want) {
        console.log(`validate: FAIL ${basename(f)}: no "# expect:" line`);
        failed++;
        continue;
      }
      let errors;
      try {
        const mine = loadObjects(f);
        errors = await errorsOf(overlay([base, mine]), opts);
      } catch (e) {
        errors = [e.message];
      }
      const hit = errors.find((e) => e.includes(want));
      if (hit) {
        console.log(`validate: ok   ${basename(f)} refused: ${hit}`);
        passed++;
      } else {
        console.log(`validate: FAIL ${basename(f)} was not refused with "${want}"` +
          (errors.length ? `; errors: ${errors.join(" | ")}` : " (no error at all)"));
        failed++;
      }
    }
  }
  console.log(`validate: ${passed} passed, ${failed} failed`);
  return failed ? 1 : 0;
}

if (process.argv[1] === fileURLToPath(import.meta.url))
  process.exitCode = await main(process.argv.slice(2));
