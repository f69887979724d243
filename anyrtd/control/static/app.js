// The anyrtd status page: polls the control API's JSON routes and draws what they say.
// No build step and nothing from elsewhere: plain DOM and SVG. The only writes are the
// existing POST routes (enable, disable, run), sent same-origin with a JSON content type.
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
  const TOKEN_KEY = "anyrtd.token";
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
    detail: null, // {trigger, runs} of the selected trigger
    selected: null,
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
    return { status: resp.status, body, text };
  }

  function failure(answer, what) {
    const err = answer.body && answer.body.error;
    return new Error(`${what}: ${err ? err.message : "HTTP " + answer.status}`);
  }

  async function poll() {
    if (view.inFlight) return;
    view.inFlight = true;
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
      if (view.selected) await pollDetail(view.selected);
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
    schedule();
  }

  async function pollDetail(id) {
    const path = "/triggers/" + encodeURIComponent(id);
    const [trigger, runs, why] = await Promise.all([
      call(path), call(path + "/runs"), call(path + "/why"),
    ]);
    if (trigger.status === 404) {
      view.selected = null;
      view.detail = null;
      return;
    }
    if (trigger.status !== 200) throw failure(trigger, "GET " + path);
    view.detail = {
      trigger: trigger.body,
      runs: runs.status === 200 ? runs.body : [],
      why: why.status === 200 ? why.body : null,
    };
  }

  function schedule() {
    clearTimeout(view.timer);
    view.timer = setTimeout(poll, POLL_MS);
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
    for (const child of children) {
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
    renderHealth(d);
    renderTriggers(d);
    renderDetail(d);
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
    tr.addEventListener("click", () => select(t.id));
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
    const sorted = [...d.triggers].sort((a, b) =>
      (a.nextFire ?? Infinity) - (b.nextFire ?? Infinity) || a.id.localeCompare(b.id));
    const body = $("triggers").tBodies[0];
    const seen = new Set();
    sorted.forEach((t, i) => {
      const row = rowOf(t);
      seen.add(t.id);
      row.tr.dataset.state = t.state;
      row.tr.dataset.enabled = String(t.enabled);
      row.tr.dataset.missed = String(t.missed ? t.missed.count : 0);
      row.tr.classList.toggle("selected", view.selected === t.id);
      fill(row, "id", t.id + t.name, () => [t.id, t.name && t.name !== t.id ? el("span", { class: "name" }, t.name) : null]);
      fill(row, "schedule", JSON.stringify([t.spec, t.program]), () => [
        el("code", {}, scheduleText(t)), el("span", { class: "sub" }, t.program || "")]);
      row.tr.dataset.severity = t.severity;
      fill(row, "state", `${t.state}|${t.stateReason}|${t.severity}|${t.malformed || ""}`, () => stateBadge(t));
      fill(row, "next", `${t.nextFire}|${Math.round((t.nextFire ?? 0) - now)}`, () =>
        t.nextFire === null ? el("span", { class: "muted" }, "—")
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
    for (const [id, row] of view.rows) {
      if (!seen.has(id)) {
        row.tr.remove();
        view.rows.delete(id);
      }
    }
    $("empty").hidden = sorted.length > 0;
    const adopted = d.triggers.filter((t) => t.adopted).length;
    $("counts").textContent = `${d.triggers.length} records, ${adopted} held by this device`;
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

  // A trigger's state cell: the state, the reason in a word, coloured by its severity.
  function stateBadge(t) {
    const b = el("span", { class: `badge state sev-${t.severity} s-${t.state}`, "data-severity": t.severity },
      t.state, t.stateReason ? el("span", { class: "reason" }, ` (${t.stateReason})`) : null);
    b.title = t.malformed || `${SEVERITY_TEXT[t.severity] || ""}: \`anyrtd triggers why ${t.id}\` says why`;
    return b;
  }

  function select(id) {
    view.selected = view.selected === id ? null : id;
    view.detail = null;
    clearTimeout(view.timer);
    poll();
  }

  function renderDetail(d) {
    const section = $("detail");
    const detail = view.detail;
    if (!view.selected || !detail) {
      section.hidden = true;
      section.replaceChildren();
      return;
    }
    const t = detail.trigger;
    const now = d.at;
    const runs = detail.runs;
    let t0 = now - 300;
    for (const run of runs) t0 = Math.min(t0, run.scheduledAt ?? run.startedAt, run.startedAt);
    const t1 = Math.max(now + (now - t0) * 0.08, (t.nextFires[0] ?? now) + (now - t0) * 0.04);
    const facts = [
      ["schedule", scheduleText(t)],
      ["program", t.program || "—"],
      ["state", t.state + (t.markerReason ? ` (${t.markerReason})` : "")],
      ["owner", t.owner || "unassigned"],
      ["next fires", t.nextFires.length ? t.nextFires.map(when).join(", ") : "—"],
      ["runs", `${t.runCount ?? 0} · last took ${duration(t.lastDurationMs)} · breaker ${t.consecutiveFailures}/${t.maxConsecutiveFailures ?? "?"}`],
    ];
    const table = el("table", { class: "runs" },
      el("thead", {}, el("tr", {}, ...["run", "scheduled", "started", "late by", "took", "status", "error"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...runs.map((r) => {
        const late = lateness(r);
        return el("tr", { "data-run-id": r.runId },
          el("td", {}, el("code", {}, r.runId)),
          el("td", {}, r.scheduledAt === null ? "manual" : when(r.scheduledAt)),
          el("td", {}, when(r.startedAt)),
          el("td", {}, late === null ? "—" : lateText(late, false)),
          el("td", {}, r.status === W.RunStatus.RUNNING ? r.status : duration(r.durationMs)),
          el("td", {}, badge(r.status)),
          el("td", { class: "error" }, r.error || ""));
      })));
    if (detail.why) facts.push(["why", whyText(detail.why)]);
    section.replaceChildren(
      el("h2", {}, `${t.id}`, t.name !== t.id ? el("span", { class: "muted" }, ` · ${t.name}`) : null),
      el("dl", {}, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
      timeline(runs, t0, t1, now, 900, 54, { axis: true, nextFire: t.nextFires[0] }),
      runs.length ? table : el("p", { class: "muted" }, "No runs yet."));
    section.hidden = false;
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

  $("span").addEventListener("change", () => view.data && render());
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) {
      clearTimeout(view.timer);
      poll();
    }
  });
  poll();
})();
