// schema.mjs - validation of Kubernetes objects without a cluster.
//
// Three layers, each able to reject an object:
// 1. the Kubernetes OpenAPI schemas as compiled by the kubernetes-models
//    packages (core and prometheus-operator): types, required fields,
//    enums, formats;
// 2. strict field validation, as the API server does it since 1.25: a
//    field the type does not have is an error. The compiled schemas do not
//    close objects, so the field lists are read from the same packages'
//    type declarations (.d.ts, generated from the same OpenAPI documents);
// 3. CRDs without a models package (Volcano Job, JobSet, Kueue's queues
//    and Topology, Kubeflow Trainer's ClusterTrainingRuntime and TrainJob,
//    cert-manager's Certificate, Issuer and ClusterIssuer):
//    JSON Schemas written down from their published CRDs, at the versions
//    schemas/README.md pins, with the embedded pod and job templates (and a
//    TrainJob's env and resourcesPerNode) checked by layers 1 and 2.
//
// Non-goals: admission webhooks and defaulting (policy.mjs checks what
// meshrun needs beyond the schemas).
import { readFileSync, existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import Ajv from "ajv";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);

// apiVersion -> module prefix of the models package
const GROUPS = {
  "v1": "kubernetes-models/v1",
  "apps/v1": "kubernetes-models/apps/v1",
  "batch/v1": "kubernetes-models/batch/v1",
  "policy/v1": "kubernetes-models/policy/v1",
  "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1",
  "rbac.authorization.k8s.io/v1": "kubernetes-models/rbac.authorization.k8s.io/v1",
  "monitoring.coreos.com/v1":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
};

// ---- layer 2: field lists from the .d.ts files ---------------------------

const dtsCache = new Map();

function resolveDts(spec, fromFile) {
  let p;
  if (spec.startsWith(".")) {
    p = resolve(dirname(fromFile), spec);
  } else {
    // a package path: "@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta"
    const parts = spec.split("/");
    const pkg = spec.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0];
    const rest = parts.slice(spec.startsWith("@") ? 2 : 1).join("/");
    p = join(dirname(require.resolve(`${pkg}/package.json`)), rest);
  }
  p = p.replace(/\.js$/, "");
  return p.endsWith(".d.ts") ? p : `${p}.d.ts`;
}

// Parses the first exported interface of a .d.ts: property -> type text.
// Returns null for a type alias (a primitive union such as IntOrString).
function parseDts(file) {
  if (dtsCache.has(file)) return dtsCache.get(file);
  const text = readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/import \{ (\w+) \} from "([^"]+)";/g))
    imports.set(m[1], resolveDts(m[2], file));
  const start = text.search(/export interface I\w+( extends [\w, ]+)? \{/);
  let result = null;
  if (start >= 0) {
    const props = new Map();
    const head = text.slice(start, text.indexOf("{", start));
    if (/extends .*TypeMeta/.test(head)) {
      props.set("apiVersion", "string");
      props.set("kind", "string");
    }
    // fields inherited from interfaces of the package (an Endpoint's
    // tlsConfig comes from HTTPConfigWithProxyAndTLSFiles)
    for (const base of (head.match(/extends ([\w, ]+)/)?.[1] ?? "").trim().split(/,\s*/)) {
      const inherited = imports.has(base) && parseDts(imports.get(base));
      if (!inherited) continue;
      for (const [k, v] of inherited.props) props.set(k, v);
      for (const [k, v] of inherited.imports) if (!imports.has(k)) imports.set(k, v);
    }
    const lines = text.slice(text.indexOf("{", start) + 1).split("\n");
    let depth = 1;
    let inComment = false;
    let pending = null; // [name, collected text] of a multi-line type
    for (const line of lines) {
      const t = line.trim();
      if (inComment) {
        if (t.includes("*/")) inComment = false;
        continue;
      }
      if (t.startsWith("/**") || t.startsWith("/*")) {
        if (!t.includes("*/")) inComment = true;
        continue;
      }
      if (pending) {
        pending[1] += ` ${t}`;
        depth += (t.match(/\{/g) || []).length - (t.match(/\}/g) || []).length;
        if (depth === 1) {
          props.set(pending[0], pending[1].replace(/;$/, "").trim());
          pending = null;
        }
        continue;
      }
      if (depth === 1 && t === "}") break;
      const m = t.match(/^"([^"]+)"\??: (.*)$/);
      if (m && depth === 1) {
        const opens = (m[2].match(/\{/g) || []).length - (m[2].match(/\}/g) || []).length;
        if (opens > 0) {
          pending = [m[1], m[2]];
          depth += opens;
        } else {
          props.set(m[1], m[2].replace(/;$/, ""));
        }
      }
    }
    result = { props, imports };
  }
  dtsCache.set(file, result);
  return result;
}

