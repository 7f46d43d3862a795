// dockerfiles.mjs - what the Dockerfiles name must exist, without Docker.
//
//   node dockerfiles.mjs ROOT DESTDIR Dockerfile...
//
// DESTDIR holds what `make DESTDIR=... install` (the target the build stage
// runs) produced here. For each Dockerfile:
// - every base image resolves (through ARG defaults) to a pinned tag;
// - every COPY source of the build context exists and is not excluded by
//   .dockerignore; every `COPY --from=build` source is a file that the
//   make target produced (its /out prefix mapped to DESTDIR), executable;
// - the build stage runs `make ... install` with DESTDIR=/out;
// - ENTRYPOINT and CMD are exec form (no shell at run time), the
//   ENTRYPOINT binary is copied into the image and answers --help;
// - USER is numeric, not root, and the user the runtime stage creates; the
//   WORKDIR is created for it; the Kubernetes manifests run as that uid;
// - the OCI labels title, version and revision are set.
// Prints "dockerfiles: N passed, N failed" and exits 1 on any failure.
import { readFileSync, existsSync, statSync, readdirSync } from "node:fs";
import { join, basename } from "node:path";
import { execFileSync } from "node:child_process";
import { DockerfileParser } from "dockerfile-ast";

const [root, destdir, ...files] = process.argv.slice(2);
let passed = 0;
let failed = 0;
function check(ok, what) {
  if (ok) passed++;
  else failed++;
  console.log(`dockerfiles: ${ok ? "ok  " : "FAIL"} ${what}`);
}

const ignored = readFileSync(join(root, ".dockerignore"), "utf8").split("\n")
  .map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));

function uidsInManifests() {
  const uids = new Set();
  const walk = (d) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.ya?ml$/.test(e.name))
        for (const m of readFileSync(p, "utf8").matchAll(/runAsUser: (\d+)/g)) uids.add(m[1]);
    }
  };
  walk(join(root, "deploy"));
  walk(join(root, "charts"));
  return uids;
}

for (const file of files) {
  const name = basename(file);
  const df = DockerfileParser.parse(readFileSync(join(root, file), "utf8"));
  const args = {};
  const stages = [];
  let stage = null;
  for (const ins of df.getInstructions()) {
    const kw = ins.getKeyword();
    const words = ins.getArguments().map((a) => a.getValue());
    if (kw === "ARG" && !stage) {
      const [k, v] = words[0].split("=");
      args[k] = v;
    }
    if (kw === "FROM") {
      stage = { name: words[2] ?? null, from: words[0], ins: [] };
      stages.push(stage);
      continue;
    }
    if (stage) stage.ins.push({ kw, words, text: ins.getArgumentsContent() ?? "", raw: ins.getTextContent() });
  }
  const stageNames = new Set(stages.map((s) => s.name));
  for (const s of stages) {
    if (stageNames.has(s.from)) continue;
    const ref = s.from.replace(/\$\{(\w+)\}/g, (_, k) => args[k] ?? "");
    const tag = ref.includes(":") ? ref.split(":").pop() : "";
    check(tag && tag !== "latest" && !ref.includes("${"),
      `${name}: base image of stage ${s.name} is pinned (${ref})`);
  }
  const build = stages.find((s) => s.name === "build");
  const make = build?.ins.find((i) => i.kw === "RUN" && /\bmake\b/.test(i.text));
  check(make && /\binstall\b/.test(make.text) && /DESTDIR=\/out\b/.test(make.text) &&
    /DEPS=build\b/.test(make.text), `${name}: the build stage runs make DEPS=build DESTDIR=/out ... install`);
  for (const i of build?.ins ?? []) {
    if (i.kw !== "COPY" || /--from=/.test(i.raw)) continue;
    for (const src of i.words.slice(0, -1).filter((w) => !w.startsWith("--"))) {
      const top = src.replace(/^\.\//, "").split("/")[0];
      check(existsSync(join(root, src)) && !ignored.includes(top),
        `${name}: COPY source '${src}' exists and is in the build context`);
    }
  }
  const runtime = stages.find((s) => s.name === "runtime");
  const copied = new Set();
  for (const s of stages)
    for (const i of s.ins) {
      if (i.kw !== "COPY" || !/--from=build\b/.test(i.raw)) continue;
      const paths = i.words.filter((w) => !w.startsWith("--"));
      const dest = paths.pop();
      for (const src of paths) {
        const here = join(destdir, src.replace(/^\/out\//, ""));
        let ok = src.startsWith("/out/") && existsSync(here);
        ok = ok && (statSync(here).mode & 0o111) !== 0;
        check(ok, `${name}: ${src} is made by 'make install' (${here})`);
        copied.add(dest.endsWith("/") ? `${dest}${basename(src)}` : dest);
      }
    }
  for (const s of stages.filter((x) => x.name === "agent" || x.name === "controller")) {
    const ep = s.ins.find((i) => i.kw === "ENTRYPOINT");
    let argv = null;
    try {
      argv = JSON.parse(ep.text);
    } catch { /* shell form */ }
    check(Array.isArray(argv), `${name}: ENTRYPOINT of ${s.name} is exec form`);
    if (!Array.isArray(argv)) continue;
    check(copied.has(argv[0]) && basename(argv[0]) === `meshrun-${s.name}`,
      `${name}: ENTRYPOINT ${argv[0]} is meshrun-${s.name}, copied into the image`);
    let help = false;
    try {
      execFileSync(join(destdir, argv[0].replace(/^\/usr\/local\//, "usr/local/")), ["--help"],
        { stdio: "pipe" });
      help = true;
    } catch { /* non-zero */ }
    check(help, `${name}: ${argv[0]} --help exits 0`);
    const cmd = s.ins.find((i) => i.kw === "CMD");
    if (cmd) {
      let ok = true;
      try {
        ok = Array.isArray(JSON.parse(cmd.text));
      } catch {
        ok = false;
      }
      check(ok, `${name}: CMD of ${s.name} is exec form`);
    }
  }
  const user = runtime?.ins.find((i) => i.kw === "USER")?.words[0] ?? "";
  const [uid, gid] = user.split(":");
  const setup = runtime?.ins.filter((i) => i.kw === "RUN").map((i) => i.text).join("\n") ?? "";
  check(/^\d+$/.test(uid) && uid !== "0" && gid && /^\d+$/.test(gid),
    `${name}: USER is a numeric non-root uid:gid (${user})`);
  check(setup.includes(`--uid ${uid}`) && setup.includes(`--gid ${gid}`),
    `${name}: the runtime stage creates user ${uid} and group ${gid}`);
  const workdir = runtime?.ins.find((i) => i.kw === "WORKDIR")?.words[0];
  check(workdir && setup.includes(`-o ${uid} -g ${gid}`) && setup.includes(workdir),
    `${name}: WORKDIR ${workdir} is created for ${uid}:${gid}`);
  const uids = uidsInManifests();
  check(uids.size === 1 && uids.has(uid), `${name}: manifests run as uid ${uid} (${[...uids].join(",")})`);
  const labels = runtime?.ins.filter((i) => i.kw === "LABEL").map((i) => i.text).join(" ") ?? "";
  for (const k of ["title", "version", "revision"])
    check(labels.includes(`org.opencontainers.image.${k}=`), `${name}: OCI label ${k}`);
}
console.log(`dockerfiles: ${passed} passed, ${failed} failed`);
process.exitCode = failed ? 1 : 0;
