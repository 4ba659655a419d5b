#include "tessera/server/openapi.h"

namespace tessera::server {

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
      R"json(when unknown)", "responses": {"200": {"description": "GPUs"}}}},
    "/v1/jobs": {
      "get": {"summary": "Jobs, oldest first",
              "parameters": [{"name": "state", "in": "query", "schema": {"type": "string"}, )json"
      R"json("description": "comma-separated states"},
                             {"name": "user", "in": "query", "schema": {"type": "string"}},
                             {"name": "limit", "in": "query", "schema": {"type": "integer", )json"
      R"json("minimum": 1, "maximum": 100000}, "description": "the newest N"}],
              "responses": {"200": {"description": "{jobs: [Job]}"}, "400": {"$ref": )json"
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
      R"json("schema": {"type": "integer", "minimum": 0}}],
                                   "responses": {"200": {"description": "{data, offset, )json"
      R"json(next_offset, ended, state}"}, "404": {"$ref": "#/components/responses/Error"}}}},
    "/v1/jobs/{id}/cancel": {"post": {"summary": "Cancel (owner or admin): SIGTERM, then )json"
      R"json(SIGKILL after the grace period",
                                      "parameters": [{"$ref": "#/components/parameters/Id"}],
                                      "responses": {"200": {"description": "Job"}, "403": )json"
      R"json({"$ref": "#/components/responses/Error"},
                                                    "404": {"$ref": )json"
      R"json("#/components/responses/Error"}, "409": {"$ref": "#/components/responses/Error"}}}},
    "/v1/openapi.json": {"get": {"summary": "This document", "responses": {"200": )json"
      R"json({"description": "OpenAPI 3"}}}},
    "/metrics": {"get": {"summary": "Prometheus text format (docs/metrics.md)", )json"
      R"json("responses": {"200": {"description": "metrics"}}}}
  },
  "components": {
    "parameters": {"Id": {"name": "id", "in": "path", "required": true, "schema": {"type": )json"
      R"json("integer", "minimum": 1}}},
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
              "gpu_memory": {"oneOf": [{"type": "string", "example": "10GiB"}, {"type": )json"
      R"json("integer", "description": "MiB"}]},
              "gpu_share": {"oneOf": [{"type": "string", "example": "30%"}, {"type": )json"
      R"json("number", "description": "percent"}]},
              "model": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": )json"
      R"json("string"}}]},
              "min_gpu_memory": {"type": "string"},
              "topology": {"type": "string", "enum": ["none", "prefer", "require"]},
              "cpus": {"type": "number", "minimum": 0.01, "maximum": 4096, "description": )json"
      R"json("host CPUs: scheduled, and the job's cgroup CPU limit"},
              "memory": {"oneOf": [{"type": "string", "example": "16GiB"}, {"type": )json"
      R"json("integer", "description": "MiB"}], "description": "host memory: scheduled, and )json"
      R"json(the job's cgroup memory limit (over it the job is killed)"}}},
          "priority": {"type": "integer", "minimum": -1000, "maximum": 1000},
          "preemptible": {"type": "boolean"},
          "max_runtime_s": {"type": "number", "minimum": 0, "exclusiveMinimum": true},
          "grace_period_s": {"type": "number", "minimum": 0, "maximum": 3600},
          "image": {"type": "string", "description": "run in a container of this image )json"
      R"json((podman, GPUs as CDI devices tessera.io/gpu=<uuid>); 400 when the server has no )json"
      R"json(podman"}}}
    }
  }
})json";
  return kDoc;
}

}  // namespace tessera::server