// Type text -> checker node: {kind: "object", file} | {kind: "array", of} |
// {kind: "map", of} | {kind: "leaf"}.
function typeNode(typeText, imports) {
  const t = typeText.trim();
  let m = t.match(/^Array<(.*)>$/);
  if (m) return { kind: "array", of: typeNode(m[1], imports) };
  m = t.match(/^\{\s*\[key: string\]: (.*?);?\s*\}$/);
  if (m) return { kind: "map", of: typeNode(m[1], imports) };
  if (/^I\w+$/.test(t) && imports.has(t)) return { kind: "object", file: imports.get(t) };
  return { kind: "leaf" };
}

function strictCheck(value, node, path, errors) {
  if (value === null || value === undefined) return;
  if (node.kind === "array") {
    if (Array.isArray(value)) value.forEach((v, i) => strictCheck(v, node.of, `${path}[${i}]`, errors));
    return;
  }
  if (node.kind === "map") {
    if (typeof value === "object" && !Array.isArray(value))
      for (const [k, v] of Object.entries(value)) strictCheck(v, node.of, `${path}.${k}`, errors);
    return;
  }
  if (node.kind !== "object" || typeof value !== "object" || Array.isArray(value)) return;
  const iface = parseDts(node.file);
  if (!iface) return; // a type alias: checked by layer 1
  for (const [k, v] of Object.entries(value)) {
    if (!iface.props.has(k)) {
      errors.push(`${path}: unknown field "${k}"`);
      continue;
    }
    strictCheck(v, typeNode(iface.props.get(k), iface.imports), `${path}.${k}`, errors);
  }
}

function modelFile(apiVersion, kind) {
  const prefix = GROUPS[apiVersion];
  if (!prefix) return null;
  const p = resolveDts(`${prefix}/${kind}`, here);
  return existsSync(p) ? p : null;
}

/** Strict field check of VALUE as the models type at MODULE ("kubernetes-models/v1/PodTemplateSpec"). */
export function strictFields(value, module, path) {
  const errors = [];
  strictCheck(value, { kind: "object", file: resolveDts(module, here) }, path, errors);
  return errors;
}

// ---- layer 1: the compiled OpenAPI validators ------------------------------

async function modelValidate(module, value, path) {
  const mod = await import(module);
  const Model = Object.values(mod).find((v) => typeof v === "function" && v.prototype?.validate);
  try {
    new Model(value).validate();
    return [];
  } catch (e) {
    return String(e.message).split(", ").map((s) => `${path}: ${s.replace(/^data\/?/, "/")}`);
  }
}

// ---- layer 3: CRDs without a models package -------------------------------

const ajv = new Ajv({ allErrors: true, strict: false });
const schemaFile = (f) => JSON.parse(readFileSync(join(here, "schemas", f), "utf8"));
for (const f of ["volcano-job", "jobset", "kueue", "trainer", "cert-manager"])
  ajv.addSchema(schemaFile(`${f}.schema.json`));
