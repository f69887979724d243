// The status page's agenda: every enabled trigger of the space and its next occurrences,
// from GET /agenda, the ones at risk of being missed marked with their reason and fix.
// Self-contained beside app.js: its own poll, the same token (sessionStorage), no writes.
"use strict";

(() => {
  const TOKEN_KEY = "anyrtd.token";
  const POLL_MS = 5000;
  const $ = (id) => document.getElementById(id);
  let timer = null;

  const pad = (n) => String(n).padStart(2, "0");
  function clock(ts) {
    const d = new Date(ts * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c); // text, never HTML: synced data is untrusted
    return node;
  }

  function stateText(o) {
    const state = String(o.deviceState || "").replace(/_/g, " ");
    if (o.deviceState === "not_running") {
      return o.deviceSince ? `${state} since ${clock(o.deviceSince)}` : `${state} at all`;
    }
    return state;
  }

  function deviceText(o) {
    const device = o.device || "(no active device)";
    return o.deviceName ? `${o.deviceName} (${device})` : device;
  }

  function rowOf(o) {
    const when = o.at == null ? "on each event" : o.local;
    const trigger = el("td", { class: "id" }, o.triggerId);
    if (o.after) trigger.append(el("span", { class: "sub" }, `after ${o.after}`));
    const risk = el("td", { class: "risk" });
    if (o.atRisk) {
      risk.append(el("span", { class: "badge s-error" }, "at risk"));
      risk.append(el("span", { class: "sub reason" }, o.reason || ""));
      if (o.fix) risk.append(el("code", { class: "sub fix" }, o.fix));
    } else {
      risk.append(el("span", { class: "muted" }, "–"));
    }
    return el(
      "tr",
      {
        class: "agenda-row" + (o.atRisk ? " at-risk" : ""),
        "data-trigger": o.triggerId,
        "data-at": o.at == null ? "" : String(o.at),
        "data-at-risk": String(Boolean(o.atRisk)),
        "data-state": o.deviceState || "",
      },
      el("td", {}, when, el("span", { class: "sub" }, o.at == null ? "" : o.tz)),
      trigger,
      el("td", {}, deviceText(o)),
      el("td", {}, el("span", { class: "badge s-" + (o.deviceState || "") }, stateText(o))),
      risk,
    );
  }

  function render(body) {
    const items = [...(body.occurrences || []), ...(body.listening || [])];
    $("agenda-table").tBodies[0].replaceChildren(...items.map(rowOf));
    $("agenda-empty").hidden = items.length > 0;
    const more = body.truncated ? " (the first 10,000)" : "";
    $("agenda-count").textContent =
      `${(body.occurrences || []).length} occurrences in ${body.hours} h${more}, ${body.atRisk} at risk`;
  }

  async function poll() {
    clearTimeout(timer);
    try {
      const headers = { Accept: "application/json" };
      const token = sessionStorage.getItem(TOKEN_KEY);
      if (token) headers.Authorization = "Bearer " + token;
      const hours = encodeURIComponent($("agenda-hours").value);
      const resp = await fetch(`/agenda?hours=${hours}`, { headers, cache: "no-store", credentials: "omit" });
      const body = await resp.json().catch(() => null);
      if (resp.status === 200 && body) render(body);
      else if (resp.status === 401) $("agenda-count").textContent = "needs the token (above)";
      else $("agenda-count").textContent = body && body.error ? body.error.message : `HTTP ${resp.status}`;
    } catch (err) {
      $("agenda-count").textContent = `not answering (${err.message}); the list is the last one read`;
    }
    timer = setTimeout(poll, POLL_MS);
  }

  $("agenda-hours").addEventListener("change", poll);
  poll();
})();
