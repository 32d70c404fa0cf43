"""The dashboard's one page: HTML, CSS and script in one response, with nothing fetched from elsewhere.

It works offline and behind a firewall, and its Content-Security-Policy lets the browser load
nothing but this page, its own script (by hash) and `/dashboard/state`. The script polls the
state every `POLL_MS` and redraws; everything an upstream says (names, errors, its stderr) is
untrusted and only ever set as text, never as markup. Where the server wants a bearer token, the
page asks for it once and keeps it for the browser tab (sessionStorage), sending it as `/mcp`'s
clients do.
"""

from __future__ import annotations

import base64
import hashlib

POLL_MS = 2000

_STYLE = """
:root { color-scheme: light dark; --ok: #1a7f37; --bad: #cf222e; --warn: #9a6700; --dim: #6e7781;
        --line: #d0d7de; --card: rgba(127,127,127,.06); }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
header { display: flex; flex-wrap: wrap; gap: .25rem 1rem; align-items: baseline; padding: .75rem 1rem;
         border-bottom: 1px solid var(--line); }
header h1 { font-size: 1.1rem; margin: 0; }
main { padding: .5rem 1rem 2rem; display: grid; gap: 1rem;
       grid-template-columns: repeat(auto-fit, minmax(min(100%, 28rem), 1fr)); }
section { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: .5rem .75rem;
          min-width: 0; }
section.wide { grid-column: 1 / -1; }
h2 { font-size: .95rem; margin: .25rem 0 .5rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: right; padding: .2rem .5rem; border-bottom: 1px solid var(--line); white-space: nowrap; }
th:first-child, td:first-child, td.name, th.name { text-align: left; }
.error { color: var(--bad); overflow-wrap: anywhere; }
ul.problems { margin: .5rem 0 0; padding-left: 1.2rem; }
.state { font-weight: 600; }
.state-ready { color: var(--ok); } .state-down, .state-stopped { color: var(--bad); }
.state-starting, .state-needs-login { color: var(--warn); }
.dim { color: var(--dim); }
pre { margin: .25rem 0; padding: .4rem; background: rgba(127,127,127,.12); border-radius: 4px; white-space: pre-wrap;
      overflow-wrap: anywhere; font-size: 12px; }
#live.off { color: var(--bad); }
form { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; }
input { font: inherit; padding: .2rem .4rem; min-width: 0; flex: 1 1 12rem; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .15rem .75rem; margin: 0; }
dt { color: var(--dim); } dd { margin: 0; overflow-wrap: anywhere; }
"""

