// An MCP Apps host as far as the protocol goes, on the TypeScript SDK client (npm @modelcontextprotocol/sdk):
// it declares the extension io.modelcontextprotocol/ui (unless told not to), lists tools and resources,
// has "the model" call a tool with a view, reads that view as a host renders it (resources/read of the
// tool's _meta.ui.resourceUri), and relays the view's own calls as ext-apps' AppBridge does: the view's
// tools/call params, unchanged, by the names its HTML uses. Prints what it saw as JSON on stdout, then
// closes as the SDK does (stdin closed; SIGTERM 2 s later; SIGKILL 2 s after that).
// Usage: node apps_host.mjs PLAN_JSON, where PLAN is
//   {"connect": {"command", "args"} | {"url"}, "declare": true, "show": {"name", "arguments"},
//    "model_calls": [{"name", "arguments"}], "view_calls": [{"name", "arguments"}]}
// and an argument {"$shown": KEY} stands for the shown result's structuredContent[KEY].
// The SDK is imported from MCP_SDK_DIR (its package folder): ESM resolution ignores NODE_PATH.
const sdk = (path) => import(`${process.env.MCP_SDK_DIR}/dist/esm/${path}`);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport } = await sdk("client/stdio.js");
const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");
const { CallToolResultSchema } = await sdk("types.js");

const plan = JSON.parse(process.argv[2]);
const ui = { "io.modelcontextprotocol/ui": { mimeTypes: ["text/html;profile=mcp-app"] } };
const client = new Client({ name: "apps-host", version: "1.0.0" }, { capabilities: plan.declare ? { extensions: ui } : {} });
const { connect } = plan;
await client.connect(
  connect.url
    ? new StreamableHTTPClientTransport(new URL(connect.url))
    : new StdioClientTransport({ command: connect.command, args: connect.args, env: process.env, stderr: "ignore" }),
);

const out = { tools: (await client.listTools()).tools, resources: (await client.listResources()).resources };
const viewOf = (tool) => tool._meta?.ui?.resourceUri ?? tool._meta?.["ui/resourceUri"];
// Errors are answers too: what the host would show the view.
const settle = async (promise) => {
  try {
    return await promise;
  } catch (error) {
    return { error: { code: error.code, message: error.message } };
  }
};
let shown = {};
const fill = (args) =>
  Object.fromEntries(Object.entries(args ?? {}).map(([k, v]) => [k, v?.$shown ? shown.structuredContent?.[v.$shown] : v]));
const call = (params) => settle(client.request({ method: "tools/call", params }, CallToolResultSchema));

if (plan.show) {
  out.shown = shown = await call({ name: plan.show.name, arguments: plan.show.arguments ?? {} });
  const tool = out.tools.find((t) => t.name === plan.show.name);
  const uri = tool && viewOf(tool);
  if (uri) out.view = await settle(client.readResource({ uri }));
  out.model_calls = [];
  for (const c of plan.model_calls ?? []) out.model_calls.push(await call({ name: c.name, arguments: fill(c.arguments) }));
  out.view_calls = [];
  // A view's request carries its own progress token (ext-apps' App.callServerTool asks for progress),
  // which AppBridge passes on with the rest of its params.
  for (const [i, c] of (plan.view_calls ?? []).entries())
    out.view_calls.push(await call({ name: c.name, arguments: fill(c.arguments), _meta: { progressToken: i + 1 } }));
}
process.stdout.write(JSON.stringify(out));
await client.close();
