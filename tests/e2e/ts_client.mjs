// The TypeScript SDK client (npm @modelcontextprotocol/sdk), as a new user would run it: declares
// sampling, elicitation (form and url) and roots, answers each, and prints what the capability
// tools of server-everything answered, as JSON on stdout.
// Usage: node ts_client.mjs PREFIX COMMAND ARGS...   (PREFIX: "" direct, "everything__" through mcpmux)
//        node ts_client.mjs PREFIX http://HOST:PORT/mcp  (streamable HTTP)
// The SDK is imported from MCP_SDK_DIR (its package folder): ESM resolution ignores NODE_PATH.
const sdk = (path) => import(`${process.env.MCP_SDK_DIR}/dist/esm/${path}`);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport } = await sdk("client/stdio.js");
const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");
const { CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema } = await sdk("types.js");

const [prefix, command, ...args] = process.argv.slice(2);
const client = new Client(
  { name: "ts-client", version: "1.0.0" },
  { capabilities: { sampling: {}, elicitation: { form: {}, url: {} }, roots: { listChanged: true } } },
);
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push(request.params.mode ?? "form");
  if (request.params.mode === "url") return { action: "accept" };
  const content = {};
  for (const [key, prop] of Object.entries(request.params.requestedSchema.properties)) {
    if (prop.type === "boolean") content[key] = true;
    else if (prop.type === "number" || prop.type === "integer") content[key] = prop.minimum ?? 1;
    else if (prop.enum) content[key] = prop.enum[0];
    else if (prop.oneOf) content[key] = prop.oneOf[0].const;
    else if (prop.type === "array") content[key] = [(prop.items.enum ?? prop.items.anyOf.map((c) => c.const))[0]];
    else if (prop.format === "email") content[key] = "ada@example.com";
    else if (prop.format === "uri") content[key] = "https://example.com";
    else if (prop.format === "date") content[key] = "1815-12-10";
    else content[key] = prop.default ?? "Ada";
  }
  return { action: "accept", content };
});
client.setRequestHandler(ListRootsRequestSchema, async () => ({
  roots: [{ uri: "file:///home/user/project", name: "project" }],
}));
client.setRequestHandler(CreateMessageRequestSchema, async () => ({
  role: "assistant",
  content: { type: "text", text: "a reply" },
  model: "person",
  stopReason: "endTurn",
}));
await client.connect(
  command.startsWith("http")
    ? new StreamableHTTPClientTransport(new URL(command))
    : new StdioClientTransport({ command, args, env: process.env, stderr: "ignore" }),
);
const text = (result) => result.content.map((block) => block.text ?? "").join("");
const tools = (await client.listTools()).tools.map((tool) => tool.name).filter((name) => name.startsWith(prefix));
const out = { tools: tools.map((name) => name.slice(prefix.length)).sort(), asked };
// server-everything asks for the roots some time after the client is initialized (350 ms after its
// start directly; through mcpmux, once the client's roots/list_changed has reached it): read them
// until they are there, for at most 15 s.
for (const start = Date.now(); ; ) {
  out.roots = text(await client.callTool({ name: `${prefix}get-roots-list`, arguments: {} }));
  if (!out.roots.includes("no roots are currently configured") || Date.now() - start > 15000) break;
  await new Promise((resolve) => setTimeout(resolve, 100));
}
out.form = text(await client.callTool({ name: `${prefix}trigger-elicitation-request`, arguments: {} }));
out.url = text(
  await client.callTool({
    name: `${prefix}trigger-url-elicitation`,
    arguments: { url: "https://example.com/login", elicitationId: "fixed-id" },
  }),
);
out.setLevel = JSON.stringify(await client.setLoggingLevel("warning"));
process.stdout.write(JSON.stringify(out));
await client.close();
