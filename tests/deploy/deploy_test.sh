#!/usr/bin/env bash
# deploy/ renders offline with `kubectl kustomize`, and every object it renders is valid against the
# Kubernetes OpenAPI schemas (npm's kubernetes-models, pinned by tests/deploy/package-lock.json and
# installed by scripts/test with `npm ci`); the scheduler profile hands Tessera's resources to the
# extender as kube-scheduler needs; the Helm chart holds the same objects.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
here="$src/tests/deploy"
# Named as tests/test_main.cc names its folders: one left by a killed run (a timeout) is swept by
# the next test binary that starts.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-tests-$$-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "deploy_test: $*" >&2; exit 1; }

command -v kubectl >/dev/null || fail "kubectl (with kustomize) is needed to render deploy/"
[ -d "$here/node_modules/kubernetes-models" ] || fail "no $here/node_modules: run scripts/test (npm ci)"

kubectl kustomize "$src/deploy" >"$tmp/rendered.yaml"
node "$here/validate.js" <"$tmp/rendered.yaml" >"$tmp/validate.txt" || { cat "$tmp/validate.txt"; fail "invalid objects"; }
tail -1 "$tmp/validate.txt"

# Each piece is there; nothing a bare cluster lacks (no Prometheus Operator kinds: a ServiceMonitor
# would make `kubectl apply -k deploy/` fail where its CRD is not installed).
for want in "kind: DaemonSet" "name: tessera-agent" "name: tessera-extender" \
            "name: tessera-grafana-dashboard" "name: tessera-quotas" "name: tessera-scheduler-config"; do
  grep -q "$want" "$tmp/rendered.yaml" || fail "rendered deploy/ has no '$want'"
done
if grep -q "^apiVersion: monitoring.coreos.com" "$tmp/rendered.yaml"; then
  fail "deploy/ renders Prometheus Operator objects without deploy/components/monitoring"
fi
# The monitoring component adds the ServiceMonitor, valid, in the overlay form the docs give.
mkdir -p "$tmp/overlay"
cp -r "$src/deploy" "$tmp/overlay/deploy"
printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - deploy\ncomponents:\n  - deploy/components/monitoring\n' >"$tmp/overlay/kustomization.yaml"
kubectl kustomize "$tmp/overlay" >"$tmp/monitoring.yaml"
grep -q "^kind: ServiceMonitor" "$tmp/monitoring.yaml" || fail "components/monitoring adds no ServiceMonitor"
grep -q "^kind: PrometheusRule" "$tmp/monitoring.yaml" || fail "components/monitoring adds no PrometheusRule"
# Its groups are deploy/prometheus/tessera-rules.yaml's, which promtool checks and unit-tests
# (tests/prometheus/rules_test.yaml, ctest Prometheus.AlertRules).
node -e '
const yaml = require(process.argv[1] + "/node_modules/js-yaml");
const fs = require("fs");
const rule = yaml.loadAll(fs.readFileSync(process.argv[2], "utf8")).find((d) => d && d.kind === "PrometheusRule");
const plain = yaml.load(fs.readFileSync(process.argv[3], "utf8"));
if (!require("util").isDeepStrictEqual(rule.spec.groups, plain.groups)) {
  console.error("the PrometheusRule differs from deploy/prometheus/tessera-rules.yaml: run scripts/helm-sync");
  process.exit(1);
}' "$here" "$tmp/monitoring.yaml" "$src/deploy/prometheus/tessera-rules.yaml" || fail "PrometheusRule out of date"
node "$here/validate.js" <"$tmp/monitoring.yaml" >/dev/null || fail "invalid objects with components/monitoring"
# Pod Security: the namespace says what the agent needs (host paths), so a cluster enforcing
# baseline by default admits it; the agent'"'"'s pod is indeed outside baseline (a hostPath volume).
node -e '
const yaml = require(process.argv[1] + "/node_modules/js-yaml");
const docs = yaml.loadAll(require("fs").readFileSync(process.argv[2], "utf8")).filter(Boolean);
const fail = (m) => { console.error("deploy_test: pod security: " + m); process.exit(1); };
const ns = docs.find((d) => d.kind === "Namespace" && d.metadata.name === "tessera-system");
const l = (ns && ns.metadata.labels) || {};
for (const mode of ["enforce", "audit", "warn"])
  if (l["pod-security.kubernetes.io/" + mode] !== "privileged") fail("tessera-system has no " + mode + "=privileged label");
