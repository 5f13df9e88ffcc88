// KQL checked by Microsoft's own Kusto language service (npm @kusto/language-service-next: Kusto.Language
// compiled to JavaScript), against the tables and functions the project declares (issue 26).
//
// stdin:  {"tables": {"Name": "(Col: type, ...)"}, "functions": [{"name", "params": "()", "body": "{ ... }"}],
//          "queries": [{"id", "text"}]}
// stdout: {"results": [{"id", "diagnostics": [{"severity", "message", "start", "length"}]}]}
// Usage:  node infra/tools/kql_check.js <node_modules directory> < input.json
"use strict";
const path = require("path");
const fs = require("fs");

const modules = process.argv[2] || path.join(__dirname, "..", "..", ".tools", "node_modules");
const dir = path.join(modules, "@kusto", "language-service-next");
global.Bridge = require(path.join(dir, "bridge.js"));
require(path.join(dir, "Kusto.Language.Bridge.js"));
const K = global.Kusto.Language;
const S = K.Symbols;

const input = JSON.parse(fs.readFileSync(0, "utf8"));
const members = [];
for (const [name, schema] of Object.entries(input.tables || {})) {
  members.push(S.TableSymbol.From(schema).WithName(name));
}
for (const fn of input.functions || []) {
  members.push(new S.FunctionSymbol.$ctor16(fn.name, fn.params, fn.body, ""));
}
const db = new S.DatabaseSymbol("db", members);
const globals = K.GlobalState.Default.WithCluster(new S.ClusterSymbol("cluster", [db])).WithDatabase(db);

const results = [];
for (const query of input.queries || []) {
  const code = K.KustoCode.ParseAndAnalyze(query.text, globals);
  const diagnostics = [];
  const found = code.GetDiagnostics();
  for (let i = 0; i < found.Count; i++) {
    const d = found.getItem(i);
    diagnostics.push({ severity: d.Severity, message: d.Message, start: d.Start, length: d.Length });
  }
  results.push({ id: query.id, diagnostics });
}
process.stdout.write(JSON.stringify({ results }));
