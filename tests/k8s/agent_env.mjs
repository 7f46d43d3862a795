// agent_env.mjs - the job examples' environment gives the expected ranks.
//
//   node agent_env.mjs BUILD_DIR MANIFEST...
//
// For each manifest (a Volcano Job, an Indexed Job, a JobSet, a TrainJob
// with its runtime among the other manifests) it builds the environment
// each pod's agent container would get - its env entries with fieldRef,
// configMapKeyRef and $(VAR) resolved, plus what the scheduler adds
// (Volcano's env and svc plugins: VC_TASK_INDEX, VC_<TASK>_NUM,
// VC_<TASK>_HOSTS; Kubernetes: JOB_COMPLETION_INDEX; Trainer: PET_NNODES,
// PET_NPROC_PER_NODE, PET_NODE_RANK; the pod's HOSTNAME and node name;
// MESHRUN_TOPOLOGY in place of the Node lookup of MESHRUN_TOPOLOGY_LABELS) -
// and starts one real meshrun-agent per pod with only that environment
// (the controller URL, token file and health port pointed at a local
// controller), in reverse pod order, running a command that prints
// torchrun's variables. Each pod must get node rank = its index, the
// world size nodes x nproc_per_node, and exit 0.
//
// An agent with an https:// controller URL calls a local controller that
// serves TLS (--tls-cert, --tls-key; with --tls-client-ca when the agent
// carries MESHRUN_TLS_CERT), its certificate signed by a CA made here with
// openssl for the name localhost; the agent's MESHRUN_TLS_CA, _CERT and
// _KEY, where the manifest sets them, point at that CA and a client
// certificate it signed. An agent without MESHRUN_TLS_CA then fails, as it
// would in the cluster.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadObjects } from "./validate.mjs";
import { podTemplates } from "./policy.mjs";

const [build, ...manifests] = process.argv.slice(2);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let passed = 0;
let failed = 0;
function check(ok, what, detail = "") {
  if (ok) passed++;
  else failed++;
  console.log(`agent-env: ${ok ? "ok  " : "FAIL"} ${what}${ok || !detail ? "" : `: ${detail}`}`);
}