const ds = docs.find((d) => d.kind === "DaemonSet" && d.metadata.name === "tessera-agent");
if (!ds.spec.template.spec.volumes.some((v) => v.hostPath)) fail("the agent needs no host path: the label could be baseline");
// The scheduler image: kube-scheduler 1.34+ (DRA, and the documented Kubernetes version).
const s = docs.find((d) => d.kind === "Deployment" && d.metadata.name === "tessera-scheduler");
const tag = s.spec.template.spec.containers[0].image.split(":").pop();
const m = /^v1\.(\d+)\.\d+$/.exec(tag);
if (!m || Number(m[1]) < 34) fail("kube-scheduler " + tag + ": the docs ask for 1.34+");
// The library goes on the host by rename, never over a file pods have mapped.
const init = ds.spec.template.spec.initContainers.find((c) => c.name === "install-intercept-library");
if (!init || init.command[0] === "cp" || !init.command.includes("install-library")) fail("the library is installed with " + (init ? init.command.join(" ") : "nothing"));
' "$here" "$tmp/rendered.yaml"
# The scheduler profile: both resources managed and ignored by kube-scheduler's own fit check,
# node-cache-capable, all four verbs.
node -e '
const yaml = require(process.argv[1] + "/node_modules/js-yaml");
const docs = yaml.loadAll(require("fs").readFileSync(process.argv[2], "utf8"));
const cm = docs.find((d) => d && d.kind === "ConfigMap" && d.metadata.name === "tessera-scheduler-config");
const cfg = yaml.load(cm.data["config.yaml"]);
const fail = (m) => { console.error("deploy_test: scheduler config: " + m); process.exit(1); };
if (cfg.kind !== "KubeSchedulerConfiguration") fail("not a KubeSchedulerConfiguration");
// kube-scheduler decodes its config strictly: an unknown field or a wrong type stops it. Every
// field checked against upstream'"'"'s kubescheduler.config.k8s.io/v1 types (kubernetes/kube-scheduler
// config/v1/types.go, and component-base'"'"'s leader election, client connection and debugging
// configurations it embeds), by JSON name and kind.
if (cfg.apiVersion !== "kubescheduler.config.k8s.io/v1") fail("apiVersion " + cfg.apiVersion + ", not kubescheduler.config.k8s.io/v1");
const str = "string", int = "int", bool = "bool", dur = "duration", float = "float";
const pluginSet = { enabled: [{ name: str, weight: int }], disabled: [{ name: str, weight: int }] };
const plugins = Object.fromEntries(["preEnqueue", "queueSort", "preFilter", "filter", "postFilter",
  "preScore", "score", "reserve", "permit", "preBind", "bind", "postBind", "multiPoint",
  "placementGenerate", "placementScore", "podGroupPostFilter"].map((k) => [k, pluginSet]));
