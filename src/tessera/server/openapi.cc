#include "tessera/server/openapi.h"

namespace tessera::server {

// Long by design: the OpenAPI document as one literal, kept beside nothing else.
std::string_view OpenApiDocument() {
  static constexpr std::string_view kDoc =
      R"json({
  "openapi": "3.0.3",
  "info": {"title": "Tessera standalone server", "version": "1",
           "description": "Jobs on a shared GPU machine. Unix socket (identity from peer )json"
      R"json(credentials) or TCP with a bearer token. Errors are {code, message} with a )json"
      R"json(4xx/5xx status."},
  "paths": {
    "/v1/health": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
    "/v1/info": {"get": {"summary": "Server, machine (simulated or not) and caller", )json"
      R"json("responses": {"200": {"description": "info"}}}},
    "/v1/gpus": {"get": {"summary": "GPUs with health, allocation, jobs and the driver's )json"
      R"json(readings (utilization, memory_used_bytes, temperature_celsius, power_watts; null )json"
      R"json(when unknown), sharing (time-slice or mps) and, for MPS, its daemon's state )json"
      R"json((mps: {daemon_up, reason, starts, deaths, server_faults})", "responses": {"200": )json"
      R"json({"description": "GPUs"}}}},
    "/v1/jobs": {
      "get": {"summary": "Jobs, oldest first",
              "parameters": [{"name": "state", "in": "query", "schema": {"type": "string"}, )json"
      R"json("description": "comma-separated states"},
                             {"name": "user", "in": "query", "schema": {"type": "string"}},
                             {"name": "limit", "in": "query", "schema": {"type": "integer", )json"
      R"json("minimum": 1, "maximum": 10000}, "description": "the newest N (default 1000)"},
                             {"name": "before", "in": "query", "schema": {"type": "integer"}, )json"
      R"json("description": "jobs with smaller ids only: the next page (next_before)"},
                             {"name": "arrays", "in": "query", "schema": {"type": "string", )json"
      R"json("enum": ["fold", "expand"]}, "description": "fold: an array is one entry (its )json"
      R"json(first task listed) with array {id, range, tasks, states, held}; expand )json"
      R"json((default): every task"},
                             {"name": "env", "in": "query", "schema": {"type": "boolean"}, )json"
      R"json("description": "false: without each job's stored environment (spec.env)"}],
              "responses": {"200": {"description": "{jobs: [Job], more, next_before}"}, )json"
      R"json("400": {"$ref": )json"
      R"json("#/components/responses/Error"}}},
      "post": {"summary": "Submit a job; stored durably before the answer",
               "parameters": [{"name": "Idempotency-Key", "in": "header", "schema": {"type": )json"
      R"json("string", "maxLength": 128}, "description": "the client's key: a repeat with the )json"
      R"json(same key and spec gets the job the first one made (200, repeated: true)"}],
               "requestBody": {"required": true, "content": {"application/json": {"schema": )json"
      R"json({"$ref": "#/components/schemas/JobSpec"}}}},
               "responses": {"201": {"description": "the Job"}, "200": {"description": )json"
      R"json("the Job an earlier submission with this Idempotency-Key made"}, "400": {"$ref": )json"
      R"json("#/components/responses/Error"},
                             "403": {"$ref": "#/components/responses/Error"}, "413": )json"
      R"json({"$ref": "#/components/responses/Error"},
                             "415": {"$ref": "#/components/responses/Error"}, "422": )json"
      R"json({"$ref": "#/components/responses/Error"}}}},
    "/v1/jobs/{id}": {"get": {"summary": "A job with its events", "parameters": [{"$ref": )json"
      R"json("#/components/parameters/Id"}],
                              "responses": {"200": {"description": "Job"}, "404": {"$ref": )json"
      R"json("#/components/responses/Error"}}}},
    "/v1/jobs/{id}/events": {"get": {"summary": "Every transition with its reason", )json"
      R"json("parameters": [{"$ref": "#/components/parameters/Id"}],
                                     "responses": {"200": {"description": "{events: )json"
      R"json([...]}"}, "404": {"$ref": "#/components/responses/Error"}}}},
    "/v1/jobs/{id}/logs": {"get": {"summary": "Output from a byte offset (at most 1 MiB per call)",
                                   "parameters": [{"$ref": "#/components/parameters/Id"},
                                                  {"name": "stream", "in": "query", )json"
      R"json("schema": {"type": "string", "enum": ["stdout", "stderr"]}},
                                                  {"name": "offset", "in": "query", )json"
      R"json("schema": {"type": "integer", "minimum": 0}},
                                                  {"name": "task", "in": "query", )json"
      R"json("schema": {"type": "integer", "minimum": 0}, "description": "of a job of several )json"
      R"json(processes: this task's (default 0)"}],
                                   "responses": {"200": {"description": "{data, offset, )json"
      R"json(next_offset, ended, state}"}, "404": {"$ref": "#/components/responses/Error"}}}},
    "/v1/jobs/{id}/cancel": {"post": {"summary": "Cancel (owner or admin): SIGTERM, then )json"
      R"json(SIGKILL after the grace period",
                                      "parameters": [{"$ref": "#/components/parameters/Id"}],
                                      "responses": {"200": {"description": "Job"}, "403": )json"
      R"json({"$ref": "#/components/responses/Error"},
                                                    "404": {"$ref": )json"
      R"json("#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/jobs/{id}/hold": {"post": {"summary": "Hold a queued job (an array's id: its )json"
      R"json(queued tasks): it keeps its place but does not start (owner or admin)",
                                    "parameters": [{"$ref": "#/components/parameters/Id"}],
                                    "responses": {"200": {"description": "Job"}, "403": )json"
      R"json({"$ref": "#/components/responses/Error"}, "404": {"$ref": )json"
      R"json("#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/jobs/{id}/release": {"post": {"summary": "Release held jobs: they start in the )json"
      R"json(place they held (owner or admin)",
                                       "parameters": [{"$ref": "#/components/parameters/Id"}],
                                       "responses": {"200": {"description": "Job"}, "403": )json"
      R"json({"$ref": "#/components/responses/Error"}, "404": {"$ref": )json"
      R"json("#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/acct": {"get": {"summary": "Accounting over a period: jobs, outcomes, GPU-hours )json"
      R"json((whole, fractional), waits; total and by user, group and model. Users see their )json"
      R"json(own jobs, admins everyone's",
                         "parameters": [{"name": "since", "in": "query", "schema": {"type": )json"
      R"json("number"}, "description": "epoch seconds (default a week ago)"},
                                        {"name": "until", "in": "query", "schema": {"type": )json"
      R"json("number"}, "description": "epoch seconds (default now)"},
                                        {"name": "user", "in": "query", "schema": {"type": )json"
      R"json("string"}}],
                         "responses": {"200": {"description": "{since, until, scope, total, )json"
      R"json(by_user, by_group, by_model}"}, "400": {"$ref": "#/components/responses/Error"}, )json"
      R"json("403": {"$ref": "#/components/responses/Error"}}}},
    "/v1/jobs/{id}/priority": {"post": {"summary": "A queued job's new priority (its owner )json"
      R"json(within their ceiling, or an admin); recorded as an )json"
      R"json(event", "parameters": [{"$ref": )json"
      R"json("#/components/parameters/Id"}], "requestBody": {"required": true, "content": )json"
      R"json({"application/json": {"schema": {"type": "object", )json"
      R"json("additionalProperties": false, )json"
      R"json("required": ["priority"], "properties": {"priority": {"type": "integer", )json"
      R"json("minimum": -1000, "maximum": 1000}}}}}}, "responses": {"200": {"description": )json"
      R"json("Job"}, "400": {"$ref": "#/components/responses/Error"}, "403": {"$ref": )json"
      R"json("#/components/responses/Error"}, "404": {"$ref": )json"
      R"json("#/components/responses/Error"}, )json"
      R"json("409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/jobs/{id}/wait": {"get": {"summary": "Answers once the job's state is not )json"
      R"json(`state` or its output (every task's stdout and stderr) is more than `bytes`, or )json"
      R"json(after timeout_s: how tessera run follows a job", "parameters": [{"name": "id", )json"
      R"json("in": "path", "required": true, "schema": {"type": "string"}}, {"name": "state", )json"
      R"json("in": "query", "schema": {"type": "string"}}, {"name": "bytes", "in": "query", )json"
      R"json("schema": {"type": "integer", "minimum": 0}}, {"name": "timeout_s", "in": )json"
      R"json("query", "schema": {"type": "number", "minimum": 0, "maximum": 30}}], )json"
      R"json("responses": {"200": {"description": "The job's state and output size now", )json"
      R"json("content": {"application/json": {"schema": {"type": "object", "properties": )json"
      R"json({"state": {"type": "string"}, "ended": {"type": "boolean"}, "bytes": {"type": )json"
      R"json("integer"}, "changed": {"type": "boolean"}}}}}}, "400": {"$ref": )json"
      R"json("#/components/responses/Error"}, "403": {"$ref": )json"
      R"json("#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"}}}},
    "/v1/admin/purge": {"post": {"summary": "Admins: remove now the ended jobs (with their )json"
      R"json(logs), the logs, or the stored environments of jobs that ended over an age ago )json"
      R"json((seconds); jobs a waiting job's --after names stay", "requestBody": {"required": )json"
      R"json(true, "content": {"application/json": {"schema": {"type": "object", )json"
      R"json("additionalProperties": false, "minProperties": 1, "properties": {"jobs_s": )json"
      R"json({"type": "number", "minimum": 0}, "logs_s": {"type": "number", "minimum": 0}, )json"
      R"json("environments_s": {"type": "number", "minimum": 0}}}}}}, "responses": {"200": )json"
      R"json({"description": "What was removed", "content": {"application/json": {"schema": )json"
      R"json({"type": "object", "properties": {"jobs": {"type": "integer"}, "logs": {"type": )json"
      R"json("integer"}, "environments": {"type": "integer"}}}}}}, "400": {"$ref": )json"
      R"json("#/components/responses/Error"}, "403": {"$ref": )json"
      R"json("#/components/responses/Error"}}}},
    "/v1/gpus/{index}/simulate": {"post": {"summary": "Admins, simulated machines only: make )json"
      R"json(a GPU sick (an XID error) or lost, to see what the server does", "parameters": )json"
      R"json([{"name": "index", "in": "path", "required": true, "schema": {"type": "integer", )json"
      R"json("minimum": 0}}], "requestBody": {"required": true, )json"
      R"json("content": {"application/json": )json"
      R"json({"schema": {"type": "object", "properties": {"xid": {"type": "integer", )json"
      R"json("minimum": 0}, "lost": {"type": "boolean"}}}}}}, "responses": {"202": )json"
      R"json({"description": "injected"}, "400": {"$ref": "#/components/responses/Error"}, )json"
      R"json("403": {"$ref": "#/components/responses/Error"}, "404": {"$ref": )json"
      R"json("#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/stream": {"get": {"summary": "Server-sent events (text/event-stream): hello )json"
      R"json({seq, user, admin, interval_s}; job {job, state, reason, at} with id: its event )json"
      R"json(number; gpu {index, healthy, reason} on a health change; sample (as in )json"
      R"json(/v1/history) every interval. Resumes after Last-Event-ID (or ?after=); )json"
      R"json(more than 5000 missed: reset {seq, missed} instead", )json"
      R"json("parameters": [{"name": "after", "in": "query", "schema": {"type": "integer", )json"
      R"json("minimum": 0}}], "responses": {"200": {"description": "the event stream", )json"
      R"json("content": {"text/event-stream": {"schema": )json"
      R"json({"type": "string"}}}}, "400": {"$ref": )json"
      R"json("#/components/responses/Error"}}}},
    "/v1/history": {"get": {"summary": "The machine's recent history (kept across restarts): )json"
      R"json({interval_s, window_s, gpus, samples: [{at, queued, running, busy, healthy, )json"
      R"json(allocated, util[], mem[], alloc[], alloc_mem[]}]}", "parameters": [{"name": )json"
      R"json("since", "in": "query", "schema": {"type": "number"}, "description": "epoch )json"
      R"json(seconds"}], "responses": {"200": {"description": "history"}, "400": {"$ref": )json"
      R"json("#/components/responses/Error"}}}},
    "/v1/quotas": {"get": {"summary": "Each user's and group's quota and what they use now )json"
      R"json((null: no limit)", "responses": {"200": {"description": "{quotas: [{kind, name, )json"
      R"json(limit, used, borrow, cohort}]}"}}}},
    "/v1/openapi.json": {"get": {"summary": "This document", "responses": {"200": )json"
      R"json({"description": "OpenAPI 3"}}}},
    "/metrics": {"get": {"summary": "Prometheus text format (docs/metrics.md)", )json"
      R"json("responses": {"200": {"description": "metrics"}}}}
  },
  "components": {
    "parameters": {"Id": {"name": "id", "in": "path", "required": true, "schema": {"type": )json"
      R"json("string", "pattern": "^[0-9]+(_[0-9]+)?$"}, "description": "a job (12), or an )json"
      R"json(array's task (12_3); for cancel, hold and release an array's id is all its )json"
      R"json(tasks"}},
    "responses": {"Error": {"description": "error", "content": {"application/json": )json"
      R"json({"schema": {"$ref": "#/components/schemas/Error"}}}}},
    "schemas": {
      "Error": {"type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}}},
      "JobSpec": {"type": "object", "additionalProperties": false, "required": ["command"],
        "properties": {
          "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
          "env": {"type": "object", "additionalProperties": {"type": "string"}},
          "workdir": {"type": "string", "description": "absolute path"},
          "name": {"type": "string", "maxLength": 128},
          "labels": {"type": "object", "additionalProperties": {"type": "string"}},
          "resources": {"type": "object", "additionalProperties": false,
            "properties": {
              "gpus": {"type": "integer", "minimum": 0, "maximum": 64},
              "gpus_max": {"type": "integer", "minimum": 1, "maximum": 64, "description": )json"
      R"json("elastic: from gpus up to this many whole GPUs, as many as fit at its start )json"
      R"json(while nothing queued wants a GPU"},
              "gpu_memory": {"oneOf": [{"type": "string", "example": "10GiB", )json"
      R"json("description": "or auto: sized from what jobs of its kind used"}, {"type": )json"
      R"json("integer", "description": "MiB"}]},
              "gpu_share": {"oneOf": [{"type": "string", "example": "30%", "description": )json"
      R"json("or auto: sized from what jobs of its kind used"}, {"type": )json"
      R"json("number", "description": "percent; below 1, a fraction (0.3 = 30%)"}]},
              "model": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": )json"
      R"json("string"}}]},
              "min_gpu_memory": {"type": "string"},
              "topology": {"type": "string", "enum": ["none", "prefer", "require"]},
              "sharing": {"type": "string", "enum": ["time-slice", "mps"], "description": )json"
      R"json("how its GPUs are shared; default: a share in time slices, whole GPUs in either )json"
      R"json(mode"},
              "cpus": {"type": "number", "minimum": 0.01, "maximum": 4096, "description": )json"
      R"json("host CPUs: scheduled, and the job's cgroup CPU limit"},
              "memory": {"oneOf": [{"type": "string", "example": "16GiB"}, {"type": )json"
      R"json("integer", "description": "MiB"}], "description": "host memory: scheduled, and )json"
      R"json(the job's cgroup memory limit (over it the job is killed)"}}},
          "priority": {"type": "integer", "minimum": -1000, "maximum": 1000},
          "preemptible": {"type": "boolean"},
          "max_runtime_s": {"oneOf": [{"type": "number", "minimum": 0, "exclusiveMinimum": )json"
      R"json(true}, {"type": "string", "example": "1h30m", "description": "90s, 15m, 1h, )json"
      R"json(HH:MM:SS, D-HH:MM:SS"}]},
          "grace_period_s": {"oneOf": [{"type": "number", "minimum": 0, "maximum": 3600}, )json"
      R"json({"type": "string", "example": "2m"}], "description": "at most the server's )json"
      R"json(preemption.max_grace_period_s"},
          "image": {"type": "string", "description": "run in a container of this image )json"
      R"json((podman, GPUs as CDI devices tessera.io/gpu=<uuid>); 400 when the server has no )json"
      R"json(podman"},
          "array": {"type": "string", "example": "0-99%8", "description": "an array: a task )json"
      R"json(per index (ranges, lists, :step), at most N running with %N"},
          "after": {"type": "array", "items": {"type": "string", "pattern": )json"
      R"json("^(ok|notok|any):[0-9]+(_[0-9]+)?$"}, "description": "start after these jobs )json"
      R"json((an array's id: all its tasks) end as said; never met: the job is cancelled"},
          "hold": {"type": "boolean", "description": "queued held: starts once released"},
          "ntasks": {"type": "integer", "minimum": 1, "maximum": 1024},
          "tasks_per_gpu": {"type": "integer", "minimum": 1, "maximum": 1024},
          "task_failure": {"type": "string", "enum": ["kill", "wait"]},
          "stdout_file": {"type": "string", "example": "train-%A_%a.out", "description": )json"
      R"json("a file of the user's for the job's stdout (and stderr without stderr_file): %j )json"
      R"json(%A %a %t %u %x %N %%; relative to workdir"},
          "stderr_file": {"type": "string", "example": "train-%j.err"},
          "requeue": {"type": "boolean", "description": "back to the queue when preempted )json"
      R"json(or its GPU fails (true) or not (false); absent: the server's settings"},
          "resize": {"type": "object", "required": ["by"], "additionalProperties": false, )json"
      R"json("description": "an elastic job (resources.gpus_max) resized while it runs", )json"
      R"json("properties": {"by": {"type": "string", "enum": ["signal", "restart"], )json"
      R"json("description": "signal: told its new GPUs in TESSERA_RESIZE_FILE and by SIGUSR1, )json"
      R"json(it exits 75 and starts again on them; restart: stopped and started again"}, )json"
      R"json("grace_s": {"oneOf": [{"type": "number", "minimum": 0, "maximum": 3600}, )json"
      R"json({"type": "string", "example": "2m"}], "description": "by signal: how long it )json"
      R"json(has to exit 75 (default 60)"}, "unanswered": {"type": "string", "enum": )json"
      R"json(["restart", "keep"], "description": "by signal, not answered in its grace: )json"
      R"json(stopped and started again, or a growth given up (default restart)"}}},
          "trial_s": {"oneOf": [{"type": "number", "minimum": 0, "exclusiveMinimum": true, )json"
      R"json("maximum": 86400}, {"type": "string", "example": "2m"}], "description": "a )json"
      R"json(trial run: stopped after this long, its use measured and a size recommended"},
          "sized": {"type": "object", "readOnly": true, "description": "set by the server )json"
      R"json(for auto resources: the sizes given and their basis", "properties": {"basis": )json"
      R"json({"type": "string"}, "gpu_share": {"type": "string"}, "gpu_memory": {"type": )json"
      R"json("string"}, "trial_s": {"type": "number", "description": "a kind never measured: )json"
      R"json(its first run is a trial this long, then it is re-queued sized from it"}}}}}
    }
  }
})json";
  return kDoc;
}

}  // namespace tessera::server
