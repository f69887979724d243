// The anyrtd status page: polls the control API's JSON routes and draws what they say.
// No build step and nothing from elsewhere: plain DOM and SVG. The only writes are the
// existing POST routes (enable, disable, run), sent same-origin with a JSON content type.
//
// Views: the location's hash picks one (ROUTES, below): `#/` the triggers, `#/triggers/ID`
// one trigger, `#/runs/ID` one run and its output. A view is an entry of VIEWS: the
// section it draws in, what it reads besides the list on each poll (`load`), and how it
// draws (`render`). Record data goes into the page as text nodes and attribute values,
// never as markup: ids and names come from the server's records and are untrusted.
"use strict";

// Fetch anyrtd's words; until the daemon answers, say so and try again.
async function loadWords() {
  for (;;) {
    try {
      const resp = await fetch("/static/vocab.json", { cache: "no-store" });
      if (resp.ok) return await resp.json();
    } catch (err) {
      // not reachable yet: fall through to the banner and the retry
    }
    const banner = document.getElementById("banner");
    banner.textContent = "The control API is not answering; trying again every 2 s.";
    banner.hidden = false;
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

(async () => {
  // anyrtd's words (run statuses, markers, states, verdicts), from anyrtd/vocab.py.
  const W = await loadWords();
  const POLL_MS = 2000;
  const FOLLOW_MS = 1000; // while a run's output is followed
  const TOKEN_KEY = "anyrtd.token";
  const SORT_KEY = "anyrtd.sort";
  const RUNS_LIMIT = 500;
  const ROW_RUNS = 60;
  const STATUSES = Object.values(W.RunStatus);
  const MARKERS = Object.values(W.Marker);
  const STATE = W.TriggerState;
  const SPANS = [300, 900, 3600, 21600, 86400, 604800, 2592000];
  const SVG_NS = "http://www.w3.org/2000/svg";
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";

  const $ = (id) => document.getElementById(id);
  const view = {
    data: null, // the last poll's answers
    route: null, // {name, params, query} from the location's hash
    detail: null, // the trigger view's answers: {id, trigger, runs, why, missed} or {id, error}
    run: null, // the run view's answers: {id, run, error}
    output: null, // the run view's output as followed: {runId, next, running, text}
    rows: new Map(), // trigger id -> {tr, cells}
    timer: null,
    inFlight: false,
    failingSince: null,
    noticeUntil: 0, // an action's error stays up this long (ms since the epoch)
  };

  class NeedToken extends Error {}

  // ------------------------------------------------------------------ the JSON routes

  async function call(path, method = "GET") {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    // The guard takes a write with a JSON content type (or none) from a same-origin page.
    if (method !== "GET") headers["Content-Type"] = "application/json";
    const resp = await fetch(path, { method, headers, cache: "no-store", credentials: "omit" });
    if (resp.status === 401) throw new NeedToken();
    const text = await resp.text();
    let body = null;
    if ((resp.headers.get("Content-Type") || "").startsWith("application/json") && text) {
      body = JSON.parse(text);
    }
    return { status: resp.status, body, text, headers: resp.headers };
  }

  function failure(answer, what) {
    const err = answer.body && answer.body.error;
    return new Error(`${what}: ${err ? err.message : "HTTP " + answer.status}`);
  }

  async function poll() {
    if (view.inFlight) {
      view.again = true; // the view changed meanwhile: poll again once this one is done
      return;
    }
    view.inFlight = true;
    view.again = false;
    try {
      const [triggers, runs, election, health, metrics] = await Promise.all([
        call("/triggers?all=true"),
        call(`/runs?limit=${RUNS_LIMIT}`),
        call("/election"),
        call("/healthz"), // 503 while starting or stale: still a body to show
        call("/metrics"),
      ]);
      for (const [answer, what] of [[triggers, "GET /triggers"], [runs, "GET /runs"], [election, "GET /election"]]) {
        if (answer.status !== 200) throw failure(answer, what);
      }
      const depth = /^anyrtd_outbox_depth (\d+)$/m.exec(metrics.text);
      view.data = {
        at: Date.now() / 1000,
        triggers: triggers.body,
        runs: runs.body,
        election: election.body,
        health: health.body,
        outboxDepth: depth ? Number(depth[1]) : null,
      };
      const load = VIEWS[view.route.name].load;
      if (load) await load(view.route);
      view.failingSince = null;
      if (Date.now() > view.noticeUntil) hideBanner();
      render();
    } catch (err) {
      if (err instanceof NeedToken) {
        askToken();
        return; // polling resumes when a token is given
      }
      view.failingSince = view.failingSince || new Date();
      showBanner(`The control API is not answering since ${clock(view.failingSince.getTime() / 1000)} (${err.message}); the figures below are the last ones read.`);
    } finally {
      view.inFlight = false;
    }
    if (view.again) {
      poll();
      return;
    }
    schedule();
  }

  // The trigger view's reads: the trigger, its runs on every device, its why, its missed.
  async function loadTrigger(route) {
    const id = route.params.id;
    if (id === null) {
      view.detail = { id, error: route.params.problem };
      return;
    }
    const path = "/triggers/" + encodeURIComponent(id);
    const [trigger, runs, why, missed] = await Promise.all([
      call(path), call(path + "/runs"), call(path + "/why"), call(path + "/missed"),
    ]);
    if (trigger.status !== 200) {
      const err = trigger.body && trigger.body.error;
      view.detail = {
        id,
        error: trigger.status === 404
          ? `No trigger “${id}” here: this daemon holds no entry and knows no record with that id.`
          : err ? err.message : `GET ${path} answered HTTP ${trigger.status}`,
        why: why.status === 200 ? why.body : null,
      };
      return;
    }
    view.detail = {
      id,
      trigger: trigger.body,
      runs: runs.status === 200 ? runs.body : [],
      source: runs.status === 200 ? runs.headers.get("X-Anyrtd-Source") : null,
      why: why.status === 200 ? why.body : null,
      missed: missed.status === 200 ? missed.body : null,
    };
  }

  // The run view's reads: the run, and its output from where the last read ended.
  async function loadRun(route) {
    const id = route.params.id;
    if (id === null) {
      view.run = { id, error: route.params.problem };
      return;
    }
    const path = "/runs/" + encodeURIComponent(id);
    if (!view.output || view.output.runId !== id) {
      view.output = { runId: id, next: 0, running: true, text: "", fresh: true };
    }
    const out = view.output;
    const run = await call(path);
    if (run.status !== 200) {
      const err = run.body && run.body.error;
      view.run = { id, error: err ? err.message : `GET ${path} answered HTTP ${run.status}` };
      return;
    }
    view.run = { id, run: run.body };
    if (!out.running) return;
    const part = await call(`${path}/output?from=${out.next}`);
    if (part.status !== 200 || view.output !== out) return;
    out.added = (out.added || "") + part.body.text;
    out.text += part.body.text;
    out.next = part.body.next;
    out.running = part.body.running;
    out.dropped = part.body.outputDropped;
  }

  function schedule() {
    clearTimeout(view.timer);
    const following = view.route.name === "run" && view.output && view.output.running;
    view.timer = setTimeout(poll, following ? FOLLOW_MS : POLL_MS);
  }

  async function act(id, action, button) {
    button.disabled = true;
    try {
      const answer = await call(`/triggers/${encodeURIComponent(id)}/${action}`, "POST");
      if (answer.status >= 300) throw failure(answer, `${action} ${id}`);
      view.noticeUntil = 0;
      hideBanner();
    } catch (err) {
      if (err instanceof NeedToken) askToken();
      else {
        view.noticeUntil = Date.now() + 10000;
        showBanner(err.message);
      }
    } finally {
      button.disabled = false;
    }
    clearTimeout(view.timer);
    await poll();
  }

  // ------------------------------------------------------------------ the token

  function askToken() {
    clearTimeout(view.timer);
    $("token-form").hidden = false;
    $("token").focus();
    $("updated").textContent = "needs a token";
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    $("token-form").hidden = true;
    poll();
  });

  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });

  // ------------------------------------------------------------------ words and numbers

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value !== null && value !== undefined) node.setAttribute(key, value);
    }
    for (const child of children.flat(Infinity)) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function svg(tag, attrs = {}, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function badge(word, extra = "") {
    return el("span", { class: `badge s-${word} ${extra}`.trim() }, word);
  }

  function pad(n) {
    return String(n).padStart(2, "0");
  }

  function clock(ts) {
    const d = new Date(ts * 1000);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function when(ts) {
    const d = new Date(ts * 1000);
    const today = new Date();
    const day = d.toDateString() === today.toDateString()
      ? ""
      : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `;
    return day + clock(ts);
  }

  function ago(seconds) {
    const s = Math.abs(seconds);
    const text = s < 1 ? "now" : s < 90 ? `${Math.round(s)} s`
      : s < 5400 ? `${Math.round(s / 60)} min` : s < 172800 ? `${Math.round(s / 3600)} h`
        : `${Math.round(s / 86400)} d`;
    if (text === "now") return text;
    return seconds >= 0 ? `in ${text}` : `${text} ago`;
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "—";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
    return `${(ms / 60000).toFixed(1)} min`;
  }

  function lateness(run) {
    if (run.scheduledAt === null || run.scheduledAt === undefined) return null;
    return run.startedAt - run.scheduledAt;
  }

  // Signed after rounding: a start 0.3 ms early reads `0.000 s`, never `-0.000 s`.
  function lateText(late, plus) {
    const text = Math.abs(late).toFixed(3);
    const sign = /[1-9]/.test(text) ? (late < 0 ? "-" : plus ? "+" : "") : "";
    return `${sign}${text} s`;
  }

  function scheduleText(t) {
    const spec = t.spec;
    if (!spec || typeof spec !== "object") return t.kind || "?";
    if (typeof spec.cron === "string") return `cron ${spec.cron}${spec.tz ? " " + spec.tz : " UTC"}`;
    if (typeof spec.every_s === "number") return `every ${spec.every_s} s`;
    if (typeof spec.at === "number") return `once at ${when(spec.at)}`;
    if (t.chain) return t.chain.after;  // a chain: "after each ok run of nightly-backup"
    if (t.kind === "event") return `event ${spec.dataset || ""}`.trim();
    return t.kind || "?";
  }

  function isStamp(owner) {
    return owner.startsWith(W.stampPrefix) && /^\d+$/.test(owner.slice(W.stampPrefix.length));
  }

  function shortPeer(peer) {
    if (!peer) return "unassigned";
    return peer.length > 16 ? `${peer.slice(0, 8)}…${peer.slice(-6)}` : peer;
  }

  // ------------------------------------------------------------------ the timeline

  function span() {
    const chosen = $("span").value;
    if (chosen !== "auto") return Number(chosen);
    const now = view.data.at;
    let oldest = now;
    for (const run of view.data.runs) oldest = Math.min(oldest, run.startedAt, run.scheduledAt ?? run.startedAt);
    const needed = (now - oldest) * 1.05;
    return SPANS.find((s) => s >= needed) || SPANS[SPANS.length - 1];
  }

  // Draw runs between t0 and t1: a bar from start to end (to now while running), coloured
  // by status, and a red line from the scheduled time to the start when the run was late.
  function timeline(runs, t0, t1, now, width, height, opts = {}) {
    const axis = opts.axis ? 14 : 0;
    const top = 2;
    const h = height - axis - top * 2;
    const x = (t) => ((t - t0) / (t1 - t0)) * width;
    const root = svg("svg", { class: "timeline", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    root.append(svg("rect", { class: "frame", x: 0.5, y: 0.5, width: width - 1, height: height - axis - 1 }));
    if (opts.axis) {
      const g = svg("g", { class: "axis" });
      for (let i = 0; i <= 4; i++) {
        const t = t0 + ((t1 - t0) * i) / 4;
        const px = Math.min(width - 1, Math.max(0, x(t)));
        g.append(svg("line", { x1: px, x2: px, y1: height - axis, y2: height - axis + 3 }));
        const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
        g.append(svg("text", { x: px, y: height - 2, "text-anchor": anchor }, clock(t)));
      }
      root.append(g);
    }
    const nowX = x(now);
    root.append(svg("line", { class: "now", x1: nowX, x2: nowX, y1: 1, y2: height - axis - 1 }));
    if (opts.nextFire && opts.nextFire >= t0 && opts.nextFire <= t1) {
      const nx = x(opts.nextFire);
      const mid = top + h / 2;
      const next = svg("path", { class: "next", d: `M${nx - 4},${mid - 5} L${nx + 4},${mid} L${nx - 4},${mid + 5} Z` });
      next.append(svg("title", {}, `next fire ${when(opts.nextFire)}`));
      root.append(next);
    }
    // A missed occurrence (GET /triggers's `missed.at`): a red ring where it was due.
    for (const at of opts.missed || []) {
      if (at < t0 || at > t1) continue;
      const mark = svg("circle", { class: "missed", cx: x(at).toFixed(2), cy: top + h / 2, r: 3.5, "data-at": at });
      mark.append(svg("title", {}, `missed ${when(at)}${opts.missedText ? ": " + opts.missedText : ""}`));
      root.append(mark);
    }
    for (const run of runs) {
      const end = run.endedAt ?? now;
      if (end < t0 || run.startedAt > t1) continue;
      const x0 = Math.max(0, x(run.startedAt));
      const x1 = Math.min(width, x(end));
      const status = run.status;
      const bar = svg("rect", {
        class: `run run-${status}`,
        x: x0.toFixed(2), y: top + 2, width: Math.max(2, x1 - x0).toFixed(2), height: h - 4, rx: 1,
        "data-run-id": run.runId, "data-status": status,
      });
      const late = lateness(run);
      const parts = [`${run.runId}: ${status}`, `started ${when(run.startedAt)}`, `took ${duration(run.durationMs)}`];
      if (late !== null) parts.push(`scheduled ${when(run.scheduledAt)} (${lateText(late, true)})`);
      else parts.push("manual run");
      if (run.error) parts.push(run.error);
      bar.append(svg("title", {}, parts.join("\n")));
      if (late !== null) {
        const sx = x(run.scheduledAt);
        root.append(svg("line", { class: "sched", x1: sx, x2: sx, y1: top, y2: top + h }));
        if (x0 - sx >= 1) root.append(svg("line", { class: "late", x1: sx, x2: x0, y1: top + h / 2, y2: top + h / 2 }));
      }
      root.append(bar);
    }
    return root;
  }

  // ------------------------------------------------------------------ drawing

  function render() {
    const d = view.data;
    $("updated").textContent = `updated ${clock(d.at)}`;
    const e = d.election || {};
    $("device").textContent = e.peerId ? `device ${e.peerId}` : "";
    $("zone").textContent = `times in ${zone}`;
    $("forget").hidden = !sessionStorage.getItem(TOKEN_KEY);
    showView();
    VIEWS[view.route.name].render(d);
  }

  // Show the current view's section alone.
  function showView() {
    for (const [name, v] of Object.entries(VIEWS)) $(v.section).hidden = name !== view.route.name;
  }

  function renderList(d) {
    document.title = "anyrtd status";
    renderHealth(d);
    renderTriggers(d);
    renderDevices(d);
  }

  function card(label, value, tone, note, id) {
    return el("div", { class: `card ${tone}`, id },
      el("div", { class: "label" }, label),
      el("div", { class: "value" }, String(value)),
      note ? el("div", { class: "note" }, note) : null);
  }

  function renderHealth(d) {
    const h = d.health || {};
    // A standing built-in whose program is not installed here is expected (anyrtd ships
    // two of the six): listed as such, not an alarm. Any other marker is one.
    const expected = (t) => t.marker === W.Marker.NOT_INSTALLED && W.standingBuiltins.includes(t.id);
    const held = d.triggers.filter((t) => t.adopted && t.marker);
    const marked = held.filter((t) => !expected(t));
    const resting = held.length - marked.length;
    const markers = marked.length;
    const byMarker = MARKERS.map((m) => [m, marked.filter((t) => t.marker === m).length]);
    const restingNote = resting ? `${resting} built-ins not installed here (expected)` : "";
    const markerNote = [...byMarker.filter(([, n]) => n).map(([m, n]) => `${n} ${m}`), restingNote]
      .filter(Boolean).join(", ");
    const auto = d.triggers.filter((t) => t.state === STATE.AUTO_DISABLED).length;
    const malformed = d.triggers.filter((t) => t.state === STATE.MALFORMED).length;
    const missed = d.triggers.filter((t) => t.missed);
    const missedNote = missed.slice(0, 3).map((t) => `${t.id}: ${t.missed.text}`).join("; ");
    const tick = h.lastTickAgeS === null || h.lastTickAgeS === undefined ? "no tick yet" : `last tick ${h.lastTickAgeS.toFixed(1)} s ago`;
    const server = h.serverResolved ? "reachable" : "not yet";
    const cards = [
      card("daemon", h.status || "?", h.status === "ok" ? "good" : h.status === "starting" || h.status === "degraded" ? "warn" : "bad", `${tick} · ${h.version ? "v" + h.version : ""}`, "h-daemon"),
      card("server", server, h.serverResolved && !h.lastError ? "good" : h.serverResolved ? "warn" : "bad", h.lastError ? `last error: ${h.lastError}` : "datasets resolved", "h-server"),
      card("outbox", d.outboxDepth ?? "?", d.outboxDepth ? "warn" : "good", "writes waiting for the server", "h-outbox"),
      card("markers", markers, markers ? "bad" : "good", markerNote || "every held trigger can fire", "h-markers"),
      card("auto-disabled", auto, auto ? "bad" : "good", "breaker tripped: enable to reset", "h-auto"),
      card("missed", missed.length, missed.length ? "bad" : "good", missedNote || "every trigger ran when due", "h-missed"),
      card("election", electionVerdict(d.election), d.election && d.election.verdict === W.Verdict.ACTIVE ? "good" : "warn", electionNote(d.election), "h-election"),
    ];
    if (malformed) cards.push(card("malformed", malformed, "bad", "records the daemon skips", "h-malformed"));
    $("health").replaceChildren(...cards);
  }

  function electionVerdict(e) {
    return e ? e.verdict : "?";
  }

  function electionNote(e) {
    if (!e) return "";
    if (!e.enabled) return "one device: no election (always active)";
    return e.active ? "this device is the active one" : `active: ${shortPeer(e.winner)}`;
  }

  function rowOf(t) {
    let row = view.rows.get(t.id);
    if (row) return row;
    const cells = {};
    const tr = el("tr", { class: "trigger", "data-id": t.id });
    for (const name of ["id", "schedule", "state", "next", "last", "owner", "runs", "actions"]) {
      cells[name] = el("td", { class: name });
      tr.append(cells[name]);
    }
    const toggle = el("button", { type: "button", class: "toggle" });
    const run = el("button", { type: "button", class: "run" }, "run now");
    toggle.addEventListener("click", (event) => {
      event.stopPropagation();
      act(t.id, toggle.dataset.action, toggle);
    });
    run.addEventListener("click", (event) => {
      event.stopPropagation();
      act(t.id, "run", run);
    });
    cells.actions.append(toggle, run);
    tr.addEventListener("click", (event) => {
      if (event.target.closest("a")) return; // the id's link navigates by itself
      location.hash = triggerHref(t.id);
    });
    row = { tr, cells, toggle, run, key: {} };
    view.rows.set(t.id, row);
    return row;
  }

  // Replace a cell's content only when what it shows changed, so a click is never lost
  // to a redraw and the page does not flicker.
  function fill(row, name, key, build) {
    if (row.key[name] === key) return;
    row.key[name] = key;
    const content = build();
    const nodes = Array.isArray(content) ? content : [content];
    row.cells[name].replaceChildren(...nodes.filter((node) => node !== null && node !== undefined));
  }

  function renderTriggers(d) {
    const now = d.at;
    const seconds = span();
    const t0 = now - seconds;
    const t1 = now + seconds * 0.08;
    const byTrigger = new Map();
    for (const run of d.runs) {
      const list = byTrigger.get(run.triggerId) || [];
      if (list.length < ROW_RUNS) list.push(run);
      byTrigger.set(run.triggerId, list);
    }
    const me = d.election && d.election.peerId;
    const winner = d.election && d.election.winner;
    const sorted = sortTriggers(d.triggers, view.list.sort);
    const shown = sorted.filter(matcher(view.list.q));
    const body = $("triggers").tBodies[0];
    const seen = new Set();
    for (const t of sorted) seen.add(t.id);
    renderSortHeads();
    $("runs-axis").replaceChildren(stripAxis(t0, t1, now, 240));
    shown.forEach((t, i) => {
      const row = rowOf(t);
      row.tr.dataset.state = t.state;
      row.tr.dataset.enabled = String(t.enabled);
      row.tr.dataset.nextFire = t.nextFire === null ? "" : String(t.nextFire);
      row.tr.dataset.missed = String(t.missed ? t.missed.count : 0);
      fill(row, "id", JSON.stringify([t.id, t.name]), () => [
        el("a", { href: triggerHref(t.id), class: "open" }, t.id),
        t.name && t.name !== t.id ? el("span", { class: "name" }, t.name) : null]);
      fill(row, "schedule", JSON.stringify([t.spec, t.program]), () => [
        el("code", {}, scheduleText(t)), el("span", { class: "sub" }, t.program || "")]);
      row.tr.dataset.severity = t.severity;
      fill(row, "state", `${t.state}|${t.stateReason}|${t.severity}|${t.malformed || ""}`, () => stateBadge(t));
      fill(row, "next", `${t.nextFire}|${t.severity}|${Math.round((t.nextFire ?? 0) - now)}`, () =>
        t.nextFire === null || !firesAsShown(t) ? el("span", { class: "muted" }, "—")
          : [when(t.nextFire), el("span", { class: "sub" }, ago(t.nextFire - now))]);
      const missedKey = t.missed ? `${t.missed.count}|${t.missed.cause}` : "";
      fill(row, "last", `${t.lastStatus}|${t.lastRunAt}|${t.consecutiveFailures}|${Math.round(now - (t.lastRunAt ?? now))}|${missedKey}`, () => [
        t.lastStatus === null ? el("span", { class: "muted" }, t.runCount || t.lastRunAt ? "—" : "never ran")
          : [badge(t.lastStatus), el("span", { class: "sub" },
            (t.lastRunAt ? ago(t.lastRunAt - now) : "") + (t.consecutiveFailures ? ` · ${t.consecutiveFailures} failures in a row` : ""))],
        t.missed ? el("span", { class: "sub missed", title: t.missed.text }, `missed ${t.missed.count}${t.missed.capped ? "+" : ""}: ${t.missed.cause}`) : null,
      ].flat());
      fill(row, "owner", `${t.owner}|${me}|${winner}`, () => {
        const parts = [el("span", { title: t.owner || "unassigned" }, shortPeer(t.owner))];
        if (t.owner && t.owner === me) parts.push(" ", badge("this device", "here"));
        if (t.owner && t.owner === winner && d.election.enabled) parts.push(" ", badge(W.Verdict.ACTIVE, "active"));
        return parts;
      });
      const runs = byTrigger.get(t.id) || [];
      // The timeline moves with the clock: redraw it on every poll.
      row.cells.runs.replaceChildren(timeline(runs, t0, t1, now, 240, 26, {
        nextFire: t.nextFire, missed: t.missed ? t.missed.at : [], missedText: t.missed ? t.missed.text : "" }));
      row.cells.runs.dataset.runs = String(runs.length);
      row.cells.runs.dataset.runIds = runs.map((r) => r.runId).join(" ");
      const action = t.enabled ? "disable" : "enable";
      if (row.toggle.dataset.action !== action) {
        row.toggle.dataset.action = action;
        row.toggle.textContent = action;
      }
      // Enabling a once that already ran does not run it again (the control API refuses
      // it, 409 consumed): a new `at` does, `anyrtd triggers edit ID --at TIME`.
      row.toggle.hidden = t.state === STATE.CONSUMED;
      // A run by hand that could only fail here (chat-watch, a program not installed) is
      // not offered; the control API would refuse it (409 cannot_run).
      row.run.hidden = !t.adopted || Boolean(t.runNowRefused);
      if (body.rows[i] !== row.tr) body.insertBefore(row.tr, body.rows[i] || null);
    });
    // Rows filtered out leave the table but keep their cells; rows of deleted records go.
    const kept = new Set(shown.map((t) => t.id));
    for (const [id, row] of view.rows) {
      if (!kept.has(id)) row.tr.remove();
      if (!seen.has(id)) view.rows.delete(id);
    }
    $("empty").hidden = sorted.length > 0;
    $("no-match").hidden = !(sorted.length > 0 && shown.length === 0);
    $("no-match").textContent = `No trigger matches “${view.list.q}”.`;
    const adopted = d.triggers.filter((t) => t.adopted).length;
    const filtered = shown.length === sorted.length ? "" : `, ${shown.length} shown`;
    $("counts").textContent = `${d.triggers.length} records, ${adopted} held by this device${filtered}`;
    $("legend").replaceChildren(
      el("span", { class: "legend-part", id: "legend-states", title: "a trigger's state: the same word `anyrtd triggers list` and `why` give it" },
        "state: ", ...Object.entries(SEVERITY_TEXT).flatMap(([sev, text]) => [el("span", { class: `badge sev-${sev}` }, text), " "])),
      el("span", { class: "legend-part", id: "legend-runs" },
        "run status: ", ...STATUSES.flatMap((s) => [el("i", { class: `run-${s}` }), s]),
        el("i", { class: "late" }), "late start", el("i", { class: "missed" }), "missed"),
      el("span", { class: "legend-part muted", id: "legend-last" },
        `last status is the trigger's (${Object.values(W.LastStatus).join(", ")}: error when its last run ended FAILED); run status is each run's (${STATUSES.join(", ")})`));
  }

  // What each severity of a state means (anyrtd/vocab.py, Severity): the legend's words.
  const SEVERITY_TEXT = {
    [W.Severity.OK]: "fires as meant",
    [W.Severity.BUSY]: "on its way",
    [W.Severity.QUIET]: "does not fire here, as meant",
    [W.Severity.WARN]: "needs a look",
    [W.Severity.BAD]: "cannot fire until fixed",
  };

  // Whether a trigger's next fire is one (as `triggers list` shows it): a state that cannot
  // fire until fixed, or does not fire here as meant, has none to show.
  function firesAsShown(t) {
    return t.severity !== W.Severity.BAD && t.severity !== W.Severity.QUIET;
  }

  // A trigger's state cell: the state, the reason in a word, coloured by its severity.
  function stateBadge(t) {
    const b = el("span", { class: `badge state sev-${t.severity} s-${t.state}`, "data-severity": t.severity },
      t.state, t.stateReason ? el("span", { class: "reason" }, ` (${t.stateReason})`) : null);
    b.title = t.malformed || `${SEVERITY_TEXT[t.severity] || ""}: \`anyrtd triggers why ${t.id}\` says why`;
    return b;
  }

  // ------------------------------------------------------------------ finding things

  const SORTS = {
    id: (t) => [t.id],
    schedule: (t) => [scheduleText(t), t.program || ""],
    state: (t) => [t.state],
    next: (t) => [t.nextFire ?? Infinity],
    last: (t) => [t.lastStatus ?? "", -(t.lastRunAt ?? 0)],
    owner: (t) => [t.owner || ""],
  };

  // Sort by the user's choice (`-key` descending), then by id: the order holds still until
  // the user picks another (a row moves only when what it is sorted by changes).
  function sortTriggers(triggers, sort) {
    const desc = sort.startsWith("-");
    const keyOf = SORTS[desc ? sort.slice(1) : sort] || SORTS.id;
    const cmp = (x, y) => (typeof x === "number" ? (x === y ? 0 : x < y ? -1 : 1) : String(x).localeCompare(String(y)));
    return [...triggers].sort((a, b) => {
      const ka = keyOf(a);
      const kb = keyOf(b);
      for (let i = 0; i < ka.length; i++) {
        const c = cmp(ka[i], kb[i]);
        if (c) return desc ? -c : c;
      }
      return a.id.localeCompare(b.id);
    });
  }

  const FILTER_FIELDS = {
    id: (t) => [t.id],
    name: (t) => [t.name || ""],
    program: (t) => [t.program || ""],
    state: (t) => [t.state || ""],
    owner: (t) => [t.owner || "unassigned"],
  };

  // Every word of the filter must be found (case-insensitive) in the trigger's id, name,
  // program, state or owner; `field:word` looks in that field alone.
  function matcher(q) {
    const words = q.toLowerCase().split(/\s+/).filter(Boolean);
    if (!words.length) return () => true;
    return (t) => words.every((word) => {
      const colon = word.indexOf(":");
      const field = colon > 0 ? word.slice(0, colon) : null;
      if (field && FILTER_FIELDS[field]) {
        const want = word.slice(colon + 1);
        return FILTER_FIELDS[field](t).some((v) => v.toLowerCase().includes(want));
      }
      return Object.values(FILTER_FIELDS).some((f) => f(t).some((v) => v.toLowerCase().includes(word)));
    });
  }

  function renderSortHeads() {
    const sort = view.list.sort;
    for (const th of $("triggers").tHead.querySelectorAll("th[data-sort]")) {
      const key = th.dataset.sort;
      const on = sort === key ? "ascending" : sort === "-" + key ? "descending" : "none";
      if (th.getAttribute("aria-sort") !== on) th.setAttribute("aria-sort", on);
    }
  }

  function listHref() {
    const params = new URLSearchParams();
    if (view.list.q) params.set("q", view.list.q);
    if (view.list.sort !== "id") params.set("sort", view.list.sort);
    const query = params.toString();
    return "#/" + (query ? "?" + query : "");
  }

  // The filter and the order live in the list's URL (`#/?q=…&sort=…`, replaced in place so
  // typing makes no history) and the order also in localStorage, for the next visit.
  function setList(changes) {
    Object.assign(view.list, changes);
    if (changes.sort) localStorage.setItem(SORT_KEY, changes.sort);
    history.replaceState(null, "", listHref());
    if (view.data) renderList(view.data);
  }

  $("filter").addEventListener("input", () => setList({ q: $("filter").value }));
  for (const th of $("triggers").tHead.querySelectorAll("th[data-sort]")) {
    th.querySelector("button").addEventListener("click", () => {
      const key = th.dataset.sort;
      setList({ sort: view.list.sort === key ? "-" + key : key });
    });
  }

  // The shared time axis above the row timelines: their t0 to t1, now marked.
  function stripAxis(t0, t1, now, width) {
    const height = 14;
    const x = (t) => ((t - t0) / (t1 - t0)) * width;
    const root = svg("svg", { class: "timeline axis-strip", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    const seconds = now - t0;
    const label = seconds <= 900 ? clock : seconds <= 86400 ? (t) => clock(t).slice(0, 5)
      : (t) => when(t).slice(5, 16);
    const ticks = seconds > 86400 ? [t0, now] : [t0, t0 + seconds / 2, now];
    const g = svg("g", { class: "axis" });
    ticks.forEach((t, i) => {
      const px = Math.min(width - 1, Math.max(0, x(t)));
      const last = i === ticks.length - 1;
      g.append(svg("line", { x1: px, x2: px, y1: height - 4, y2: height }));
      g.append(svg("text", { x: px + (i === 0 ? 0 : last ? -2 : 0), y: 9, "text-anchor": i === 0 ? "start" : last ? "end" : "middle", "data-at": Math.round(t) }, last ? "now" : label(t)));
    });
    root.append(g);
    root.append(svg("title", {}, `from ${when(t0)} to ${when(t1)}; ${zone}`));
    return root;
  }

  // ------------------------------------------------------------------ the trigger view

  function triggerHref(id) {
    return "#/triggers/" + encodeURIComponent(id);
  }

  function runHref(id) {
    return "#/runs/" + encodeURIComponent(id);
  }

  // A time in a named zone, `2026-12-05 07:30:00 GMT+1`; null for a zone this browser lacks.
  function zoned(ts, tz, withZone = true) {
    let parts;
    try {
      parts = new Intl.DateTimeFormat("en-GB", {
        timeZone: tz, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit",
        minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "shortOffset",
      }).formatToParts(new Date(ts * 1000));
    } catch (err) {
      return null;
    }
    const get = (type) => (parts.find((p) => p.type === type) || {}).value || "";
    const zoneName = withZone ? " " + get("timeZoneName") : "";
    return `${get("year")}-${get("month")}-${get("day")} ${get("hour")}:${get("minute")}:${get("second")}${zoneName}`;
  }

  function zoneOf(t) {
    return t.spec && typeof t.spec.tz === "string" && t.spec.tz ? t.spec.tz : "UTC";
  }

  // Fill a part of a view only when what it shows changed, as `fill` does for the rows.
  function part(holder, name, key, build) {
    const keys = holder.keys;
    if (keys[name] === key) return;
    keys[name] = key;
    const content = build();
    const nodes = (Array.isArray(content) ? content : [content]).filter((n) => n !== null && n !== undefined);
    holder.parts[name].replaceChildren(...nodes);
  }

  // A view's skeleton: one element per part, made once per trigger or run shown.
  function skeleton(section, id, names) {
    if (section.holder && section.holder.id === id) return section.holder;
    const holder = { id, keys: {}, parts: {} };
    for (const name of names) holder.parts[name] = el("div", { class: `part part-${name}` });
    section.replaceChildren(...Object.values(holder.parts));
    section.holder = holder;
    return holder;
  }

  function problem(section, title, message) {
    section.holder = null;
    section.replaceChildren(
      el("p", { class: "crumbs" }, el("a", { href: listHref() }, "← all triggers")),
      el("h2", {}, title),
      el("p", { class: "problem" }, message));
  }

  function renderDetail(d) {
    const section = $("detail");
    const id = view.route.params.id;
    const detail = view.detail;
    if (id === null) return problem(section, "No such trigger", view.route.params.problem);
    document.title = `${id} · anyrtd`;
    if (!detail || detail.id !== id) {
      section.holder = null;
      section.replaceChildren(el("p", { class: "muted" }, `loading ${id}…`));
      return;
    }
    if (detail.error) return problem(section, "No such trigger", detail.error);
    const t = detail.trigger;
    const now = d.at;
    const h = skeleton(section, id, ["head", "definition", "next", "why", "missed", "runsHead", "timeline", "runs"]);
    if (!h.toggle) {
      h.toggle = el("button", { type: "button", class: "toggle" });
      h.run = el("button", { type: "button", class: "run" }, "run now");
      h.toggle.addEventListener("click", () => act(id, h.toggle.dataset.action, h.toggle));
      h.run.addEventListener("click", () => act(id, "run", h.run));
    }
    part(h, "head", JSON.stringify([t.name, t.state]), () => [
      el("p", { class: "crumbs" }, el("a", { href: listHref() }, "← all triggers")),
      el("h2", {}, el("span", { class: "tid" }, t.id), t.name && t.name !== t.id ? el("span", { class: "muted" }, ` · ${t.name}`) : null,
        " ", badge(t.state), " ", el("span", { class: "actions" }, h.toggle, " ", h.run))]);
    const action = t.enabled ? "disable" : "enable";
    if (h.toggle.dataset.action !== action) {
      h.toggle.dataset.action = action;
      h.toggle.textContent = action;
    }
    h.run.hidden = !t.adopted || Boolean(t.runNowRefused);
    part(h, "definition", JSON.stringify([t, d.election && d.election.peerId]), () => definition(t, d));
    part(h, "next", JSON.stringify([t.nextFires, t.spec, Math.floor(now / 10)]), () => nextFires(t, now));
    part(h, "why", JSON.stringify(detail.why && { ...detail.why, now: 0 }), () => [
      el("h3", {}, "Why"), detail.why ? whyText(detail.why) : el("p", { class: "muted" }, "GET /triggers/:id/why did not answer.")]);
    part(h, "missed", JSON.stringify(detail.missed && { ...detail.missed, now: 0 }), () => missedPart(t, detail.missed));
    const runs = detail.runs;
    let t0 = now - 300;
    for (const run of runs) t0 = Math.min(t0, run.scheduledAt ?? run.startedAt, run.startedAt);
    // Past the now line by a tenth: the next fire shows when it falls in it.
    const t1 = now + (now - t0) * 0.1;
    h.parts.timeline.replaceChildren(timeline(runs, t0, t1, now, 900, 54, { axis: true, nextFire: t.nextFires[0], missed: t.missed ? t.missed.at : [] }));
    part(h, "runsHead", detail.source, () => el("h3", {}, "Runs", el("span", { class: "muted" }, detail.source === "mirror"
      ? " · this device's only (the server is not reachable)" : " · the 20 newest, every device")));
    part(h, "runs", JSON.stringify([runs, Math.floor(now / 10)]), () => runsPart(runs));
  }

  function definition(t, d) {
    const me = d.election && d.election.peerId;
    const facts = [
      ["kind", t.kind || "?"],
      ["schedule", el("code", {}, scheduleText(t))],
      ...(t.chain ? [["chain", `${t.chain.after} · last fired by ${t.chain.lastFiredBy ? "run " + t.chain.lastFiredBy : "—"}`]] : []),
      ["time zone", t.kind === "event" ? "—" : zoneOf(t)],
      ["program", el("code", {}, t.program || "—")],
      ["args", el("code", {}, JSON.stringify(t.args ?? {}))],
      ["enabled", String(t.enabled)],
      ["state", t.state + (t.markerReason ? ` (${t.markerReason})` : "") + (t.runNowRefused ? `; run now: ${t.runNowRefused}` : "")],
      ["owner", [t.owner || "unassigned", t.owner && t.owner === me ? [" ", badge("this device", "here")] : null].flat()],
      ["last run", t.lastRunAt ? `${when(t.lastRunAt)} (${ago(t.lastRunAt - d.at)}): ${t.lastStatus ?? "—"}` : "never ran"],
      ["runs", `${t.runCount ?? 0} · last took ${duration(t.lastDurationMs)} · breaker ${t.consecutiveFailures}/${t.maxConsecutiveFailures ?? "?"}`],
      ["version", String(t.version ?? "—")],
    ];
    return [
      el("h3", {}, "Definition"),
      el("dl", {}, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, ...[v].flat().filter((n) => n !== null))])),
      el("details", {}, el("summary", {}, "the trigger as GET /triggers/:id gives it"),
        el("pre", { class: "json" }, JSON.stringify(t, null, 2))),
    ];
  }

  // The next fires in the trigger's own zone, in UTC and in this browser's zone.
  function nextFires(t, now) {
    const tz = zoneOf(t);
    const head = el("h3", {}, "Next fires");
    if (!t.nextFires.length) return [head, el("p", { class: "muted" }, "None armed.")];
    const heads = tz === "UTC" ? ["#", "UTC", `here (${zone})`, ""] : ["#", tz, "UTC", `here (${zone})`, ""];
    const rows = t.nextFires.map((ts, i) => {
      const cells = [String(i + 1)];
      if (tz !== "UTC") cells.push(zoned(ts, tz) ?? `(${tz} is unknown to this browser)`);
      cells.push(zoned(ts, "UTC", false), when(ts), ago(ts - now));
      return el("tr", { "data-at": ts }, ...cells.map((c) => el("td", {}, c)));
    });
    return [head, el("table", { class: "fires" },
      el("thead", {}, el("tr", {}, ...heads.map((x) => el("th", {}, x)))), el("tbody", {}, ...rows))];
  }

  function missedPart(t, missed) {
    const head = el("h3", {}, "Missed");
    if (!missed) return [head, el("p", { class: "muted" }, t.kind === "event" ? "An event trigger has no occurrences to miss." : "GET /triggers/:id/missed did not answer.")];
    if (!missed.count) {
      return [head, el("p", { class: "muted" }, `None: every occurrence of the last ${ago(missed.lookbackS).replace("in ", "")} ran when due (a grace of ${Math.round(missed.graceS)} s).`)];
    }
    const tz = zoneOf(t);
    const rows = missed.occurrences.map((o) => el("tr", { "data-at": o.at },
      el("td", {}, zoned(o.at, tz) ?? when(o.at), tz === "UTC" ? null : el("span", { class: "sub" }, zoned(o.at, "UTC"))),
      el("td", {}, badge(o.cause)),
      el("td", {}, o.text),
      el("td", {}, o.fix ? el("code", {}, o.fix) : "")));
    return [head,
      el("p", {}, `${missed.count}${missed.capped ? "+" : ""} missed since ${when(missed.since)}${missed.count > rows.length ? ` (the newest ${rows.length} below)` : ""}.`),
      el("table", { class: "missed" },
        el("thead", {}, el("tr", {}, ...["due", "cause", "what happened", "fix"].map((x) => el("th", {}, x)))),
        el("tbody", {}, ...rows))];
  }

  function runsPart(runs) {
    if (!runs.length) return el("p", { class: "muted" }, "No runs yet.");
    const table = el("table", { class: "runs" },
      el("thead", {}, el("tr", {}, ...["run", "scheduled", "started", "late by", "took", "status", "device", "error", ""].map((x) => el("th", {}, x)))),
      el("tbody", {}, ...runs.map((r) => {
        const late = lateness(r);
        return el("tr", { "data-run-id": r.runId },
          el("td", {}, el("a", { href: runHref(r.runId) }, el("code", {}, r.runId.slice(0, 12)))),
          el("td", {}, r.scheduledAt === null ? "manual" : when(r.scheduledAt)),
          el("td", {}, when(r.startedAt)),
          el("td", {}, late === null ? "—" : lateText(late, false)),
          el("td", {}, r.status === W.RunStatus.RUNNING ? r.status : duration(r.durationMs)),
          el("td", {}, badge(r.status)),
          el("td", { title: r.device || "" }, shortPeer(r.device)),
          el("td", { class: "error" }, r.error || r.errorType || ""),
          el("td", {}, el("a", { href: runHref(r.runId), class: "output" }, r.status === W.RunStatus.RUNNING ? "follow output" : "output")));
      })));
    return table;
  }

  // ------------------------------------------------------------------ the run view

  function renderRun(d) {
    const section = $("run");
    const id = view.route.params.id;
    if (id === null) return problem(section, "No such run", view.route.params.problem);
    document.title = `run ${id.slice(0, 12)} · anyrtd`;
    const answer = view.run;
    if (!answer || answer.id !== id) {
      section.holder = null;
      section.replaceChildren(el("p", { class: "muted" }, `loading run ${id}…`));
      return;
    }
    if (answer.error) return problem(section, "No such run", answer.error);
    const r = answer.run;
    const out = view.output;
    const h = skeleton(section, id, ["head", "facts", "state", "output"]);
    if (!h.pre) {
      h.pre = el("pre", { class: "output", id: "output" });
      h.pre.append(out.text);
      out.added = "";
      h.parts.output.append(h.pre);
    }
    part(h, "head", r.triggerId || "", () => [
      el("p", { class: "crumbs" }, el("a", { href: listHref() }, "← all triggers"),
        r.triggerId ? [" · ", el("a", { href: triggerHref(r.triggerId) }, `← ${r.triggerId}`)] : null),
      el("h2", {}, "Run ", el("code", {}, r.runId))]);
    part(h, "facts", JSON.stringify(r, (k, v) => (k === "output" ? undefined : v)), () => {
      const late = lateness(r);
      const facts = [
        ["trigger", r.triggerId ? el("a", { href: triggerHref(r.triggerId) }, r.triggerId) : "—"],
        ["program", el("code", {}, r.program || "—")],
        ["device", r.device || "—"],
        ["scheduled", r.scheduledAt === null || r.scheduledAt === undefined ? "by hand" : when(r.scheduledAt)],
        ["started", when(r.startedAt)],
        ["late by", late === null ? "—" : lateText(late, false)],
        ["ended", r.endedAt ? when(r.endedAt) : "—"],
        ["took", r.status === W.RunStatus.RUNNING ? `running for ${duration((d.at - r.startedAt) * 1000)}` : duration(r.durationMs)],
        ["status", badge(r.status)],
      ];
      const error = [r.errorType, r.error].filter(Boolean).join(": ");
      if (error) facts.push(["error", el("span", { class: "error" }, error)]);
      if (r.title) facts.push(["title", r.title]);
      return el("dl", {}, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    });
    if (out.added) {
      const atEnd = h.pre.scrollTop + h.pre.clientHeight >= h.pre.scrollHeight - 4;
      h.pre.append(out.added);
      out.added = "";
      if (atEnd) h.pre.scrollTop = h.pre.scrollHeight;
    }
    const state = out.running
      ? "running: its output follows as it grows (read every second)"
      : out.text ? `ended ${r.status}: the whole output` : `ended ${r.status}, with no output`;
    part(h, "state", JSON.stringify([state, out.dropped]), () => [
      el("h3", {}, "Output"),
      el("p", { class: "muted", id: "output-state", "data-running": String(out.running) }, state,
        out.dropped ? ` · ${out.dropped} more bytes dropped past the capture's cap (docs/programs.md)` : "")]);
    section.dataset.running = String(out.running);
  }

  // ------------------------------------------------------------------ no such view

  function renderNowhere() {
    document.title = "anyrtd status";
    const path = view.route.path;
    $("nowhere").replaceChildren(
      el("p", { class: "crumbs" }, el("a", { href: "#/" }, "← all triggers")),
      el("h2", {}, "No such page"),
      el("p", { class: "problem" }, `Nothing is shown at #${path.slice(0, 200)}: the views are #/ (the triggers), #/triggers/ID (one trigger) and #/runs/ID (one run and its output).`));
  }

  // GET /triggers/:id/why: the verdict, then each reason with its fix (blocking ones first).
  function whyText(why) {
    const where = why.device ? ` on ${why.device}` : "";
    const head = why.fires
      ? `fires on this device${why.nextFire ? ", next " + when(why.nextFire) : ""}`
      : `will not fire on this device` + (why.device ? `; it fires${where}` : "");
    const items = why.reasons.map((r) => el("li", { class: r.blocking ? "blocking" : "note", "data-cause": r.cause },
      r.blocking ? "" : "note: ", r.text, r.fix ? el("span", { class: "muted" }, " — ", el("code", {}, r.fix)) : null));
    return el("div", { class: "why" }, head, items.length ? el("ol", {}, ...items) : null);
  }

  function renderDevices(d) {
    const e = d.election || {};
    const devices = new Map();
    const add = (peer) => {
      if (peer && !devices.has(peer)) devices.set(peer, 0);
    };
    add(e.peerId);
    if (e.enabled) add(e.winner);
    for (const t of d.triggers) {
      if (t.owner && !isStamp(t.owner)) {
        add(t.owner);
        devices.set(t.owner, devices.get(t.owner) + 1);
      }
    }
    const rows = [...devices].map(([peer, count]) => {
      const role = [];
      if (peer === e.peerId) role.push(badge("this device", "here"), " ");
      if (peer === (e.enabled ? e.winner : e.peerId)) role.push(badge(W.Verdict.ACTIVE, "active"));
      else if (peer === e.peerId) role.push(badge(e.verdict));
      return el("tr", { "data-peer": peer }, el("td", {}, el("code", {}, peer)), el("td", {}, ...role), el("td", {}, String(count)));
    });
    $("devices").tBodies[0].replaceChildren(...rows);
    $("election").textContent = e.enabled
      ? `Election on: the active device claims unassigned triggers; last poll ${e.lastPollAt ? when(e.lastPollAt) : "not yet"}. Devices are the ones this daemon knows: itself, the active one, and the owners of the records.`
      : "No election (one device, or the server has no devices registry): this device is always active. Devices are the ones this daemon knows: itself and the owners of the records.";
  }

  // ------------------------------------------------------------------ the banner

  function showBanner(text) {
    $("banner").textContent = text;
    $("banner").hidden = false;
  }

  function hideBanner() {
    $("banner").hidden = true;
  }

  // ------------------------------------------------------------------ the views and the router

  const VIEWS = {
    list: { section: "view-list", render: renderList },
    trigger: { section: "detail", load: loadTrigger, render: renderDetail },
    run: { section: "run", load: loadRun, render: renderRun },
    nowhere: { section: "nowhere", render: renderNowhere },
  };

  // A hash path and the view it shows, with the names of its captured parts.
  const ROUTES = [
    [/^\/?$/, "list", []],
    [/^\/triggers\/([^/]+)$/, "trigger", ["id"]],
    [/^\/runs\/([^/]+)$/, "run", ["id"]],
  ];

  function parseRoute() {
    const hash = location.hash.replace(/^#/, "");
    const mark = hash.indexOf("?");
    const path = mark >= 0 ? hash.slice(0, mark) : hash;
    const query = new URLSearchParams(mark >= 0 ? hash.slice(mark + 1) : "");
    for (const [pattern, name, keys] of ROUTES) {
      const match = pattern.exec(path);
      if (!match) continue;
      const params = {};
      keys.forEach((key, i) => {
        try {
          params[key] = decodeURIComponent(match[i + 1]);
        } catch (err) {
          params[key] = null;
          params.problem = `This address names no ${name} id: “${match[i + 1].slice(0, 120)}” is not valid percent-encoding (an id is written with encodeURIComponent).`;
        }
      });
      return { name, params, query, path };
    }
    return { name: "nowhere", params: {}, query, path };
  }

  function route() {
    const before = view.route;
    view.route = parseRoute();
    if (view.route.name === "list") {
      const sort = view.route.query.get("sort") || localStorage.getItem(SORT_KEY) || "id";
      view.list = { q: view.route.query.get("q") || "", sort: SORTS[sort.replace(/^-/, "")] ? sort : "id" };
      if ($("filter").value !== view.list.q) $("filter").value = view.list.q;
    }
    const moved = !before || before.name !== view.route.name || before.params.id !== view.route.params.id;
    if (moved && before) window.scrollTo(0, 0);
    if (view.data) render();
    clearTimeout(view.timer);
    poll();
  }

  view.list = { q: "", sort: localStorage.getItem(SORT_KEY) || "id" };
  $("span").addEventListener("change", () => view.data && render());
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) {
      clearTimeout(view.timer);
      poll();
    }
  });
  route();
})();