const schema = {
  apiVersion: str, kind: str, parallelism: int, percentageOfNodesToScore: int,
  podInitialBackoffSeconds: int, podMaxBackoffSeconds: int, delayCacheUntilActive: bool,
  enableProfiling: bool, enableContentionProfiling: bool,
  leaderElection: { leaderElect: bool, leaseDuration: dur, renewDeadline: dur, retryPeriod: dur,
    resourceLock: str, resourceName: str, resourceNamespace: str },
  clientConnection: { kubeconfig: str, acceptContentTypes: str, contentType: str, qps: float, burst: int },
  profiles: [{ schedulerName: str, percentageOfNodesToScore: int, plugins,
    pluginConfig: [{ name: str, args: "any" }] }],
  extenders: [{ urlPrefix: str, filterVerb: str, preemptVerb: str, prioritizeVerb: str, weight: int,
    bindVerb: str, enableHTTPS: bool, httpTimeout: dur, nodeCacheCapable: bool, ignorable: bool,
    tlsConfig: { insecure: bool, serverName: str, certFile: str, keyFile: str, caFile: str,
      certData: str, keyData: str, caData: str },
    managedResources: [{ name: str, ignoredByScheduler: bool }] }],
};
const check = (v, t, where) => {
  if (t === "any") return;
  if (Array.isArray(t)) {
    if (!Array.isArray(v)) fail(where + ": expected a list");
    v.forEach((x, i) => check(x, t[0], where + "[" + i + "]"));
  } else if (typeof t === "object") {
    if (v === null || typeof v !== "object" || Array.isArray(v)) fail(where + ": expected an object");
    for (const k of Object.keys(v)) {
      if (!(k in t)) fail(where + "." + k + ": not a field of upstream'"'"'s type (strict decoding refuses it)");
      check(v[k], t[k], where + "." + k);
    }
  } else if (t === int ? !Number.isInteger(v) : t === float ? typeof v !== "number" :
             t === bool ? typeof v !== "boolean" : typeof v !== "string" ||
             (t === dur && !/^([0-9.]+(ns|us|ms|s|m|h))+$/.test(v))) {
    fail(where + ": expected a " + t + ", got " + JSON.stringify(v));
  }
};
check(cfg, schema, "config");
if (!cfg.profiles.some((p) => p.schedulerName === "tessera")) fail("no profile tessera");
const ex = cfg.extenders && cfg.extenders[0];
if (!ex) fail("no extender");
for (const v of ["filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb"]) if (!ex[v]) fail("no " + v);
if (ex.nodeCacheCapable !== true) fail("not nodeCacheCapable");
for (const r of ["tessera.io/gpu", "tessera.io/gpu-share"]) {
  const m = ex.managedResources.find((x) => x.name === r);
  if (!m || m.ignoredByScheduler !== true) fail(r + " must be managed and ignoredByScheduler");
}
// Every feasible node is offered to the extender (a gang member'"'"'s reserved node is never left out).
if (cfg.percentageOfNodesToScore !== 100) fail("percentageOfNodesToScore must be 100");
// Its leader-election lease: upstream'"'"'s bootstrap role system:kube-scheduler lets a scheduler get
// and update only the lease named kube-scheduler, so the profile'"'"'s own resourceName needs a rule
// of ours, bound to the scheduler'"'"'s service account, in the lease'"'"'s namespace.
const le = cfg.leaderElection || {};
if (le.leaderElect) {
  const ns = le.resourceNamespace || "kube-system", name = le.resourceName || "kube-scheduler";
  const sched = docs.find((d) => d && d.kind === "Deployment" && d.metadata.name === "tessera-scheduler");
  const sa = sched.spec.template.spec.serviceAccountName;
  const roles = docs.filter((d) => d && d.kind === "Role" && d.metadata.namespace === ns &&
    (d.rules || []).some((r) => (r.apiGroups || []).includes("coordination.k8s.io") &&
      (r.resources || []).includes("leases") && ["get", "update"].every((v) => (r.verbs || []).includes(v)) &&
      (!r.resourceNames || r.resourceNames.includes(name))));
  const bound = docs.some((d) => d && d.kind === "RoleBinding" && d.metadata.namespace === ns &&
    d.roleRef.kind === "Role" && roles.some((r) => r.metadata.name === d.roleRef.name) &&
    (d.subjects || []).some((s) => s.kind === "ServiceAccount" && s.name === sa));
  if (name !== "kube-scheduler" && !bound)
    fail("no Role granting get/update of lease " + ns + "/" + name + " bound to " + sa);
}
// The agent'"'"'s RBAC patches any node and pod; the admission policy narrows it to its own node and
// the pods bound there: it must name the agent'"'"'s own service account, cover nodes and pods, and
// be bound to deny.
{
  const ds = docs.find((d) => d && d.kind === "DaemonSet" && d.metadata.name === "tessera-agent");
  const user = "system:serviceaccount:" + ds.metadata.namespace + ":" + ds.spec.template.spec.serviceAccountName;
  const vap = docs.find((d) => d && d.kind === "ValidatingAdmissionPolicy" && d.metadata.name === "tessera-agent-own-node");
  if (!vap) fail("no admission policy narrowing the agent to its own node");
  if (!(vap.spec.matchConditions || []).some((c) => c.expression.includes(JSON.stringify(user))))
    fail("the agent policy does not match the agent'"'"'s service account " + user);
  const rules = vap.spec.matchConstraints.resourceRules;
  for (const r of ["nodes", "pods"])
    if (!rules.some((x) => x.resources.includes(r) && x.operations.includes("UPDATE")))
      fail("the agent policy does not cover updates of " + r);
  if (!vap.spec.validations.some((v) => v.expression.includes("authentication.kubernetes.io/node-name")))
    fail("the agent policy does not read the node-name claim");
  const bind = docs.find((d) => d && d.kind === "ValidatingAdmissionPolicyBinding" && d.spec.policyName === vap.metadata.name);
  if (!bind || !bind.spec.validationActions.includes("Deny")) fail("the agent policy is not bound to Deny");
}
// The agent'"'"'s pod/namespace/container labels arrive as they are (not exported_*).
const sm = docs.find((d) => d && d.kind === "ServiceMonitor");
if (!sm.spec.endpoints.every((e) => e.honorLabels === true)) fail("ServiceMonitor endpoints need honorLabels: true");
const dash = docs.find((d) => d && d.kind === "ConfigMap" && d.metadata.name === "tessera-grafana-dashboard");
const board = JSON.parse(dash.data["tessera.json"]);
if (!board.panels || board.panels.length < 5) fail("the Grafana dashboard has too few panels");
' "$here" "$tmp/monitoring.yaml"  # deploy/ with components/monitoring

# The agent on a real GPU node (docs/kubernetes.md, "Node prerequisites"): the host's driver root
# mounted read-only where --driver-root says; with the toolkit's runtime class and every GPU asked
# of it (base), or privileged without a runtime class (the cdi-node component, rendered through an
# overlay as a user's would be, and validated like the rest).
mkdir -p "$tmp/cdi-node"
cp -r "$src/deploy" "$tmp/cdi-node/deploy"
printf 'resources:\n  - deploy\ncomponents:\n  - deploy/components/cdi-node\n' >"$tmp/cdi-node/kustomization.yaml"
kubectl kustomize "$tmp/cdi-node" >"$tmp/cdi-node.yaml"
node "$here/validate.js" <"$tmp/cdi-node.yaml" >"$tmp/validate-cdi.txt" || { cat "$tmp/validate-cdi.txt"; fail "invalid objects with the cdi-node component"; }
node -e '
const yaml = require(process.argv[1] + "/node_modules/js-yaml");
const fs = require("fs");
const agentOf = (f) => yaml.loadAll(fs.readFileSync(f, "utf8")).find((d) => d && d.kind === "DaemonSet" && d.metadata.name === "tessera-agent");
const fail = (m) => { console.error("deploy_test: agent: " + m); process.exit(1); };
for (const [f, toolkit] of [[process.argv[2], true], [process.argv[3], false]]) {
  const pod = agentOf(f).spec.template.spec, c = pod.containers[0];
  const arg = c.args.find((a) => a.startsWith("--driver-root="));
  if (!arg) fail("no --driver-root");
  const at = arg.split("=")[1];
  const m = c.volumeMounts.find((v) => v.mountPath === at);
  const vol = m && pod.volumes.find((v) => v.name === m.name);
  if (!vol || !vol.hostPath || vol.hostPath.path !== "/" || m.readOnly !== true)
    fail("--driver-root " + at + " is not the host'"'"'s / mounted read-only");
  if (m.mountPropagation !== "HostToContainer") fail("the driver root does not follow the host'"'"'s mounts");
  const env = Object.fromEntries((c.env || []).map((e) => [e.name, e.value]));
  if (toolkit) {
    if (pod.runtimeClassName !== "nvidia") fail("base: no runtimeClassName nvidia");
    if (env.NVIDIA_VISIBLE_DEVICES !== "all" || !(env.NVIDIA_DRIVER_CAPABILITIES || "").includes("utility"))
      fail("base: the toolkit is not asked for every GPU and NVML (utility)");
    if (c.securityContext.privileged !== false) fail("base: privileged");
  } else {
    if ("runtimeClassName" in pod) fail("cdi-node: still names a runtime class");
    if (c.securityContext.privileged !== true || c.securityContext.allowPrivilegeEscalation !== true)
      fail("cdi-node: the agent cannot open /dev/nvidia* unprivileged without the toolkit");
  }
}
' "$here" "$tmp/rendered.yaml" "$tmp/cdi-node.yaml"

# MPS (the mps component through an overlay, docs/kubernetes.md "MPS"): the agent runs the daemons
# (--mps-gpus) with CUDA from the toolkit (compute), and its /dev/shm is the host folder
# --mps-shm-dir names, which it mounts into its clients.
mkdir -p "$tmp/mps"
cp -r "$src/deploy" "$tmp/mps/deploy"
printf 'resources:\n  - deploy\ncomponents:\n  - deploy/components/mps\n' >"$tmp/mps/kustomization.yaml"
kubectl kustomize "$tmp/mps" >"$tmp/mps.yaml"
node "$here/validate.js" <"$tmp/mps.yaml" >"$tmp/validate-mps.txt" || { cat "$tmp/validate-mps.txt"; fail "invalid objects with the mps component"; }
node -e '
const yaml = require(process.argv[1] + "/node_modules/js-yaml");
const fs = require("fs");
const fail = (m) => { console.error("deploy_test: mps: " + m); process.exit(1); };
const ds = yaml.loadAll(fs.readFileSync(process.argv[2], "utf8")).find((d) => d && d.kind === "DaemonSet" && d.metadata.name === "tessera-agent");
const pod = ds.spec.template.spec, c = pod.containers[0];
const arg = (n) => (c.args.find((a) => a.startsWith(n + "=")) || "").slice(n.length + 1);
if (!arg("--mps-gpus")) fail("no --mps-gpus");
const shm = arg("--mps-shm-dir");
const m = c.volumeMounts.find((v) => v.mountPath === "/dev/shm");
const vol = m && pod.volumes.find((v) => v.name === m.name);
if (!vol || !vol.hostPath || vol.hostPath.path !== shm) fail("the agent'"'"'s /dev/shm is not the host folder " + shm);
const caps = (c.env.find((e) => e.name === "NVIDIA_DRIVER_CAPABILITIES") || {}).value || "";
if (!caps.split(",").includes("compute") || !caps.split(",").includes("utility")) fail("the daemons get no CUDA (compute) or NVML (utility): " + caps);
' "$here" "$tmp/mps.yaml"

# DRA (the dra component through an overlay, docs/kubernetes.md "DRA or the device plugin"): the
# agent runs with --dra and the kubelet's plugin folders at their paths; the DeviceClasses select
# the driver's devices by type; RBAC grants what the driver calls and no more; the admission policy
# names the agent's service account; the example claims are valid resource.k8s.io/v1.
mkdir -p "$tmp/dra"
cp -r "$src/deploy" "$tmp/dra/deploy"
printf 'resources:\n  - deploy\ncomponents:\n  - deploy/components/dra\n' >"$tmp/dra/kustomization.yaml"
kubectl kustomize "$tmp/dra" >"$tmp/dra.yaml"
node "$here/validate.js" <"$tmp/dra.yaml" >"$tmp/validate-dra.txt" || { cat "$tmp/validate-dra.txt"; fail "invalid objects with the dra component"; }
node "$here/validate.js" <"$src/deploy/examples/dra/claims.yaml" >"$tmp/validate-claims.txt" || { cat "$tmp/validate-claims.txt"; fail "invalid DRA example claims"; }
node "$here/validate.js" <"$src/deploy/examples/mps/pods.yaml" >"$tmp/validate-mps-pods.txt" || { cat "$tmp/validate-mps-pods.txt"; fail "invalid MPS example pods"; }
# Every DeviceClass an example names is one the dra component installs.
for c in $(grep -ho 'deviceClassName: [a-z.-]*' "$src"/deploy/examples/*/*.yaml | sort -u | cut -d' ' -f2); do
  grep -q "^  name: $c$" "$src/deploy/components/dra/deviceclasses.yaml" || fail "an example names DeviceClass $c, which deploy/components/dra does not install"
done
node -e '
const yaml = require(process.argv[1] + "/node_modules/js-yaml");
const docs = yaml.loadAll(require("fs").readFileSync(process.argv[2], "utf8")).filter((d) => d);
const fail = (m) => { console.error("deploy_test: dra: " + m); process.exit(1); };
const ds = docs.find((d) => d.kind === "DaemonSet" && d.metadata.name === "tessera-agent");
const pod = ds.spec.template.spec, c = pod.containers[0];
if (!c.args.includes("--dra")) fail("the agent has no --dra");
for (const p of ["/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry"]) {
  const m = c.volumeMounts.find((v) => v.mountPath === p);
  const v = m && pod.volumes.find((x) => x.name === m.name);
  if (!v || !v.hostPath || v.hostPath.path !== p) fail(p + " is not the host'"'"'s, mounted at its path");
}
const classes = docs.filter((d) => d.kind === "DeviceClass");
for (const [name, type] of [["gpu.tessera.io", "gpu"], ["gpu-share.tessera.io", "share"]]) {
  const k = classes.find((d) => d.metadata.name === name);
  const cel = k && k.spec.selectors.map((s) => s.cel.expression).join(" ");
  if (!cel || !cel.includes("device.driver == \"gpu.tessera.io\"") || !cel.includes(".type == \"" + type + "\""))
    fail("DeviceClass " + name + " does not select the driver'"'"'s " + type + " devices");
}
// What src/tessera/agent/dra_slices.cc and dra_plugin.cc call, exactly.
const want = { resourceslices: ["create", "delete", "list", "update", "watch"], resourceclaims: ["get", "list"] };
const role = docs.find((d) => d.kind === "ClusterRole" && d.metadata.name === "tessera-agent-dra");
for (const [res, verbs] of Object.entries(want)) {
  const r = role.rules.find((x) => x.apiGroups.includes("resource.k8s.io") && x.resources.includes(res));
  if (!r || [...r.verbs].sort().join() !== verbs.join()) fail("ClusterRole tessera-agent-dra: " + res + " verbs " + (r ? r.verbs : "none") + ", want " + verbs);
}
const sa = "system:serviceaccount:" + ds.metadata.namespace + ":" + pod.serviceAccountName;
const vap = docs.find((d) => d.kind === "ValidatingAdmissionPolicy" && d.metadata.name === "tessera-agent-own-slices");
if (!vap || !vap.spec.matchConditions.some((m) => m.expression.includes(sa))) fail("the slice policy does not name " + sa);
if (!docs.some((d) => d.kind === "ValidatingAdmissionPolicyBinding" && d.spec.policyName === "tessera-agent-own-slices" && d.spec.validationActions.includes("Deny")))
  fail("the slice policy is not bound to Deny");
// The extender helps pods with claims: --dra, and kube-scheduler'"'"'s config is the base one with a
// second extender entry (its urlPrefix + /dra) that filters and scores only, for every pod.
const ext = docs.find((d) => d.kind === "Deployment" && d.metadata.name === "tessera-extender");
if (!ext.spec.template.spec.containers[0].args.includes("--dra")) fail("the extender has no --dra");
const cfgOf = (ds) => yaml.load(ds.find((d) => d.kind === "ConfigMap" && d.metadata.name === "tessera-scheduler-config").data["config.yaml"]);
const base = cfgOf(yaml.loadAll(require("fs").readFileSync(process.argv[3], "utf8")).filter((d) => d));
const cfg = cfgOf(docs);
const extra = cfg.extenders.pop();
if (JSON.stringify(cfg) !== JSON.stringify(base)) fail("the scheduler config differs from deploy/base/scheduler.yaml'"'"'s beyond the DRA entry");
const main = base.extenders[0];
if (extra.urlPrefix !== main.urlPrefix + "/dra") fail("DRA entry urlPrefix " + extra.urlPrefix);
if (extra.filterVerb !== "filter" || extra.prioritizeVerb !== "prioritize") fail("DRA entry does not filter and prioritize");
if ("bindVerb" in extra || "preemptVerb" in extra || "managedResources" in extra) fail("DRA entry binds, preempts or manages resources");
if (extra.ignorable !== true) fail("DRA entry is not ignorable");
if (JSON.stringify(extra.tlsConfig) !== JSON.stringify(main.tlsConfig) || extra.enableHTTPS !== true || extra.nodeCacheCapable !== true)
  fail("DRA entry does not call the extender as the main entry does (TLS, node cache)");
for (const k of Object.keys(extra)) if (!(k in main)) fail("DRA entry field " + k + " is not in the main entry'"'"'s (checked against upstream above)");
// Helm'"'"'s dra.enabled block in the scheduler config is the same entry.
const tpl = require("fs").readFileSync(process.argv[4] + "/templates/scheduler.yaml", "utf8");
const block = tpl.split("{{- if .Values.dra.enabled }}\n")[1].split("{{- end }}")[0].replace(/{{ .Release.Namespace }}/g, "tessera-system");
if (JSON.stringify(yaml.load(block)[0]) !== JSON.stringify(extra)) fail("the Helm chart'"'"'s DRA extender entry differs from deploy/components/dra'"'"'s");
' "$here" "$tmp/dra.yaml" "$tmp/rendered.yaml" "$src/deploy/helm/tessera"

# Who may call the extender: HTTPS with kube-scheduler's client certificate from the Secret the
# extender makes (mounted by the scheduler: CA, its certificate and key, not the CA's key), probes
# and metrics on a plain port of their own, a NetworkPolicy letting only the scheduler's pods reach
# the scheduling port, and RBAC for the Secret in the extender's namespace.
node -e '
const yaml = require(process.argv[1] + "/node_modules/js-yaml");
const docs = yaml.loadAll(require("fs").readFileSync(process.argv[2], "utf8")).filter(Boolean);
const fail = (m) => { console.error("deploy_test: extender trust: " + m); process.exit(1); };
const find = (kind, name) => docs.find((d) => d.kind === kind && d.metadata.name === name);
const ext = find("Deployment", "tessera-extender"), sched = find("Deployment", "tessera-scheduler");
const cfg = yaml.load(find("ConfigMap", "tessera-scheduler-config").data["config.yaml"]);
const e = cfg.extenders[0];
if (!e.urlPrefix.startsWith("https://") || e.enableHTTPS !== true) fail("kube-scheduler calls the extender without HTTPS");
const tls = e.tlsConfig || {};
if (tls.insecure) fail("tlsConfig.insecure");
const c = ext.spec.template.spec.containers[0];
const arg = (n) => (c.args.find((a) => a.startsWith(n + "=")) || "").slice(n.length + 1);
const [secretNs, secretName] = arg("--tls-secret").split("/");
if (!secretName || secretNs !== ext.metadata.namespace) fail("the extender keeps no TLS Secret in its namespace");
const spod = sched.spec.template.spec, sc = spod.containers[0];
for (const f of ["caFile", "certFile", "keyFile"]) {
  const p = tls[f] || "";
  const m = sc.volumeMounts.find((v) => p.startsWith(v.mountPath + "/"));
  const vol = m && spod.volumes.find((v) => v.name === m.name);
  if (!vol || !vol.secret || vol.secret.secretName !== secretName)
    fail("tlsConfig." + f + " " + p + " is not from the Secret " + secretName);
  const key = p.slice(m.mountPath.length + 1);
  if (!(vol.secret.items || []).some((i) => i.path === key)) fail("the Secret volume has no " + key);
  if (vol.secret.items.some((i) => i.key === "ca.key" || i.key === "tls.key")) fail("the scheduler mounts the CA'"'"'s or the server'"'"'s key");
}
const port = (name) => (c.ports.find((p) => p.name === name) || {}).containerPort;
const listen = Number(arg("--listen").split(":").pop()), metrics = Number(arg("--metrics-listen").split(":").pop());
if (!metrics || metrics === listen) fail("no separate --metrics-listen");
for (const probe of [c.readinessProbe, c.livenessProbe]) {
  const p = probe.httpGet.port;
  if ((typeof p === "string" ? port(p) : p) !== metrics) fail("a probe not on the metrics port (it has no client certificate)");
}
const np = docs.find((d) => d.kind === "NetworkPolicy" && d.spec.podSelector.matchLabels &&
  d.spec.podSelector.matchLabels["app.kubernetes.io/name"] === "tessera-extender");
if (!np || !np.spec.policyTypes.includes("Ingress")) fail("no NetworkPolicy for the extender'"'"'s pods");
for (const rule of np.spec.ingress) {
  const ports = (rule.ports || []).map((p) => p.port);
  if (ports.length === 0) fail("a NetworkPolicy rule for every port");
  if (ports.includes(listen)) {
    const froms = rule.from || [];
    if (froms.length === 0 || !froms.every((f) => f.podSelector && f.podSelector.matchLabels &&
        f.podSelector.matchLabels["app.kubernetes.io/name"] === "tessera-scheduler"))
      fail("the scheduling port is open to more than the scheduler'"'"'s pods");
  }
}
const roles = docs.filter((d) => d.kind === "Role" && d.metadata.namespace === secretNs);
const can = (verb) => roles.some((r) => r.rules.some((x) => (x.resources || []).includes("secrets") &&
  x.verbs.includes(verb) && (!x.resourceNames || x.resourceNames.includes(secretName))));
for (const v of ["get", "create", "patch"]) if (!can(v)) fail("the extender cannot " + v + " its Secret");
if (docs.some((d) => d.kind === "ClusterRole" && d.rules.some((x) => (x.resources || []).includes("secrets"))))
  fail("secrets in a ClusterRole");
' "$here" "$tmp/rendered.yaml"

# Sized shares (the auto-share component through an overlay, docs/kubernetes.md "Pods sized from
# what they used"): valid objects; the webhook calls the extender's Service on a port that reaches
# the container's webhook port, which the NetworkPolicy opens; the extender serves it and names the
# configuration whose caBundle it sets; only pods asking auto are sent; RBAC is that one object.
mkdir -p "$tmp/auto-share"
cp -r "$src/deploy" "$tmp/auto-share/deploy"
printf 'resources:\n  - deploy\ncomponents:\n  - deploy/components/auto-share\n' >"$tmp/auto-share/kustomization.yaml"
kubectl kustomize "$tmp/auto-share" >"$tmp/auto-share.yaml"
node "$here/validate.js" <"$tmp/auto-share.yaml" >"$tmp/validate-auto-share.txt" || { cat "$tmp/validate-auto-share.txt"; fail "invalid objects with the auto-share component"; }
node -e '
const yaml = require(process.argv[1] + "/node_modules/js-yaml");
const docs = yaml.loadAll(require("fs").readFileSync(process.argv[2], "utf8")).filter((d) => d);
const fail = (m) => { console.error("deploy_test: auto-share: " + m); process.exit(1); };
const one = (kind, name) => docs.find((d) => d.kind === kind && d.metadata.name === name) || fail("no " + kind + " " + name);
const cfg = one("MutatingWebhookConfiguration", "tessera-auto-share");
const hook = cfg.webhooks[0];
const ext = one("Deployment", "tessera-extender"), c = ext.spec.template.spec.containers[0];
const svc = one("Service", "tessera-extender");
const ref = hook.clientConfig.service;
if (ref.name !== svc.metadata.name || ref.namespace !== svc.metadata.namespace) fail("the webhook calls " + ref.namespace + "/" + ref.name);
const port = svc.spec.ports.find((p) => p.port === (ref.port || 443)) || fail("the Service has no port " + ref.port);
const cport = c.ports.find((p) => p.name === port.targetPort) || fail("the container has no port " + port.targetPort);
const arg = (flag) => (c.args.find((a) => a.startsWith(flag + "=")) || "").slice(flag.length + 1);
if (arg("--webhook-listen") !== "0.0.0.0:" + cport.containerPort) fail("--webhook-listen is not the container port " + cport.containerPort);
if (arg("--webhook-configuration") !== cfg.metadata.name) fail("--webhook-configuration is not " + cfg.metadata.name);
if (!arg("--tls-secret")) fail("the extender has no --tls-secret (the CA it writes as caBundle)");
if (ref.path !== "/mutate-pods") fail("the webhook path is " + ref.path);
const np = one("NetworkPolicy", "tessera-extender");
if (!np.spec.ingress.some((r) => !r.from && r.ports.some((p) => p.port === cport.containerPort))) fail("the NetworkPolicy does not open " + cport.containerPort);
if (hook.failurePolicy !== "Fail" || hook.sideEffects !== "None" || !hook.admissionReviewVersions.includes("v1")) fail("failurePolicy, sideEffects or admissionReviewVersions");
const r = hook.rules;
if (r.length !== 1 || r[0].operations.join() !== "CREATE" || r[0].resources.join() !== "pods" || r[0].apiGroups.join() !== "") fail("rules are not pod CREATE alone");
if (!hook.matchConditions.some((m) => m.expression.includes("[\x27tessera.io/gpu-share\x27] == \x27auto\x27"))) fail("pods without tessera.io/gpu-share: auto are sent");
const role = one("ClusterRole", "tessera-extender-auto-share");
const rule = role.rules[0];
if (role.rules.length !== 1 || rule.apiGroups.join() !== "admissionregistration.k8s.io" || rule.resources.join() !== "mutatingwebhookconfigurations" ||
    rule.resourceNames.join() !== cfg.metadata.name || [...rule.verbs].sort().join() !== "get,update")
  fail("ClusterRole tessera-extender-auto-share grants more, or other, than get/update of " + cfg.metadata.name);
const b = one("ClusterRoleBinding", "tessera-extender-auto-share");
if (b.subjects[0].name !== ext.spec.template.spec.serviceAccountName) fail("the binding names " + b.subjects[0].name);
' "$here" "$tmp/auto-share.yaml"

# The Helm chart renders the same objects as kustomize: its templates are deploy/base with the
# image and namespace as values (scripts/helm-sync writes them); compare after substitution.
chart="$src/deploy/helm/tessera"
[ -f "$chart/Chart.yaml" ] || fail "no Helm chart at $chart"
# The chart makes no Namespace: `helm install -n tessera-system --create-namespace` does, and a
# Namespace in the chart would clash with it.
if grep -q "^kind: Namespace" "$chart"/templates/*.yaml; then fail "the Helm chart creates a Namespace"; fi
sched_image=$(sed -n '/^scheduler:/,/^[^ ]/s/^  image: //p' "$chart/values.yaml")
[ -n "$sched_image" ] || fail "the chart's values.yaml has no scheduler.image"
for f in "$src"/deploy/base/*.yaml; do
  [ "$(basename "$f")" = namespace.yaml ] && continue
  t="$chart/templates/$(basename "$f")"
  [ -f "$t" ] || fail "the chart has no template for $(basename "$f")"
  sed -e 's/{{ .Release.Namespace }}/tessera-system/g' -e 's/{{ .Values.image }}/tessera/g' \
      -e "s|{{ .Values.scheduler.image }}|$sched_image|" \
      -e 's/{{ .Values.agent.runtimeClassName }}/nvidia/' \
      -e 's/: {{ .Values.agent.privileged }}/: false  # agent.privileged/' \
      -e '/^{{- if .Values.dra.enabled }}$/,/^{{- end }}$/d' \
      -e '/^{{- if .Values.agent.mps.gpus }}$/,/^{{- end }}$/d' \
      -e '/^{{- if .Values.autoShare.enabled }}$/,/^{{- end }}$/d' \
      -e 's/value: {{ if .Values.agent.mps.gpus }}compute,{{ end }}utility$/value: utility/' \
      "$t" >"$tmp/chart.yaml"
  diff -u "$f" "$tmp/chart.yaml" >/dev/null || { diff -u "$f" "$tmp/chart.yaml" | head -20; fail "chart template $(basename "$f") differs from deploy/base"; }
done
# A component's objects as the chart has them (templates/<component>-<file>, under its value's `if`).
same_as_component() {
  local component=$1 f t
  shift
  for f in "$@"; do
    t="$chart/templates/$component-$f"
    [ -f "$t" ] || fail "the chart has no template for deploy/components/$component/$f"
    sed -e '1d' -e '$d' -e 's/{{ .Release.Namespace }}/tessera-system/g' "$t" >"$tmp/chart.yaml"
    diff -u "$src/deploy/components/$component/$f" "$tmp/chart.yaml" >/dev/null ||
      fail "chart template $(basename "$t") differs from deploy/components/$component/$f"
  done
}
# With dra.enabled, the DRA component's objects, as deploy/components/dra has them.
same_as_component dra deviceclasses.yaml rbac.yaml policy.yaml
grep -q -- "- --dra" "$chart/templates/agent.yaml" || fail "the chart's agent has no --dra under dra.enabled"
# With autoShare.enabled, the auto-share component's objects, and the extender's flags and ports.
same_as_component auto-share webhook.yaml rbac.yaml
for want in "--webhook-listen=0.0.0.0:9443" "--webhook-configuration=tessera-auto-share" "containerPort: 9443"; do
  grep -q -- "$want" "$chart/templates/extender.yaml" || fail "the chart's extender has no $want under autoShare.enabled"
done
# The ServiceMonitor as deploy/components/monitoring has it, under monitoring.serviceMonitor.
sed -e '1,2d' -e '$d' -e 's/{{ .Release.Namespace }}/tessera-system/g' "$chart/templates/servicemonitor.yaml" >"$tmp/chart.yaml"
diff -u "$src/deploy/components/monitoring/servicemonitor.yaml" "$tmp/chart.yaml" >/dev/null ||
  fail "chart template servicemonitor.yaml differs from deploy/components/monitoring"
grep -q 'Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor"' "$chart/templates/servicemonitor.yaml" ||
  fail "the chart's ServiceMonitor is not conditional on the API serving it"
# The PrometheusRule likewise, under monitoring.prometheusRule, its alert templates passed through.
sed -e '1,2d' -e '$d' -e 's/{{ .Release.Namespace }}/tessera-system/g' \
    -e 's/{{`\({{[^}]*}}\)`}}/\1/g' "$chart/templates/prometheusrule.yaml" >"$tmp/chart.yaml"
diff -u "$src/deploy/components/monitoring/prometheusrule.yaml" "$tmp/chart.yaml" >/dev/null ||
  fail "chart template prometheusrule.yaml differs from deploy/components/monitoring"
grep -q 'Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule"' "$chart/templates/prometheusrule.yaml" ||
  fail "the chart's PrometheusRule is not conditional on the API serving it"
# The chart's dashboard is deploy/grafana's (the one tests/e2e checks against a real Prometheus).
cmp -s "$src/deploy/grafana/tessera.json" "$chart/files/tessera.json" ||
  fail "deploy/helm/tessera/files/tessera.json differs from deploy/grafana/tessera.json"
echo "deploy_test: ok"
