// policy.mjs - what meshrun needs of its manifests beyond the schemas.
//
// The rules of docs/KUBERNETES.md, checked on a bundle of objects (a
// directory of manifests, or one rendered chart) so that references can be
// followed: a Secret, a ConfigMap key, a headless Service, the pods a
// monitor selects. Each rule returns a message naming the object, the
// field and the reason; tests/k8s/rejected/ holds one manifest per rule
// that must be refused.
//
// TLS: which controller an agent calls (its URL's host is a Service that
// selects it, or the controller of its own JobSet); a controller serving
// TLS needs https:// URLs, agents with its CA (and a client certificate
// when it asks for one), HTTPS probes and scrapes, a certificate naming
// the Service, and its files mounted so that a rotation reaches them.
//
// Beyond the pods: Volcano gangs and their network topology, Indexed Job
// and JobSet failure, success and startup policies, Kueue queues and
// Topology Aware Scheduling, Kubeflow Trainer runtimes and the pod a
// TrainJob gets from one, and the agents' topology inputs with the
// read-only node role they need.
//
// Non-goals: schema checks (schema.mjs), anything a cluster decides at run
// time (scheduling, quotas).

const AGENT = "meshrun-agent";
const CONTROLLER = "meshrun-controller";
const QUEUE = "kueue.x-k8s.io/queue-name";
const TAS = ["kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology"];
const LABEL_KEY = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;

function label(o) {
  return `${o.kind} ${o.metadata?.name ?? "?"}`;
}

function matches(selector, labels) {
  if (!selector || !labels) return false;
  const ml = selector.matchLabels ?? selector;
  return Object.keys(ml).length > 0 &&
    Object.entries(ml).every(([k, v]) => labels[k] === v);
}

/** [pod template, path, owner object] of every workload in the bundle. */
export function podTemplates(objs) {
  const out = [];
  for (const o of objs) {
    const s = o.spec ?? {};
    if (o.kind === "Deployment" || (o.kind === "Job" && o.apiVersion === "batch/v1"))
      out.push({ tpl: s.template, path: "spec.template", owner: o, job: o.kind === "Job" ? s : null });
    if (o.kind === "Job" && o.apiVersion === "batch.volcano.sh/v1alpha1")
      (s.tasks ?? []).forEach((t, i) =>
        out.push({ tpl: t.template, path: `spec.tasks[${i}].template`, owner: o, task: t }));
    if (o.kind === "JobSet")
      (s.replicatedJobs ?? []).forEach((r, i) =>
        out.push({ tpl: r.template?.spec?.template, owner: o, rjob: r,
          path: `spec.replicatedJobs[${i}].template.spec.template`, job: r.template?.spec }));
    if (o.kind === "ClusterTrainingRuntime") // a template: TrainJobs fill it in
      (s.template?.spec?.replicatedJobs ?? []).forEach((r, i) =>
        out.push({ tpl: r.template?.spec?.template, owner: o, rjob: r, runtime: true,
          path: `spec.template.spec.replicatedJobs[${i}].template.spec.template`, job: r.template?.spec }));
    if (o.kind === "TrainJob") {
      const t = trainJobPod(o, objs);
      if (t) out.push(t);
    }
  }
  return out.filter((p) => p.tpl);
}

const ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step";

/** The ClusterTrainingRuntime a TrainJob names, when the bundle has it. */
export function runtimeOf(tj, objs) {
  const ref = tj.spec?.runtimeRef ?? {};
  if ((ref.kind ?? "ClusterTrainingRuntime") !== "ClusterTrainingRuntime") return undefined;
  return objs.find((o) => o.kind === "ClusterTrainingRuntime" && o.metadata?.name === ref.name);
}

/**
 * The pod a TrainJob's trainer nodes get, as Kubeflow Trainer v2.0 builds
 * it: the runtime's replicatedJob marked trainer (ancestor label), with
 * numNodes as the Job's completions and parallelism, resourcesPerNode as
 * the "node" container's resources, the TrainJob's env after the
 * runtime's, and (mlPolicy.torch) torchrun's PET_ variables.
 */
