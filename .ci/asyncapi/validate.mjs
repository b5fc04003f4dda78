// Validates an AsyncAPI document (read from stdin) with the official parser and prints
// {"diagnostics": [{"severity": 0..3, "code", "message", "path"}]} (0 = error).
import { Parser } from "@asyncapi/parser";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const { diagnostics } = await new Parser().parse(Buffer.concat(chunks).toString("utf8"));
process.stdout.write(JSON.stringify({
  diagnostics: diagnostics.map((d) => ({
    severity: d.severity, code: String(d.code), message: d.message, path: d.path,
  })),
}));
