// prometheus.mjs - a real Prometheus scrapes a real `meshrun local` run.
//
//   node prometheus.mjs BUILD_DIR
//
// Starts `meshrun local --nodes 2 --nproc-per-node 2 --tp 2` (job
// test/promjob, health servers on ephemeral ports), then Debian's
// prometheus with a scrape config equivalent to the PodMonitor and the
// ServiceMonitor (jobs meshrun-agent and meshrun-controller, the labels
// namespace, pod and meshrun_job the relabeling gives, 1 s interval) on a
// free loopback port, storage in a temp dir. While the job trains it
// checks, through the HTTP API:
// - loss, tokens/s and rank info series for every rank, and the
//   controller's series;
// - every metric the dashboard and the alerts name is one the live
//   /metrics export;
// - every dashboard query (variables filled in) returns data, and every
//   alert expression evaluates.
// Prints "prometheus: N passed, N failed"; exit 1 on failure, 0 with a
// SKIP line when no prometheus binary exists.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "../..");
const build = process.argv[2] ?? join(root, "build");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let passed = 0;
let failed = 0;
function check(ok, what, detail = "") {
  if (ok) passed++;
  else failed++;
  console.log(`prometheus: ${ok ? "ok  " : "FAIL"} ${what}${ok || !detail ? "" : `: ${detail}`}`);
}

if (spawnSync("prometheus", ["--version"]).error) {
  console.log("prometheus: SKIP no prometheus binary (Debian package prometheus; scripts/deps.sh installs it)");
  console.log("prometheus: 0 passed, 0 failed");
  process.exit(0);
}

function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

async function waitFor(fn, ms, what) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn().catch(() => null);
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(250);
  }
}