function trainJobPod(tj, objs) {
  const rt = runtimeOf(tj, objs);
  const rjobs = rt?.spec?.template?.spec?.replicatedJobs ?? [];
  const rjob = rjobs.find((r) => r.template?.metadata?.labels?.[ANCESTOR] === "trainer");
  if (!rjob?.template?.spec?.template) return undefined;
  const job = structuredClone(rjob.template.spec);
  const t = tj.spec?.trainer ?? {};
  const ml = rt.spec.mlPolicy ?? {};
  const nodes = t.numNodes ?? ml.numNodes ?? 1;
  job.completions = nodes;
  job.parallelism = nodes;
  for (const c of job.template.spec.containers ?? []) {
    if (c.name !== "node") continue;
    if (t.resourcesPerNode) c.resources = structuredClone(t.resourcesPerNode);
    const env = (c.env ?? []).filter((e) => !(t.env ?? []).some((x) => x.name === e.name));
    if (ml.torch) {
      const nproc = t.numProcPerNode ?? ml.torch.numProcPerNode ?? "auto";
      env.push({ name: "PET_NNODES", value: `${nodes}` },
        { name: "PET_NPROC_PER_NODE", value: `${nproc}` },
        { name: "PET_NODE_RANK", valueFrom: { fieldRef: {
          fieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']" } } });
    }
    c.env = [...env, ...structuredClone(t.env ?? [])];
  }
  return { tpl: job.template, owner: tj, rjob, job, trainJob: true,
    path: `spec.trainer (on ClusterTrainingRuntime ${rt.metadata.name})` };
}

function envOf(c) {
  const m = new Map();
  for (const e of c.env ?? []) m.set(e.name, e);
  return m;
}

function argValue(c, flag) {
  const args = [...(c.command ?? []), ...(c.args ?? [])];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === flag) return args[i + 1];
    if (args[i].startsWith(`${flag}=`)) return args[i].slice(flag.length + 1);
  }
  return undefined;
}

// The volume mounted at (or above) PATH in container C.
function volumeFor(spec, c, path) {
  let best = null;
  for (const m of c.volumeMounts ?? [])
    if (path === m.mountPath || path.startsWith(`${m.mountPath.replace(/\/$/, "")}/`))
      if (!best || m.mountPath.length > best.mountPath.length) best = m;
  return best && (spec.volumes ?? []).find((v) => v.name === best.name);
}

/** TEXT (WHAT: where it comes from) as the workload's JSON object, or undefined after err. */
function parseWorkload(text, what, where, err) {
  try {
    const w = JSON.parse(text);
    if (typeof w !== "object" || w === null || Array.isArray(w)) throw new Error("not an object");
    return w;
  } catch (x) {
    err(`${where}: ${what} is not a JSON object: ${x.message}`);
    return undefined;
  }
}

function checkPod(p, bundle, opts, err) {
  const spec = p.tpl.spec ?? {};
  const where = `${label(p.owner)} ${p.path}`;
  const labels = p.tpl.metadata?.labels ?? {};
  const psc = spec.securityContext ?? {};
  if (psc.runAsNonRoot !== true) err(`${where}.spec.securityContext.runAsNonRoot: must be true`);
  const agent = labels["app.kubernetes.io/name"] === AGENT;
  const readsNode = agent && (spec.containers ?? []).some((c) => envOf(c).has("MESHRUN_TOPOLOGY_LABELS"));
  if (readsNode) checkNodeReader(spec, where, bundle, err);
  else if (spec.automountServiceAccountToken !== false)
    err(`${where}.spec.automountServiceAccountToken: must be false (meshrun calls no Kubernetes API unless its agents read their Node's topology labels)`);
  for (const c of spec.containers ?? []) {
    const cw = `${where}.spec.containers[${c.name}]`;
    const sc = c.securityContext ?? {};
    if (sc.allowPrivilegeEscalation !== false)
      err(`${cw}.securityContext.allowPrivilegeEscalation: must be false`);
    if (sc.readOnlyRootFilesystem !== true)
      err(`${cw}.securityContext.readOnlyRootFilesystem: must be true`);
    if (sc.privileged === true) err(`${cw}.securityContext.privileged: must not be true`);
    if (!(sc.capabilities?.drop ?? []).includes("ALL"))
      err(`${cw}.securityContext.capabilities.drop: must include ALL`);
    if ((sc.seccompProfile ?? psc.seccompProfile)?.type !== "RuntimeDefault")
      err(`${cw}: seccompProfile must be RuntimeDefault (pod or container)`);
    if (sc.runAsNonRoot === false) err(`${cw}.securityContext.runAsNonRoot: must not be false`);
    const req = c.resources?.requests ?? {};
    if (!req.cpu || !req.memory) err(`${cw}.resources.requests: cpu and memory are required`);
    if (!c.resources?.limits?.memory) err(`${cw}.resources.limits.memory: required`);
    if (c.livenessProbe?.httpGet?.path !== "/healthz")
      err(`${cw}.livenessProbe: must be an httpGet of /healthz`);
    if (c.readinessProbe?.httpGet?.path !== "/readyz")
      err(`${cw}.readinessProbe: must be an httpGet of /readyz`);
    const env = envOf(c);
    if (env.get("MESHRUN_TOKEN")?.value !== undefined || argValue(c, "--token") !== undefined)
      err(`${cw}: the token must come from a Secret mounted as a file (MESHRUN_TOKEN_FILE or --token-file), not a literal`);
    const tokenFile = env.get("MESHRUN_TOKEN_FILE")?.value ?? argValue(c, "--token-file");
    if (!tokenFile) {
      err(`${cw}: no token file (MESHRUN_TOKEN_FILE or --token-file): mutating calls need the bearer token`);
    } else {
      const v = volumeFor(spec, c, tokenFile);
      if (!v?.secret) err(`${cw}: token file '${tokenFile}' is not on a Secret volume`);
      else if (!bundle.some((o) => o.kind === "Secret" && o.metadata?.name === v.secret.secretName))
        err(`${cw}: Secret '${v.secret.secretName}' is not in the bundle`);
    }
    const wl = env.get("MESHRUN_WORKLOAD_CONFIG")?.value;
    let workload; // the parsed workload config, when it comes from a ConfigMap
    if (wl && wl.trimStart().startsWith("{"))
      workload = parseWorkload(wl, "the inline value", `${cw}.env[MESHRUN_WORKLOAD_CONFIG]`, err);
    else if (wl) {
      // a path: the file of a ConfigMap volume, and a JSON object
      const v = volumeFor(spec, c, wl);
      const m = (c.volumeMounts ?? []).find((x) => x.name === v?.name);
      const key = m ? wl.slice(m.mountPath.replace(/\/$/, "").length + 1) : "";
      const cm = v?.configMap &&
        bundle.find((o) => o.kind === "ConfigMap" && o.metadata?.name === v.configMap.name);
      if (!cm || cm.data?.[key] === undefined)
        err(`${cw}.env[MESHRUN_WORKLOAD_CONFIG]: '${wl}' is not a key of a ConfigMap volume in the bundle`);
      else
        workload = parseWorkload(cm.data[key], `ConfigMap '${cm.metadata.name}' key '${key}'`,
          `${cw}.env[MESHRUN_WORKLOAD_CONFIG]`, err);
    }
    for (const e of c.env ?? []) {
      const r = e.valueFrom?.configMapKeyRef;
      if (!r) continue;
      const cm = bundle.find((o) => o.kind === "ConfigMap" && o.metadata?.name === r.name);
      if (!cm || cm.data?.[r.key] === undefined)
        err(`${cw}.env[${e.name}]: ConfigMap '${r.name}' key '${r.key}' is not in the bundle`);
      else if (e.name === "MESHRUN_WORKLOAD_CONFIG")
        workload = parseWorkload(cm.data[r.key], `ConfigMap '${r.name}' key '${r.key}'`,
          `${cw}.env[${e.name}]`, err);
    }
    const gpus = Number(c.resources?.limits?.["nvidia.com/gpu"] ?? 0);
    if (workload && gpus > 0 && workload.device !== "cuda")
      err(`${cw}: the pod reserves ${gpus} nvidia.com/gpu but its workload trains on "${workload.device ?? "cpu"}"; set "device": "cuda"`);
    if (agent) checkAgent(p, spec, c, cw, env, opts, err);
  }
}

function checkAgent(p, spec, c, cw, env, opts, err) {
  const shm = volumeFor(spec, c, "/dev/shm");
  if (!shm?.emptyDir || shm.emptyDir.medium !== "Memory")
    err(`${cw}: /dev/shm must be an emptyDir with medium Memory (the default 64 MiB breaks shared-memory transport and NCCL)`);
  if (!volumeFor(spec, c, "/var/lib/meshrun/checkpoints"))
    err(`${cw}: no volume at /var/lib/meshrun/checkpoints (checkpoints would die with the pod)`);
  const port = Number(env.get("MESHRUN_HEALTH_PORT")?.value ?? argValue(c, "--health-port") ?? 29401);
  if (!(c.ports ?? []).some((q) => q.name === "metrics" && q.containerPort === port))
    err(`${cw}.ports: a port named metrics must be the health port ${port}`);
  if (env.get("POD_IP")?.valueFrom?.fieldRef?.fieldPath !== "status.podIP" && !env.has("MESHRUN_HOST"))
    err(`${cw}.env: POD_IP (fieldRef status.podIP) is required, else the agent advertises 127.0.0.1`);
  if (!env.has("MESHRUN_CONTROLLER") && argValue(c, "--controller") === undefined)
    err(`${cw}.env: MESHRUN_CONTROLLER is required`);
  if (spec.restartPolicy !== "Never")
    err(`${cw}: restartPolicy must be Never, so that a failed pod reaches the job's failure policy`);
  checkTopologyInputs(p, c, cw, env, err);
  if (p.runtime) return; // a runtime's template: its TrainJobs give size and resources
  if (opts.requireGpu) {
    const gpus = Number(c.resources?.limits?.["nvidia.com/gpu"] ?? 0);
    const nproc = Number(env.get("MESHRUN_NPROC_PER_NODE")?.value ?? env.get("PET_NPROC_PER_NODE")?.value ?? 1);
    if (gpus < 1) err(`${cw}.resources.limits: nvidia.com/gpu is required`);
    else if (gpus !== nproc)
      err(`${cw}: nvidia.com/gpu (${gpus}) must equal MESHRUN_NPROC_PER_NODE (${nproc}), one GPU per rank`);
  }
  if (p.task) {
    if (env.has("MESHRUN_POD_INDEX"))
      err(`${cw}.env: MESHRUN_POD_INDEX overrides VC_TASK_INDEX; leave the pod index to Volcano`);
    const tasks = p.owner.spec.tasks.length;
    if (tasks === 1 && env.has("MESHRUN_NNODES") && Number(env.get("MESHRUN_NNODES").value) !== p.task.replicas)
      err(`${cw}.env: MESHRUN_NNODES differs from the task's replicas (${p.task.replicas})`);
    if (tasks > 1 && !env.has("MESHRUN_NNODES"))
      err(`${cw}.env: with several Volcano tasks the agent cannot derive nnodes; set MESHRUN_NNODES`);
  }
  if (p.job) {
    const name = env.has("MESHRUN_NNODES") || !env.has("PET_NNODES") ? "MESHRUN_NNODES" : "PET_NNODES";
    const n = Number(env.get(name)?.value);
    if (n !== p.job.completions)
      err(`${cw}.env: ${name} (${env.get(name)?.value}) must equal completions (${p.job.completions})`);
  }
}

// The agent's topology inputs (MESHRUN_TOPOLOGY, or MESHRUN_TOPOLOGY_LABELS
// with NODE_NAME) and rank order; a topology-aware placement (Kueue TAS,
// Volcano networkTopology) wants MESHRUN_RANK_ORDER=topology.
function checkTopologyInputs(p, c, cw, env, err) {
  const labels = env.get("MESHRUN_TOPOLOGY_LABELS")?.value;
  if (labels !== undefined) {
    if (env.get("NODE_NAME")?.valueFrom?.fieldRef?.fieldPath !== "spec.nodeName")
      err(`${cw}.env: MESHRUN_TOPOLOGY_LABELS needs NODE_NAME (fieldRef spec.nodeName): the agent reads its Node by name`);
    const keys = labels.split(",");
    if (!keys.length || keys.some((k) => !LABEL_KEY.test(k)))
      err(`${cw}.env[MESHRUN_TOPOLOGY_LABELS]: '${labels}' is not a comma-separated list of label keys`);
  }
  const order = env.get("MESHRUN_RANK_ORDER")?.value ?? argValue(c, "--rank-order") ?? "index";
  if (!["index", "topology"].includes(order))
    err(`${cw}.env[MESHRUN_RANK_ORDER]: '${order}' is not index or topology`);
  const hasTopology = labels !== undefined || env.has("MESHRUN_TOPOLOGY") || argValue(c, "--topology") !== undefined;
  if (order === "topology" && !hasTopology)
    err(`${cw}.env: MESHRUN_RANK_ORDER=topology without a topology (MESHRUN_TOPOLOGY, or MESHRUN_TOPOLOGY_LABELS with NODE_NAME)`);
  const tas = TAS.find((a) => p.tpl.metadata?.annotations?.[a] !== undefined);
  const aware = tas ? `Kueue ${tas}` : p.owner.spec?.networkTopology ? "Volcano networkTopology" : null;
  if (aware && order !== "topology")
    err(`${cw}.env: the job is placed by topology (${aware}); set MESHRUN_RANK_ORDER=topology so that ranks follow it`);
  if (tas && labels !== undefined && !labels.split(",").includes(p.tpl.metadata.annotations[tas]))
    err(`${cw}.env[MESHRUN_TOPOLOGY_LABELS]: does not list '${p.tpl.metadata.annotations[tas]}', the level of ${tas}`);
}

// A pod whose agents GET their Node: the token mounted, a ServiceAccount of
// the bundle, bound only to read-only roles that grant get on nodes.
function checkNodeReader(spec, where, bundle, err) {
  if (spec.automountServiceAccountToken !== true)
    err(`${where}.spec.automountServiceAccountToken: must be true when the agent reads its Node (MESHRUN_TOPOLOGY_LABELS); or set MESHRUN_TOPOLOGY and mount no token`);
  const sa = spec.serviceAccountName;
  if (!sa || sa === "default") {
    err(`${where}.spec.serviceAccountName: the agents reading their Node need their own ServiceAccount (not default)`);
    return;
  }
  if (!bundle.some((o) => o.kind === "ServiceAccount" && o.metadata?.name === sa))
    err(`${where}.spec.serviceAccountName: ServiceAccount '${sa}' is not in the bundle`);
  const roles = bundle.filter((b) => b.kind === "ClusterRoleBinding" &&
    (b.subjects ?? []).some((x) => x.kind === "ServiceAccount" && x.name === sa))
    .map((b) => bundle.find((r) => r.kind === b.roleRef?.kind && r.metadata?.name === b.roleRef?.name) ??
      { missing: b.roleRef?.name });
  if (!roles.some((r) => (r.rules ?? []).some((x) => (x.apiGroups ?? []).includes("") &&
      (x.resources ?? []).includes("nodes") && (x.verbs ?? []).includes("get"))))
    err(`${where}: no ClusterRoleBinding in the bundle gives ServiceAccount '${sa}' get on nodes`);
  for (const r of roles) {
    if (r.missing) {
      err(`${where}: ServiceAccount '${sa}' is bound to ClusterRole '${r.missing}', which is not in the bundle`);
      continue;
    }
    for (const x of r.rules ?? [])
      if ((x.verbs ?? []).some((v) => v !== "get") || (x.resources ?? []).some((v) => v !== "nodes") ||
          (x.apiGroups ?? []).some((v) => v !== "") || x.resourceNames || x.nonResourceURLs)
        err(`${label(r)}.rules: the agents' role must be read-only, get on nodes and nothing else (${JSON.stringify(x)})`);
  }
}

function checkIndexedJob(o, job, where, bundle, err) {
  if (job.completionMode !== "Indexed")
    err(`${where}.completionMode: must be Indexed (the agent takes its rank order from JOB_COMPLETION_INDEX)`);
  if (job.parallelism !== job.completions)
    err(`${where}: parallelism (${job.parallelism}) must equal completions (${job.completions}): every rank runs at once`);
  const rules = job.podFailurePolicy?.rules ?? [];
  const permanent = rules.some((r) => r.action === "FailJob" && r.onExitCodes?.operator === "In" &&
    (r.onExitCodes.values ?? []).includes(2));
  if (!permanent)
    err(`${where}.podFailurePolicy: a FailJob rule on exit code 2 is required (bad configuration is permanent; retrying it only loops)`);
  const sub = job.template?.spec?.subdomain;
  if (sub && !bundle.some((s) => s.kind === "Service" && s.metadata?.name === sub && s.spec?.clusterIP === "None"))
    err(`${where}.template.spec.subdomain: no headless Service '${sub}' in the bundle`);
}

function checkVolcano(o, err) {
  const s = o.spec ?? {};
  const w = label(o);
  if (s.schedulerName !== "volcano") err(`${w}.spec.schedulerName: must be volcano (gang scheduling)`);
  const total = (s.tasks ?? []).reduce((n, t) => n + (t.replicas ?? 0), 0);
  if (s.minAvailable === undefined)
    err(`${w}.spec.minAvailable: required and equal to the sum of the tasks' replicas (${total}) for gang scheduling`);
  else if (s.minAvailable !== total)
    err(`${w}.spec.minAvailable: ${s.minAvailable} is not the sum of the tasks' replicas (${total}): a partial gang starts a job that cannot form`);
  for (const pl of ["env", "svc"])
    if (!s.plugins || !(pl in s.plugins)) err(`${w}.spec.plugins: the ${pl} plugin is required (VC_TASK_INDEX, VC_<TASK>_NUM)`);
  const jp = s.policies ?? [];
  for (const ev of ["PodEvicted", "PodFailed"])
    if (!jp.some((p) => p.event === ev && p.action === "RestartJob"))
      err(`${w}.spec.policies: ${ev} -> RestartJob is required`);
  if (s.maxRetry === undefined) err(`${w}.spec.maxRetry: required (bounds the RestartJob loop)`);
  for (const t of s.tasks ?? []) {
    const all = [...(t.policies ?? []), ...jp];
    if (!all.some((p) => p.exitCode === 2 && ["TerminateJob", "AbortJob"].includes(p.action)))
      err(`${w}.spec.tasks[${t.name}].policies: exit code 2 must TerminateJob or AbortJob (permanent)`);
  }
}

// A JobSet spec (of a JobSet, or of a ClusterTrainingRuntime's template).
function checkJobSet(o, spec, w, err) {
  const rules = spec.failurePolicy?.rules ?? [];
  const matching = (reason) => rules.find((r) => !r.onJobFailureReasons?.length ||
    r.onJobFailureReasons.includes(reason));
  if (matching("PodFailurePolicy")?.action !== "FailJobSet")
    err(`${w}.spec.failurePolicy: a FailJobSet rule on reason PodFailurePolicy is required, before any rule that restarts on it (exit 2 is permanent)`);
  const retry = matching("BackoffLimitExceeded");
  if (retry && retry.action === "FailJobSet")
    err(`${w}.spec.failurePolicy.rules[${retry.name}]: BackoffLimitExceeded (a retryable exit) must restart the set, not fail it`);
  if (spec.successPolicy?.operator !== "All")
    err(`${w}.spec.successPolicy.operator: must be All (the job is done when every rank is)`);
  for (const r of spec.replicatedJobs ?? [])
    if ((r.replicas ?? 1) !== 1)
      err(`${w}.spec.replicatedJobs[${r.name}].replicas: must be 1 (JOB_COMPLETION_INDEX restarts at 0 in every child Job)`);
  const isController = (r) => r.template?.spec?.template?.metadata?.labels?.["app.kubernetes.io/name"] === CONTROLLER;
  const ci = (spec.replicatedJobs ?? []).findIndex(isController);
  if (ci >= 0 && (ci !== 0 || spec.startupPolicy?.startupPolicyOrder !== "InOrder"))
    err(`${w}.spec.startupPolicy: with the controller in the set, startupPolicyOrder must be InOrder and its replicatedJob first (agents that start first fail to join)`);
}

// Kueue: the queue a job names, the TAS annotations, the queue objects.
function checkKueue(bundle, pods, err) {
  const has = (kind, name) => bundle.some((x) => x.kind === kind && x.metadata?.name === name);
  const anyOf = (kind) => bundle.some((x) => x.kind === kind);
  for (const p of pods) {
    const q = p.owner.metadata?.labels?.[QUEUE];
    if (q !== undefined && anyOf("LocalQueue") && !has("LocalQueue", q))
      err(`${label(p.owner)}.metadata.labels[${QUEUE}]: no LocalQueue '${q}' in the bundle`);
    for (const a of TAS) {
      const level = p.tpl.metadata?.annotations?.[a];
      if (level === undefined) continue;
      if (q === undefined)
        err(`${label(p.owner)} ${p.path}.metadata.annotations[${a}]: without the ${QUEUE} label Kueue never sees the job, and the topology request is ignored`);
      const topos = bundle.filter((x) => x.kind === "Topology");
      if (topos.length && !topos.some((t) => (t.spec?.levels ?? []).some((l) => l.nodeLabel === level)))
        err(`${label(p.owner)} ${p.path}.metadata.annotations[${a}]: '${level}' is not a level of a Topology in the bundle`);
    }
  }
  for (const o of bundle) {
    const w = label(o);
    if (o.kind === "LocalQueue" && anyOf("ClusterQueue") && !has("ClusterQueue", o.spec?.clusterQueue))
      err(`${w}.spec.clusterQueue: no ClusterQueue '${o.spec?.clusterQueue}' in the bundle`);
    if (o.kind === "ClusterQueue")
      for (const g of o.spec?.resourceGroups ?? [])
        for (const f of g.flavors ?? []) {
          if (!has("ResourceFlavor", f.name)) err(`${w}.spec.resourceGroups: no ResourceFlavor '${f.name}' in the bundle`);
          const names = (f.resources ?? []).map((r) => r.name);
          if (JSON.stringify(names) !== JSON.stringify(g.coveredResources))
            err(`${w}.spec.resourceGroups[${f.name}].resources: must list the coveredResources in order (${g.coveredResources}), as Kueue's webhook requires`);
        }
    if (o.kind === "ResourceFlavor" && o.spec?.topologyName && !has("Topology", o.spec.topologyName))
      err(`${w}.spec.topologyName: no Topology '${o.spec.topologyName}' in the bundle`);
    if (o.kind === "Topology") {
      const levels = (o.spec?.levels ?? []).map((l) => l.nodeLabel);
      if (new Set(levels).size !== levels.length) err(`${w}.spec.levels: must be unique`);
      const h = levels.indexOf("kubernetes.io/hostname");
      if (h >= 0 && h !== levels.length - 1)
        err(`${w}.spec.levels: kubernetes.io/hostname can only be the lowest level`);
    }
  }
}

// Kubeflow Trainer v2: a TrainJob runs on meshrun's runtime; the runtime
// marks its trainer node and runs meshrun agents there.
function checkTrainer(bundle, err) {
  for (const o of bundle) {
    const w = label(o);
    if (o.kind === "ClusterTrainingRuntime") {
      const rjobs = o.spec?.template?.spec?.replicatedJobs ?? [];
      const node = rjobs.find((r) => r.template?.metadata?.labels?.[ANCESTOR] === "trainer");
      if (!node)
        err(`${w}.spec.template: no replicatedJob labelled ${ANCESTOR}: trainer (Trainer gives numNodes, resourcesPerNode and env to that one)`);
      else if (!(node.template.spec?.template?.spec?.containers ?? []).some((c) => c.name === "node"))
        err(`${w}.spec.template.spec.replicatedJobs[${node.name}]: no container named node (Trainer v2.0 applies the TrainJob's trainer to it)`);
    }
    if (o.kind === "TrainJob") {
      const ref = o.spec?.runtimeRef ?? {};
      const rt = runtimeOf(o, bundle);
      const meshrun = (rt?.spec?.template?.spec?.replicatedJobs ?? []).some((r) =>
        r.template?.spec?.template?.metadata?.labels?.["app.kubernetes.io/name"] === AGENT);
      if (!meshrun)
        err(`${w}.spec.runtimeRef: names ${ref.kind ?? "ClusterTrainingRuntime"} '${ref.name}', which is not a meshrun runtime in the bundle (deploy/trainer/clustertrainingruntime.yaml)`);
      const t = o.spec?.trainer ?? {};
      for (const k of ["image", "command", "args"])
        if (t[k] !== undefined) err(`${w}.spec.trainer.${k}: the runtime runs meshrun-agent; do not replace its ${k}`);
      const gpus = Number(t.resourcesPerNode?.limits?.["nvidia.com/gpu"] ?? 0);
      if (gpus > 0 && Number(t.numProcPerNode) !== gpus)
        err(`${w}.spec.trainer: numProcPerNode (${t.numProcPerNode}) must equal resourcesPerNode's nvidia.com/gpu (${gpus}), one GPU per rank`);
    }
  }
}

function checkController(o, bundle, err) {
  const s = o.spec ?? {};
  const w = label(o);
  if (s.replicas !== 1) err(`${w}.spec.replicas: must be 1 (one controller per data dir)`);
  if (s.strategy?.type !== "Recreate")
    err(`${w}.spec.strategy.type: must be Recreate (the data dir is locked; RollingUpdate crash-loops the new pod)`);
  const spec = s.template?.spec ?? {};
  for (const c of spec.containers ?? []) {
    const dir = argValue(c, "--data-dir") ?? envOf(c).get("MESHRUN_DATA_DIR")?.value;
    const v = dir && volumeFor(spec, c, dir);
    if (!v?.persistentVolumeClaim) {
      err(`${w}: the data dir '${dir}' must be on a PersistentVolumeClaim`);
      continue;
    }
    const pvc = bundle.find((x) => x.kind === "PersistentVolumeClaim" &&
      x.metadata?.name === v.persistentVolumeClaim.claimName);
    if (pvc && JSON.stringify(pvc.spec?.accessModes) !== JSON.stringify(["ReadWriteOnce"]))
      err(`${label(pvc)}.spec.accessModes: must be [ReadWriteOnce] (flock does not hold across nodes on shared volumes)`);
  }
}

function checkSelectors(bundle, pods, err) {
  for (const o of bundle) {
    const w = label(o);
    if (o.kind === "Deployment" && !matches(o.spec?.selector, o.spec?.template?.metadata?.labels))
      err(`${w}.spec.selector: does not match the template's labels`);
    if (o.kind === "Service" && o.spec?.selector) {
      const hit = pods.filter((p) => matches(o.spec.selector, p.tpl.metadata?.labels) ||
        (p.job && o.spec.selector["batch.kubernetes.io/job-name"] === p.owner.metadata?.name));
      if (!hit.length) err(`${w}.spec.selector: selects no pod of the bundle`);
      for (const port of o.spec.ports ?? [])
        if (typeof port.targetPort === "string" && hit.length &&
            !hit.some((p) => (p.tpl.spec.containers ?? []).some((c) =>
              (c.ports ?? []).some((q) => q.name === port.targetPort))))
          err(`${w}.spec.ports[${port.name}]: no selected container has a port named ${port.targetPort}`);
    }
    if (o.kind === "NetworkPolicy" && !pods.some((p) => matches(o.spec?.podSelector, p.tpl.metadata?.labels)))
      err(`${w}.spec.podSelector: selects no pod of the bundle`);
    if (o.kind === "PodDisruptionBudget" && !pods.some((p) => matches(o.spec?.selector, p.tpl.metadata?.labels)))
      err(`${w}.spec.selector: selects no pod of the bundle`);
    if (o.kind === "PodMonitor") {
      const hit = pods.filter((p) => matches(o.spec?.selector, p.tpl.metadata?.labels));
      if (!hit.length) err(`${w}.spec.selector: selects no agent pod of the bundle`);
      for (const ep of o.spec?.podMetricsEndpoints ?? [])
        if (!hit.every((p) => p.tpl.spec.containers.some((c) => (c.ports ?? []).some((q) => q.name === ep.port))))
          err(`${w}.spec.podMetricsEndpoints[${ep.port}]: not a port name of every selected pod`);
    }
    if (o.kind === "ServiceMonitor") {
      const svcs = bundle.filter((s) => s.kind === "Service" && matches(o.spec?.selector, s.metadata?.labels));
      if (!svcs.length) err(`${w}.spec.selector: selects no Service of the bundle`);
      for (const ep of o.spec?.endpoints ?? [])
        if (!svcs.every((s) => (s.spec?.ports ?? []).some((q) => q.name === ep.port)))
          err(`${w}.spec.endpoints[${ep.port}]: not a port name of the selected Service`);
    }
    if (o.kind === "ConfigMap" && o.metadata?.labels?.grafana_dashboard !== undefined) {
      for (const [k, v] of Object.entries(o.data ?? {})) {
        try {
          const d = JSON.parse(v);
          if (!d.uid || !Array.isArray(d.panels)) throw new Error("no uid or panels");
        } catch (x) {
          err(`${w}.data[${k}]: not a Grafana dashboard: ${x.message}`);
        }
      }
    }
  }
}

// ---- TLS --------------------------------------------------------------------

const CERT_KEYS = ["tls.crt", "tls.key", "ca.crt"]; // what cert-manager writes
const isController = (p) => p.tpl.metadata?.labels?.["app.kubernetes.io/name"] === CONTROLLER;

/** FLAG or ENV of container C (the flag wins, as in meshrun's config). */
function setting(c, flag, name) {
  return argValue(c, flag) ?? envOf(c).get(name)?.value;
}

/** The controller's TLS files of pod P: {cert, key, clientCA, c} or null (plain HTTP). */
function controllerTls(p) {
  const c = (p.tpl.spec?.containers ?? []).find((x) => x.name === "controller") ?? p.tpl.spec?.containers?.[0];
  const cert = c && setting(c, "--tls-cert", "MESHRUN_TLS_CERT");
  if (!cert) return null;
  return { c, cert, key: setting(c, "--tls-key", "MESHRUN_TLS_KEY"),
    clientCA: setting(c, "--tls-client-ca", "MESHRUN_TLS_CLIENT_CA") };
}

/** The host and scheme of URL, or null. */
function urlParts(url) {
  const m = /^(\w+):\/\/(\[[^\]]+\]|[^/:]+)/.exec(url ?? "");
  return m && { scheme: m[1], host: m[2] };
}

/** The controller pods an agent pod P calls at URL: through a Service, or its own JobSet's. */
function controllersOf(p, url, bundle, pods) {
  const host = urlParts(url)?.host;
  if (!host) return [];
  const first = host.split(".")[0];
  const svc = bundle.find((o) => o.kind === "Service" && o.metadata?.name === first && o.spec?.selector);
  if (svc) return pods.filter((q) => isController(q) && matches(svc.spec.selector, q.tpl.metadata?.labels));
  return pods.filter((q) => isController(q) && q.owner === p.owner && p.owner.kind === "JobSet");
}

/**
 * Where the file at PATH of container C comes from: {volume, mount, key,
 * secret} (secret: the Secret's name, or undefined for another volume
 * type); errors for a subPath mount, a file on no Secret or ConfigMap, or
 * a Secret neither in the bundle nor written by a Certificate in it.
 */
function tlsSource(spec, c, path, what, cw, bundle, err) {
  const sub = (c.volumeMounts ?? []).find((m) => m.subPath !== undefined &&
    (path === m.mountPath || path.startsWith(`${m.mountPath.replace(/\/$/, "")}/`)));
  if (sub) {
    err(`${cw}.volumeMounts[${sub.name}]: ${what} '${path}' is mounted with subPath: a subPath mount is copied once and never sees the Secret rotated; mount the volume whole`);
    return null;
  }
  const v = volumeFor(spec, c, path);
  const m = v && (c.volumeMounts ?? []).find((x) => x.name === v.name);
  const src = v?.secret ?? v?.configMap;
  if (!src) {
    err(`${cw}: ${what} '${path}' is not on a Secret or ConfigMap volume`);
    return null;
  }
  const rel = path.slice(m.mountPath.replace(/\/$/, "").length + 1);
  const key = src.items ? src.items.find((i) => i.path === rel)?.key : rel;
  if (!key) {
    err(`${cw}: ${what} '${path}': no item of volume ${v.name} has path '${rel}'`);
    return null;
  }
  if (v.configMap) return { volume: v, key };
  const name = v.secret.secretName;
  const secret = bundle.find((o) => o.kind === "Secret" && o.metadata?.name === name);
  const cert = bundle.find((o) => o.kind === "Certificate" && o.spec?.secretName === name);
  if (secret) {
    if (secret.data?.[key] === undefined && secret.stringData?.[key] === undefined)
      err(`${cw}: ${what} '${path}': Secret '${name}' has no key '${key}'`);
  } else if (cert) {
    if (!CERT_KEYS.includes(key))
      err(`${cw}: ${what} '${path}': key '${key}' is not one cert-manager writes (${CERT_KEYS.join(", ")})`);
  } else {
    err(`${cw}: ${what} '${path}': Secret '${name}' is neither in the bundle nor the secretName of a Certificate in it`);
  }
  return { volume: v, key, secret: name, certificate: cert };
}

function checkTls(bundle, pods, err) {
  // the controllers: their files, probes and certificate
  const served = new Map(); // pod -> {tls, certificate}
  for (const p of pods.filter(isController)) {
    const tls = controllerTls(p);
    if (!tls) continue;
    const spec = p.tpl.spec ?? {};
    const cw = `${label(p.owner)} ${p.path}.spec.containers[${tls.c.name}]`;
    if (!tls.key) err(`${cw}: --tls-cert without --tls-key`);
    const src = tlsSource(spec, tls.c, tls.cert, "--tls-cert", cw, bundle, err);
    if (tls.key) tlsSource(spec, tls.c, tls.key, "--tls-key", cw, bundle, err);
    if (tls.clientCA) tlsSource(spec, tls.c, tls.clientCA, "--tls-client-ca", cw, bundle, err);
    for (const probe of ["startupProbe", "livenessProbe", "readinessProbe"]) {
      const h = tls.c[probe]?.httpGet;
      if (h && h.scheme !== "HTTPS")
        err(`${cw}.${probe}.httpGet.scheme: must be HTTPS: the controller serves TLS, and a plain-HTTP probe fails its handshake`);
    }
    served.set(p, { tls, certificate: src?.certificate });
  }
  // the Services in front of a TLS controller: the certificate must name them
  for (const [p, s] of served) {
    if (!s.certificate) continue;
    const names = s.certificate.spec?.dnsNames ?? [];
    for (const svc of bundle.filter((o) => o.kind === "Service" && o.spec?.selector &&
        matches(o.spec.selector, p.tpl.metadata?.labels)))
      if (!names.includes(svc.metadata.name))
        err(`${label(s.certificate)}.spec.dnsNames: misses '${svc.metadata.name}', the Service of the controller it serves (${label(p.owner)}): a client that calls the Service fails the host name check`);
  }
  // the agents
  for (const p of pods) {
    if (p.runtime || p.tpl.metadata?.labels?.["app.kubernetes.io/name"] !== AGENT) continue;
    const spec = p.tpl.spec ?? {};
    for (const c of spec.containers ?? []) {
      const env = envOf(c);
      const url = setting(c, "--controller", "MESHRUN_CONTROLLER");
      if (url === undefined) continue;
      const cw = `${label(p.owner)} ${p.path}.spec.containers[${c.name}]`;
      const ca = setting(c, "--tls-ca", "MESHRUN_TLS_CA");
      const cert = setting(c, "--tls-cert", "MESHRUN_TLS_CERT");
      const key = setting(c, "--tls-key", "MESHRUN_TLS_KEY");
      const tls = controllersOf(p, url, bundle, pods).map((q) => [q, served.get(q)]).filter(([, s]) => s);
      const scheme = urlParts(url)?.scheme;
      if ((tls.length || ca) && scheme !== "https")
        err(`${cw}.env[MESHRUN_CONTROLLER]: '${url}' must be https://: ${tls.length ? `the controller (${label(tls[0][0].owner)}) serves TLS` : "MESHRUN_TLS_CA is set"}, and a plain request fails its handshake`);
      if (ca) tlsSource(spec, c, ca, "MESHRUN_TLS_CA", cw, bundle, err);
      if (cert) tlsSource(spec, c, cert, "MESHRUN_TLS_CERT", cw, bundle, err);
      if (key) tlsSource(spec, c, key, "MESHRUN_TLS_KEY", cw, bundle, err);
      if (!cert !== !key) err(`${cw}.env: MESHRUN_TLS_CERT and MESHRUN_TLS_KEY go together`);
      if (!tls.length) continue;
      const [q, s] = tls[0];
      if (!ca)
        err(`${cw}.env: MESHRUN_TLS_CA is required: the controller (${label(q.owner)}) serves TLS, and its cluster CA is not among the system's`);
      if (s.tls.clientCA && !(cert && key))
        err(`${cw}.env: MESHRUN_TLS_CERT and MESHRUN_TLS_KEY are required: the controller (${label(q.owner)}) asks for a client certificate (--tls-client-ca), and every call without one is refused`);
      const host = urlParts(url).host;
      const names = s.certificate?.spec?.dnsNames;
      if (names && !names.includes(host) && !(s.certificate.spec.ipAddresses ?? []).includes(host))
        err(`${label(s.certificate)}.spec.dnsNames: misses '${host}', the host of ${cw}'s MESHRUN_CONTROLLER: the agent fails the host name check`);
    }
  }
  // Prometheus scraping a TLS controller through its Service
  for (const o of bundle.filter((x) => x.kind === "ServiceMonitor")) {
    const svcs = bundle.filter((s) => s.kind === "Service" && matches(o.spec?.selector, s.metadata?.labels));
    const tls = [...served].filter(([p]) => svcs.some((s) => s.spec?.selector &&
      matches(s.spec.selector, p.tpl.metadata?.labels)));
    if (!tls.length) continue;
    const [, s] = tls[0];
    for (const ep of o.spec?.endpoints ?? []) {
      const w = `${label(o)}.spec.endpoints[${ep.port}]`;
      if (ep.scheme !== "https") err(`${w}.scheme: must be https: the controller serves TLS`);
      const tc = ep.tlsConfig ?? {};
      if (!tc.ca) err(`${w}.tlsConfig.ca: required: Prometheus must verify the controller with its CA`);
      const names = s.certificate?.spec?.dnsNames;
      if (!tc.serverName || (names && !names.includes(tc.serverName)))
        err(`${w}.tlsConfig.serverName: must be one of the certificate's DNS names (Prometheus scrapes the pod by IP)`);
      if (s.tls.clientCA && !(tc.cert && tc.keySecret))
        err(`${w}.tlsConfig: cert and keySecret are required: the controller asks for a client certificate on /metrics`);
    }
  }
}

/**
 * Every policy error of BUNDLE (an array of objects). opts.requireGpu:
 * agents must request one nvidia.com/gpu per rank (the GPU examples).
 */
export function checkPolicy(bundle, opts = {}) {
  const errors = [];
  const err = (m) => errors.push(m);
  const pods = podTemplates(bundle);
  for (const p of pods) checkPod(p, bundle, opts, err);
  for (const o of bundle) {
    if (o.kind === "Deployment" && o.spec?.template?.metadata?.labels?.["app.kubernetes.io/name"] === CONTROLLER)
      checkController(o, bundle, err);
    if (o.kind === "Job" && o.apiVersion === "batch/v1") checkIndexedJob(o, o.spec ?? {}, `${label(o)}.spec`, bundle, err);
    if (o.kind === "Job" && o.apiVersion === "batch.volcano.sh/v1alpha1") checkVolcano(o, err);
    if (o.kind === "ClusterTrainingRuntime" && o.spec?.template?.spec) {
      const w = `${label(o)}.spec.template`;
      checkJobSet(o, o.spec.template.spec, w, err);
      (o.spec.template.spec.replicatedJobs ?? []).forEach((r) =>
        checkIndexedJob(o, r.template?.spec ?? {}, `${w}.spec.replicatedJobs[${r.name}].template.spec`, bundle, err));
    }
    if (o.kind === "JobSet") {
      checkJobSet(o, o.spec ?? {}, label(o), err);
      (o.spec?.replicatedJobs ?? []).forEach((r) =>
        checkIndexedJob(o, r.template?.spec ?? {}, `${label(o)}.spec.replicatedJobs[${r.name}].template.spec`, bundle, err));
    }
  }
  checkKueue(bundle, pods, err);
  checkTrainer(bundle, err);
  checkSelectors(bundle, pods, err);
  checkTls(bundle, pods, err);
  return errors;
}
