// Validates Kubernetes objects (multi-document YAML on stdin, as `kubectl kustomize deploy/`
// renders them) against the Kubernetes OpenAPI schemas of npm's kubernetes-models (version 5 for
// DRA's resource.k8s.io/v1; the Prometheus Operator's for ServiceMonitor). Prints one line per
// object; exits 1 naming every object that fails and why.
"use strict";
const fs = require("fs");
const yaml = require("js-yaml");

function modelFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const candidates = [];
  if (group === "resource.k8s.io") {
    // DRA's resource.k8s.io/v1 (Kubernetes 1.34) is only in kubernetes-models 5, an ES module that
    // exports its files to `import` only: required by path (Node 20.19+ requires ES modules).
    candidates.push(`${__dirname}/node_modules/kubernetes-models-v5/${apiVersion}/${kind}.js`);
  } else if (group === "monitoring.coreos.com") {
    candidates.push(`@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`);
  } else if (group === "") {
    candidates.push(`kubernetes-models/${version}/${kind}`);
  } else {
    candidates.push(`kubernetes-models/${apiVersion}/${kind}`);
  }
  for (const c of candidates) {
    try {
      return require(c)[kind];
    } catch (e) {
      if (e.code !== "MODULE_NOT_FOUND") throw e;
    }
  }
  return null;
}

const docs = yaml.loadAll(fs.readFileSync(0, "utf8")).filter((d) => d);
let failed = 0;
for (const obj of docs) {
  const name = `${obj.kind} ${obj.metadata && obj.metadata.namespace ? obj.metadata.namespace + "/" : ""}${obj.metadata && obj.metadata.name}`;
  const Model = modelFor(obj.apiVersion || "", obj.kind || "");
  if (!Model) {
    console.log(`FAIL ${name}: no schema for ${obj.apiVersion} ${obj.kind}`);
    failed++;
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`ok   ${name}`);
  } catch (e) {
    console.log(`FAIL ${name}: ${e.message}`);
    failed++;
  }
}
console.log(`${docs.length} objects, ${failed} invalid`);
process.exit(failed || docs.length === 0 ? 1 : 0);