const dir = mkdtempSync(join(tmpdir(), "meshrun-prom-"));
const procs = [];
let out = "";
try {
  const local = spawn(join(build, "meshrun"), ["local", "--nodes", "2", "--nproc-per-node", "2",
    "--tp", "2", "--job", "test/promjob", "--health-port", "0", "--health-addr", "127.0.0.1",
    "--workload-config", '{"steps": 100000, "d_model": 32, "n_layer": 1, "n_head": 2, "seq_len": 16, "batch_size": 2, "eval_every": 2, "peak_flops": 1e11}'],
  { stdio: ["ignore", "pipe", "pipe"], detached: true });
  procs.push(local);
  local.stdout.on("data", (b) => { out += b; });
  local.stderr.on("data", (b) => { out += b; });

  // the controller's URL and each node's health port, from the merged log
  const targets = await waitFor(async () => {
    const ctl = out.match(/controller on http:\/\/([0-9.:]+)/)?.[1];
    const nodes = [...out.matchAll(/\[node (\d+)\].*event=health_listening .*port=(\d+)/g)];
    const agents = new Map(nodes.map((m) => [m[1], m[2]]));
    return ctl && agents.size === 2 ? { ctl, agents } : null;
  }, 60000, "the controller and 2 agents to listen");

  const config = {
    global: { scrape_interval: "1s", scrape_timeout: "1s", evaluation_interval: "1s" },
    scrape_configs: [
      { job_name: "meshrun-agent", metrics_path: "/metrics",
        static_configs: [...targets.agents].map(([n, port]) => ({
          targets: [`127.0.0.1:${port}`],
          labels: { namespace: "test", pod: `promjob-worker-${n}`, meshrun_job: "promjob" },
        })) },
      { job_name: "meshrun-controller", metrics_path: "/metrics",
        static_configs: [{ targets: [targets.ctl], labels: { namespace: "test", pod: "controller" } }] },
    ],
  };
  writeFileSync(join(dir, "prometheus.yml"), JSON.stringify(config));

  // prometheus cannot listen on port 0: take a free port, retry on a clash
  let api = null;
  for (let attempt = 0; attempt < 5 && !api; attempt++) {
    const port = await freePort();
    const prom = spawn("prometheus", [`--config.file=${join(dir, "prometheus.yml")}`,
      `--storage.tsdb.path=${join(dir, `data${attempt}`)}`, `--web.listen-address=127.0.0.1:${port}`,
      "--log.level=warn"], { stdio: ["ignore", "ignore", "pipe"] });
    procs.push(prom);
    let perr = "";
    prom.stderr.on("data", (b) => { perr += b; });
    const up = await waitFor(async () => {
      if (prom.exitCode !== null) return "exited";
      const r = await fetch(`http://127.0.0.1:${port}/-/ready`);
      return r.ok ? "ready" : null;
    }, 30000, "prometheus to be ready").catch(() => "timeout");
    if (up === "ready") api = `http://127.0.0.1:${port}/api/v1`;
    else console.log(`prometheus: port ${port} attempt failed (${up}): ${perr.split("\n").slice(-3).join(" ")}`);
  }
  if (!api) throw new Error("prometheus did not start");

  const query = async (q) => {
    const r = await fetch(`${api}/query?query=${encodeURIComponent(q)}`);
    const j = await r.json();
    if (j.status !== "success") throw new Error(`${q}: ${j.error}`);
    return j.data.result;
  };

  // loss, tokens/s and rank info for every rank; the controller's series
  const ranks = await waitFor(async () => {
    const loss = await query('meshrun_worker_loss{job="meshrun-agent", meshrun_job="promjob"}');
    const ctl = await query('up{job="meshrun-controller"} == 1');
    return loss.length === 4 && ctl.length === 1 ? loss : null;
  }, 60000, "meshrun_worker_loss of 4 ranks and the controller scraped").catch((e) => { check(false, "series of every rank", e.message); return []; });
  const rankSet = (r) => new Set(r.map((s) => s.metric.rank));
  check(JSON.stringify([...rankSet(ranks)].sort()) === '["0","1","2","3"]', "meshrun_worker_loss for ranks 0-3");
  for (const m of ["meshrun_worker_tokens_per_second", "meshrun_rank_info"]) {
    const r = await query(`${m}{job="meshrun-agent", meshrun_job="promjob"}`);
    check(JSON.stringify([...rankSet(r)].sort()) === '["0","1","2","3"]', `${m} for ranks 0-3`);
  }
  const gen = await query('meshrun_controller_generation{job="meshrun-controller", exported_job="test/promjob"}');
  check(gen.length === 1 && Number(gen[0].value[1]) >= 1, "meshrun_controller_generation of test/promjob (exported_job)");
  const upq = await query("up == 1");
  check(upq.length === 3, "3 targets up (2 agents, the controller)", JSON.stringify(upq.map((s) => s.metric.instance)));

  // every metric the dashboard and the alerts name is exported
  const live = new Set();
  for (const url of [...targets.agents.values()].map((p) => `http://127.0.0.1:${p}/metrics`)
    .concat(`http://${targets.ctl}/metrics`)) {
    const text = await (await fetch(url)).text();
    for (const m of text.matchAll(/^# TYPE (\S+) (\S+)/gm)) {
      live.add(m[1]);
      if (m[2] === "histogram") for (const s of ["_bucket", "_sum", "_count"]) live.add(m[1] + s);
    }
  }
  const dash = JSON.parse(readFileSync(join(root, "charts/meshrun/files/dashboard.json"), "utf8"));
  const exprs = [];
  const walk = (ps) => ps.forEach((p) => { (p.targets ?? []).forEach((t) => exprs.push([p.title, t.expr])); walk(p.panels ?? []); });
  walk(dash.panels);
  for (const v of dash.templating.list) if (v.query?.query) exprs.push([`variable ${v.name}`, v.query.query]);
  const rules = parse(readFileSync(join(root, "charts/meshrun/files/alerts.yaml"), "utf8"))
    .groups.flatMap((g) => g.rules.map((r) => [r.alert, r.expr]));
  // Series that exist only during an incident (a hang, a straggler) are
  // absent from a healthy run's /metrics: an alert may name them when the
  // controller registers them under that name.
  const incidentOnly = new Set(["meshrun_job_stuck", "meshrun_job_straggler_ratio"]);
  const ctlSource = ["server.c"].map((f) => readFileSync(join(root, "controller/api", f), "utf8")).join("");
  const known = (n, isRule) => live.has(n) ||
    (isRule && incidentOnly.has(n) && ctlSource.includes(`"${n}"`));
  for (const [what, e, isRule] of [...exprs, ...rules.map(([w, x]) => [w, x, true])]) {
    // meshrun_job is the label the PodMonitor's relabeling adds, not a metric
    const names = [...e.matchAll(/\b(meshrun_[a-z0-9_]+)/g)].map((m) => m[1])
      .filter((n) => n !== "meshrun_job");
    const unknown = names.filter((n) => !known(n, isRule));
    check((names.length > 0 || /\bup\{/.test(e)) && unknown.length === 0, `${what}: names only exported metrics`,
      `not exported: ${unknown.join(", ")}`);
  }

  // every dashboard query returns data; every alert expression evaluates
  const fill = (e) => e.replaceAll("$namespace", "test").replaceAll("$job", "promjob")
    .replaceAll("$__rate_interval", "30s").replaceAll("${datasource}", "");
  await sleep(3000); // a few scrapes for rate()
  for (const [what, e] of exprs) {
    if (e.startsWith("label_values(")) {
      const m = fill(e).match(/^label_values\((.*), (\w+)\)$/);
      const r = await query(m[1]).catch((x) => x);
      check(Array.isArray(r) && r.some((s) => s.metric[m[2]]), `${what}: has values`);
      continue;
    }
    const r = await query(fill(e)).catch((x) => x);
    check(Array.isArray(r) && r.length > 0, `dashboard "${what}" returns data`,
      Array.isArray(r) ? `empty: ${fill(e)}` : r.message);
  }
  for (const [what, e] of rules) {
    const r = await query(e).catch((x) => x);
    check(Array.isArray(r), `alert ${what} evaluates`, r.message);
  }
} catch (e) {
  check(false, "prometheus test", `${e.message}\n--- meshrun local output (tail) ---\n${out.split("\n").slice(-30).join("\n")}`);
} finally {
  for (const p of procs.reverse()) {
    try {
      if (p.exitCode === null) process.kill(p === procs[procs.length - 1] ? -p.pid : p.pid, "SIGTERM");
    } catch { /* gone */ }
  }
  await sleep(1500);
  for (const p of procs) {
    try {
      if (p.exitCode === null) process.kill(p.pid, "SIGKILL");
    } catch { /* gone */ }
  }
  rmSync(dir, { recursive: true, force: true });
}
console.log(`prometheus: ${passed} passed, ${failed} failed`);
process.exitCode = failed ? 1 : 0;