function run(cmd, args, env, ms) {
  return new Promise((res) => {
    const p = spawn(cmd, args, { env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    p.stdout.on("data", (b) => { out += b; });
    p.stderr.on("data", (b) => { out += b; });
    const t = setTimeout(() => p.kill("SIGKILL"), ms);
    p.on("exit", (code, sig) => { clearTimeout(t); res({ code: code ?? 128, sig, out }); });
  });
}

/** The scheduler's view of pod I: its extra env and hostname. */
function schedulerEnv(p, i, n) {
  const o = p.owner;
  const node = { NODE_NAME: `node-${String(i).padStart(3, "0")}` }; // the pod's spec.nodeName
  if (p.task) { // Volcano: env + svc plugins, pod <job>-<task>-<i>
    const T = p.task.name.toUpperCase().replaceAll("-", "_");
    const hosts = [...Array(n).keys()].map((k) => `${o.metadata.name}-${p.task.name}-${k}.${o.metadata.name}`);
    return { ...node, VC_TASK_INDEX: `${i}`, VK_TASK_INDEX: `${i}`, [`VC_${T}_NUM`]: `${n}`,
      [`VC_${T}_HOSTS`]: hosts.join(","), HOSTNAME: `${o.metadata.name}-${p.task.name}-${i}` };
  }
  if (o.kind === "JobSet" || o.kind === "TrainJob") // <jobset>-<replicatedJob>-<job index>-<pod index>
    return { ...node, JOB_COMPLETION_INDEX: `${i}`, JOBSET_NAME: o.metadata.name,
      HOSTNAME: `${o.metadata.name}-${p.rjob.name}-0-${i}` };
  return { ...node, JOB_COMPLETION_INDEX: `${i}`, HOSTNAME: `${o.metadata.name}-${i}` };
}

function containerEnv(c, bundle, extra) {
  const env = { ...extra };
  for (const e of c.env ?? []) {
    let v = e.value;
    const f = e.valueFrom;
    const fp = f?.fieldRef?.fieldPath;
    if (fp === "status.podIP") v = "127.0.0.1";
    else if (fp === "metadata.namespace") v = "ml";
    else if (fp === "spec.nodeName") v = extra.NODE_NAME;
    else if (fp === "metadata.labels['jobset.sigs.k8s.io/jobset-name']") v = extra.JOBSET_NAME;
    else if (fp === "metadata.annotations['batch.kubernetes.io/job-completion-index']") v = extra.JOB_COMPLETION_INDEX;
    else if (f?.configMapKeyRef) {
      const cm = bundle.find((o) => o.kind === "ConfigMap" && o.metadata.name === f.configMapKeyRef.name);
      v = cm?.data?.[f.configMapKeyRef.key];
    }
    if (v === undefined) throw new Error(`env ${e.name}: cannot resolve ${JSON.stringify(f)}`);
    env[e.name] = v.replace(/\$\((\w+)\)/g, (m, k) => env[k] ?? m);
  }
  return env;
}

// The file at path in container c of pod p, as its ConfigMap volume would
// mount it, written to out; returns out.
function mountedFile(p, c, bundle, path, out) {
  const m = (c.volumeMounts ?? []).find((x) => path.startsWith(`${x.mountPath.replace(/\/$/, "")}/`));
  const v = m && (p.tpl.spec.volumes ?? []).find((x) => x.name === m.name);
  const cm = v?.configMap && bundle.find((o) => o.kind === "ConfigMap" && o.metadata.name === v.configMap.name);
  const data = cm?.data?.[path.slice(m.mountPath.replace(/\/$/, "").length + 1)];
  if (data === undefined) throw new Error(`${path}: no ConfigMap volume holds it`);
  writeFileSync(out, data);
  return out;
}

const dir = mkdtempSync(join(tmpdir(), "meshrun-agentenv-"));
const token = join(dir, "token");
writeFileSync(token, "agent-env-test-token\n");

// A CA, a server certificate for localhost and 127.0.0.1, a client
// certificate: made once, when a manifest asks for TLS.
let pkiDone = false;
function pki() {
  if (pkiDone) return;
  const ssl = (...args) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  ssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=agent-env CA");
  for (const [name, ext] of [["server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"],
    ["client", "extendedKeyUsage=clientAuth\n"]]) {
    writeFileSync(join(dir, `${name}.ext`), ext);
    ssl("req", ...ec, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`);
    ssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
      "-out", `${name}.crt`, "-days", "1", "-extfile", `${name}.ext`);
  }
  pkiDone = true;
}

// The local controllers: plain, TLS, TLS with client certificates; started
// when first needed. Returns the port.
const ctls = new Map();
async function controller(kind) {
  if (ctls.has(kind)) return ctls.get(kind).port;
  const tls = kind === "http" ? [] : (pki(), ["--tls-cert", join(dir, "server.crt"), "--tls-key", join(dir, "server.key")]);
  if (kind === "mtls") tls.push("--tls-client-ca", join(dir, "ca.crt"));
  const portFile = join(dir, `port-${kind}`);
  const proc = spawn(join(build, "meshrun-controller"), ["--listen", "127.0.0.1", "--port", "0",
    "--port-file", portFile, "--data-dir", join(dir, `data-${kind}`), "--token-file", token,
    "--log-level", "warn", ...tls], { stdio: ["ignore", "inherit", "inherit"] });
  ctls.set(kind, { proc, port: "" });
  let port = "";
  for (let k = 0; k < 200 && !port; k++) {
    await sleep(50);
    try {
      port = readFileSync(portFile, "utf8").trim();
    } catch { /* not yet */ }
  }
  if (!port) throw new Error(`the ${kind} controller did not write its port`);
  ctls.get(kind).port = port;
  return port;
}

try {
  // every manifest's objects, for references between files (a TrainJob's runtime)
  const all = manifests.flatMap((m) => loadObjects(m));
  for (const m of manifests) {
    const mine = loadObjects(m);
    const names = new Set(mine.map((o) => `${o.kind}/${o.metadata?.name}`));
    const bundle = [...mine, ...all.filter((o) => !names.has(`${o.kind}/${o.metadata?.name}`))];
    const pods = podTemplates(bundle).filter((p) => names.has(`${p.owner.kind}/${p.owner.metadata?.name}`) &&
      !p.runtime && p.tpl.metadata?.labels?.["app.kubernetes.io/name"] === "meshrun-agent");
    for (const p of pods) {
      const n = p.task ? p.task.replicas : p.job.completions;
      const c = p.tpl.spec.containers.find((x) => x.name === "agent" || x.name === "node");
      const env0 = containerEnv(c, bundle, schedulerEnv(p, 0, n));
      const nproc = Number(env0.MESHRUN_NPROC_PER_NODE ?? env0.PET_NPROC_PER_NODE ?? 1);
      const runs = [];
      for (let i = n - 1; i >= 0; i--) {
        const env = containerEnv(c, bundle, { PATH: process.env.PATH, ...schedulerEnv(p, i, n) });
        if (env.MESHRUN_CONTROLLER?.startsWith("https://")) {
          const mtls = env.MESHRUN_TLS_CERT !== undefined;
          env.MESHRUN_CONTROLLER = `https://localhost:${await controller(mtls ? "mtls" : "tls")}`;
          if (env.MESHRUN_TLS_CA !== undefined) env.MESHRUN_TLS_CA = join(dir, "ca.crt");
          if (mtls) env.MESHRUN_TLS_CERT = join(dir, "client.crt");
          if (env.MESHRUN_TLS_KEY !== undefined) env.MESHRUN_TLS_KEY = join(dir, "client.key");
        } else {
          env.MESHRUN_CONTROLLER = `http://127.0.0.1:${await controller("http")}`;
        }
        env.MESHRUN_TOKEN_FILE = token;
        env.MESHRUN_HEALTH_PORT = "0";
        env.MESHRUN_HEALTH_ADDR = "127.0.0.1";
        env.MESHRUN_GRACE_PERIOD = "1s";
        // No API server here: the path the agent would build from its
        // Node's labels is given directly, in pod order (so the topology
        // rank order gives the same ranks as the index order).
        if (env.MESHRUN_TOPOLOGY_LABELS !== undefined) {
          const levels = env.MESHRUN_TOPOLOGY_LABELS.split(",");
          env.MESHRUN_TOPOLOGY = levels.map((_, k) => (k === levels.length - 1 ? env.NODE_NAME : `d${k}-0`)).join("/");
          delete env.MESHRUN_TOPOLOGY_LABELS;
        }
        const wl = env.MESHRUN_WORKLOAD_CONFIG;
        if (wl && !wl.trimStart().startsWith("{"))
          env.MESHRUN_WORKLOAD_CONFIG = mountedFile(p, c, bundle, wl, join(dir, `workload-${i}.json`));
        runs.push(run(join(build, "meshrun-agent"), ["--", "sh", "-c",
          'echo "mrenv group_rank=$GROUP_RANK group_world=$GROUP_WORLD_SIZE world=$WORLD_SIZE rank=$RANK"'],
        env, 60000).then((r) => ({ i, ...r })));
        await sleep(100);
      }
      for (const r of await Promise.all(runs)) {
        const lines = [...r.out.matchAll(/mrenv group_rank=(\d+) group_world=(\d+) world=(\d+) rank=(\d+)/g)];
        const ranks = lines.map((l) => Number(l[4])).sort((a, b) => a - b);
        const want = [...Array(nproc).keys()].map((k) => r.i * nproc + k);
        check(r.code === 0 && lines.length === nproc &&
          lines.every((l) => Number(l[1]) === r.i && Number(l[2]) === n && Number(l[3]) === n * nproc) &&
          JSON.stringify(ranks) === JSON.stringify(want),
        `${m}: pod ${r.i} of ${n} is node rank ${r.i}, ranks ${want.join(",")} of ${n * nproc}` +
          (env0.MESHRUN_CONTROLLER?.startsWith("https://") ? ` (TLS${env0.MESHRUN_TLS_CERT ? ", client certificate" : ""})` : ""),
        `exit ${r.code}; ${r.out.split("\n").filter((l) => /mrenv|lvl=(error|warn)|event=(start|exit)/.test(l)).join(" | ")}`);
      }
    }
  }
} catch (e) {
  check(false, "agent env test", e.message);
} finally {
  for (const c of ctls.values()) c.proc.kill("SIGTERM");
  await sleep(300);
  rmSync(dir, { recursive: true, force: true });
}
console.log(`agent-env: ${passed} passed, ${failed} failed`);
process.exitCode = failed ? 1 : 0;
