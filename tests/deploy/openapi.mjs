// Validates an OpenAPI document (a file) against the official schema of the version it declares
// (@seriousme/openapi-schema-validator, pinned by package-lock.json). Prints "valid OpenAPI <v>" or
// each error, and exits 1 when it is not valid.
import { readFileSync } from "node:fs";
import { Validator } from "@seriousme/openapi-schema-validator";

const path = process.argv[2];
const doc = JSON.parse(readFileSync(path, "utf8"));
const validator = new Validator();
const res = await validator.validate(doc);
if (res.valid) {
  console.log(`valid OpenAPI ${validator.version}`);
} else {
  console.log(`${path}: not valid OpenAPI ${validator.version}:`);
  for (const e of res.errors) console.log(JSON.stringify(e));
  process.exit(1);
}