// apiVersion/kind -> the schema (an $id, or a definition inside one)
const crdSchemas = {
  "batch.volcano.sh/v1alpha1/Job": ajv.getSchema("volcano-job"),
  "jobset.x-k8s.io/v1alpha2/JobSet": ajv.getSchema("jobset"),
  "kueue.x-k8s.io/v1beta1/ResourceFlavor": ajv.getSchema("kueue#/$defs/resourceFlavor"),
  "kueue.x-k8s.io/v1beta1/ClusterQueue": ajv.getSchema("kueue#/$defs/clusterQueue"),
  "kueue.x-k8s.io/v1beta1/LocalQueue": ajv.getSchema("kueue#/$defs/localQueue"),
  "kueue.x-k8s.io/v1alpha1/Topology": ajv.getSchema("kueue#/$defs/topology"),
  "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime":
    ajv.getSchema("trainer#/$defs/clusterTrainingRuntime"),
  "trainer.kubeflow.org/v1alpha1/TrainJob": ajv.getSchema("trainer#/$defs/trainJob"),
  "cert-manager.io/v1/Certificate": ajv.getSchema("cert-manager#/$defs/certificate"),
  "cert-manager.io/v1/Issuer": ajv.getSchema("cert-manager#/$defs/issuer"),
  "cert-manager.io/v1/ClusterIssuer": ajv.getSchema("cert-manager#/$defs/clusterIssuer"),
};

async function templates(obj) {
  // [value, models module, path] of the Kubernetes objects a CRD embeds
  const JT = "kubernetes-models/batch/v1/JobTemplateSpec";
  if (obj.kind === "Job" && obj.apiVersion === "batch.volcano.sh/v1alpha1")
    return (obj.spec?.tasks || []).map((t, i) => [t.template, "kubernetes-models/v1/PodTemplateSpec",
      `spec.tasks[${i}].template`]);
  if (obj.kind === "JobSet")
    return (obj.spec?.replicatedJobs || []).map((r, i) => [r.template, JT,
      `spec.replicatedJobs[${i}].template`]);
  if (obj.kind === "ClusterTrainingRuntime")
    return (obj.spec?.template?.spec?.replicatedJobs || []).map((r, i) => [r.template, JT,
      `spec.template.spec.replicatedJobs[${i}].template`]);
  if (obj.kind === "TrainJob") {
    const t = obj.spec?.trainer ?? {};
    return [[t.resourcesPerNode, "kubernetes-models/v1/ResourceRequirements", "spec.trainer.resourcesPerNode"],
      ...(t.env ?? []).map((e, i) => [e, "kubernetes-models/v1/EnvVar", `spec.trainer.env[${i}]`])];
  }
  return [];
}

/** Every schema error of one object, as "path: message" strings. */
export async function validateObject(obj) {
  if (!obj || typeof obj !== "object" || !obj.apiVersion || !obj.kind)
    return ["not a Kubernetes object (apiVersion and kind are required)"];
  const key = `${obj.apiVersion}/${obj.kind}`;
  const crd = crdSchemas[key];
  if (crd) {
    const errors = [];
    if (!crd(obj))
      for (const e of crd.errors) {
        const extra = e.params?.additionalProperty ? ` "${e.params.additionalProperty}"` :
          e.params?.allowedValues ? ` ${JSON.stringify(e.params.allowedValues)}` : "";
        errors.push(`${e.instancePath || "/"}: ${e.message}${extra}`);
      }
    for (const [value, module, path] of await templates(obj)) {
      if (!value) continue;
      errors.push(...await modelValidate(module, value, path));
      errors.push(...strictFields(value, module, path));
    }
    return errors;
  }
  const file = modelFile(obj.apiVersion, obj.kind);
  if (!file) return [`${key}: no schema known for this kind`];
  const prefix = GROUPS[obj.apiVersion];
  const errors = await modelValidate(`${prefix}/${obj.kind}`, obj, key);
  errors.push(...strictFields(obj, `${prefix}/${obj.kind}`, obj.kind));
  return errors;
}