_SCRIPT = """
"use strict";
const POLL_MS = __POLL_MS__;
const TOKEN_KEY = "mcpmux-dashboard-token";
let previous = null;

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(headers, rows) {
  const head = el("tr", {}, ...headers.map((h, i) => el("th", i === 0 ? {class: "name"} : {}, h)));
  return el("div", {class: "scroll"}, el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
}

function ms(value) {
  if (value === null || value === undefined) return "-";
  if (value < 10) return value.toFixed(2) + " ms";
  return value < 1000 ? Math.round(value) + " ms" : (value / 1000).toFixed(2) + " s";
}
function pct(value) { return Math.round(value * 100) + "%"; }
function since(seconds) {
  if (seconds < 90) return Math.round(seconds) + " s";
  if (seconds < 5400) return Math.round(seconds / 60) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

function upstreams(state) {
  const rows = [], problems = [];
  for (const u of state.upstreams) {
    const cls = "state state-" + u.state.replace(" ", "-");
    rows.push(el("tr", {data: {upstream: u.name, state: u.state}},
      el("td", {class: "name"}, u.name,
        el("div", {class: "dim"}, u.transport + (u.auth !== "none" ? ", " + u.auth : ""))),
      el("td", {class: cls}, u.state),
      el("td", {}, u.era || "-"), el("td", {}, u.tools), el("td", {}, u.restarts),
      el("td", {}, u.in_flight + (u.queued ? " (+" + u.queued + " queued)" : ""))));
    // Below the table, not in it: a long reason wraps at the page's width, a phone's too.
    if (u.last_error && u.state !== "ready") {
      const tail = u.stderr.length ? el("details", {},
        el("summary", {class: "dim"}, "its last stderr lines"), el("pre", {}, u.stderr.join("\\n"))) : null;
      problems.push(el("li", {data: {errorOf: u.name}}, el("b", {}, u.name + ": "),
        el("span", {class: "error"}, u.last_error), tail));
    }
  }
  const list = problems.length ? el("ul", {class: "problems"}, ...problems) : null;
  return [table(["upstream", "state", "era", "tools", "restarts", "in flight"], rows), list];
}

function tools(state, now) {
  const rows = state.tools.map(t => {
    const key = t.upstream + "/" + t.tool;
    let rate = "-";
    if (previous && previous.calls[key] !== undefined && now > previous.at) {
      rate = ((t.calls - previous.calls[key]) / ((now - previous.at) / 1000)).toFixed(2) + "/s";
    }
    return el("tr", {data: {tool: key}}, el("td", {class: "name"}, t.upstream + "__" + t.tool),
      el("td", {}, t.calls), el("td", {}, rate), el("td", {}, ms(t.p50_ms)), el("td", {}, ms(t.p99_ms)),
      el("td", {}, t.errors), el("td", {}, t.cache_hits), el("td", {}, t.coalesced));
  });
  if (!rows.length) return el("p", {class: "dim"}, "No tool calls yet.");
  return table(["tool", "calls", "rate", "p50", "p99", "errors", "cache hits", "coalesced"], rows);
}

function sessions(state) {
  const s = state.sessions;
  const parts = [el("p", {}, s.connected.length + " session(s) connected", el("span", {class: "dim"}, " " + s.note))];
  if (s.connected.length) {
    parts.push(table(["client", "protocol", "transport"], s.connected.map(c =>
      el("tr", {}, el("td", {class: "name"}, c.client), el("td", {}, c.protocol), el("td", {}, c.transport)))));
  }
  if (state.profiles.length) {
    parts.push(el("h2", {}, "Profiles"));
    parts.push(table(["profile", "tools", "servers", "own tokens"], state.profiles.map(p =>
      el("tr", {data: {profile: p.name}}, el("td", {class: "name"}, p.name), el("td", {}, p.tools),
        el("td", {}, p.servers), el("td", {}, p.tokens ? "yes" : "no")))));
  } else {
    parts.push(el("p", {class: "dim"}, "No [profiles.NAME] tables: every client sees the whole catalog."));
  }
  return parts;
}

function engine(state) {
  if (!state.engine) return el("p", {class: "dim"}, "Inference is off ([inference] backend = \\"off\\").");
  if (!state.engine.length) return el("p", {class: "dim"}, "No model loaded yet (each loads on first use).");
  return table(["model", "running", "waiting", "KV used", "tok/s", "TTFT p50", "TTFT p99"], state.engine.map(m =>
    el("tr", {data: {model: m.model}}, el("td", {class: "name"}, m.model), el("td", {}, m.running),
      el("td", {}, m.waiting), el("td", {}, pct(m.kv_usage)), el("td", {}, m.tokens_per_s.toFixed(1)),
      el("td", {}, ms(m.ttft_p50_ms)), el("td", {}, ms(m.ttft_p99_ms)))));
}

function backends(state) {
  const rows = state.backends || [];
  if (rows.length === 1 && rows[0].kind === "local") return [];  // the embedded engine alone
  const headers = ["backend", "kind", "state", "in flight", "requests", "failed", "busy", "refused"];
  return [el("h2", {}, "Backends"), table(headers, rows.map(b => {
    const state = el("td", {class: "state state-" + (b.state === "up" ? "ready" : "down")}, b.state);
    return el("tr", {data: {backend: b.name}, title: b.last_error},
      el("td", {class: "name"}, b.name), el("td", {}, b.kind), state, el("td", {}, b.in_flight),
      el("td", {}, b.requests), el("td", {}, b.failed), el("td", {}, b.busy), el("td", {}, b.refused));
  }))];
}

function search(state) {
  const s = state.search;
  if (!s) return el("p", {class: "dim"}, "Tool search is off ([mux] tool_search = \\"off\\").");
  return el("dl", {},
    el("dt", {}, "mode"),
    el("dd", {}, s.mode + (s.active ? ": on (tools/list shows mcpmux's own and pinned tools)" : ": lists every tool")),
    el("dt", {}, "index"), el("dd", {}, s.indexed ? s.tools + " tools indexed" : "indexing " + s.tools + " tools"),
    el("dt", {}, "ranking"), el("dd", {}, s.ranking));
}

function section(title, content, wide) {
  return el("section", wide ? {class: "wide"} : {}, el("h2", {}, title), ...[].concat(content));
}

function draw(state) {
  const now = Date.now();
  document.getElementById("about").textContent =
    "mcpmux " + state.server.version + " · " + state.server.source + " · up " + since(state.server.uptime_s);
  const main = document.querySelector("main");
  main.replaceChildren(
    section("Upstreams", upstreams(state), true),
    section("Calls per tool", tools(state, now), true),
    section("Sessions", sessions(state)),
    section("Inference engine", [engine(state), ...backends(state)]),
    section("Tool search", search(state)));
  const calls = {};
  for (const t of state.tools) calls[t.upstream + "/" + t.tool] = t.calls;
  previous = {at: now, calls: calls};
}

function live(text, ok) {
  const node = document.getElementById("live");
  node.textContent = text;
  node.className = ok ? "dim" : "off";
}

function askForToken(why) {
  const main = document.querySelector("main");
  const input = el("input",
    {type: "password", autocomplete: "off", placeholder: "bearer token", "aria-label": "bearer token"});
  const form = el("form", {}, input, el("button", {type: "submit"}, "Show"));
  form.addEventListener("submit", event => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    poll();
  });
  main.replaceChildren(section("Sign in", [el("p", {}, why), form], true));
}

async function poll() {
  clearTimeout(poll.timer);
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? {Authorization: "Bearer " + token} : {};
  try {
    const response = await fetch("/dashboard/state", {headers: headers, cache: "no-store"});
    if (response.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      live("needs a token", false);
      askForToken(token ? "That token was not accepted."
        : "This server needs a bearer token: one of [http]'s, as MCP clients send.");
      return;
    }
    if (!response.ok) {
      live("refused", false);
      document.querySelector("main").replaceChildren(section("Refused", el("p", {}, await response.text()), true));
      return;
    }
    draw(await response.json());
    live("live · every " + POLL_MS / 1000 + " s", true);
  } catch (err) {
    live("server not answering: retrying", false);
  }
  poll.timer = setTimeout(poll, POLL_MS);
}

poll();
""".replace("__POLL_MS__", str(POLL_MS))

_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mcpmux</title>
<link rel="icon" href="data:,">
<style>__STYLE__</style>
</head>
<body>
<header><h1>mcpmux</h1><span id="about" class="dim"></span><span id="live" class="dim">connecting…</span></header>
<main></main>
<script>__SCRIPT__</script>
</body>
</html>
"""

PAGE = _HTML.replace("__STYLE__", _STYLE).replace("__SCRIPT__", _SCRIPT).encode()
"""The page, as sent."""

_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; script-src 'sha256-{_SCRIPT_HASH}'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""Nothing loads but the page, its own script and its state; no site may frame it."""
