// The live page: reads /status and /capabilities on this origin every few seconds and draws
// them. Every value is set as text or as an attribute, never parsed as markup, so a hostile
// served name or peer origin shows as what it is. Nothing is polled while the tab is hidden.
"use strict";
(() => {
  const POLL_MS = 3000;
  const STALE_MS = 10000;
  const HISTORY = 40; // samples kept per role for the charts: two minutes at POLL_MS
  const KEY = "lobes.gateway.key"; // sessionStorage: this tab only, never in the URL
  const SVG = "http://www.w3.org/2000/svg";
  const STATES = ["ready", "incompatible", "refused", "unreachable"]; // best to worst
  const history = new Map();
  let lastOk = 0;
  let failing = false;
  let inFlight = false;
  let timer = null;

  class NeedKey extends Error {}

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function fmt(value, digits, unit) {
    if (value === null || value === undefined) return "–";
    return Number(value).toFixed(digits) + (unit || "");
  }

  function pct(ratio) {
    return ratio === null || ratio === undefined ? "–" : (100 * ratio).toFixed(1) + " %";
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows.map(([cells, attrs]) => {
      const tr = el("tr", null, attrs);
      for (const cell of cells) {
        const isNum = typeof cell === "number";
        tr.append(el("td", cell, isNum ? { class: "num" } : {}));
      }
      return tr;
    }));
  }

  async function get(path) {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY);
    if (key) headers.Authorization = "Bearer " + key;
    const answer = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    if (answer.status === 401) throw new NeedKey(path + " asks for the gateway key");
    if (!answer.ok) throw new Error(path + " answered HTTP " + answer.status);
    return answer.json();
  }

  async function poll() {
    timer = null;
    if (inFlight) return;
    inFlight = true;
    try {
      const [status, caps] = await Promise.all([get("/status"), get("/capabilities")]);
      lastOk = Date.now();
      document.getElementById("key-form").hidden = true;
      failing = false;
      render(status, caps);
      if (!performance.getEntriesByName("lobes-first-data").length) performance.mark("lobes-first-data");
      showState("live", "");
    } catch (error) {
      failing = true;
      if (error instanceof NeedKey) askKey();
      showState("stale", error.message);
    }
    inFlight = false;
    schedule();
  }

  function schedule() {
    if (timer === null && !document.hidden) timer = setTimeout(poll, POLL_MS);
  }

  function showState(state, problem) {
    const stale = state === "stale" || (lastOk > 0 && Date.now() - lastOk > STALE_MS);
    const shown = stale ? "stale" : state;
    const node = document.getElementById("state");
    node.textContent = shown;
    node.setAttribute("data-state", shown);
    document.getElementById("problem").textContent = problem;
    if (lastOk) {
      document.getElementById("updated").textContent =
        "updated " + new Date(lastOk).toLocaleTimeString();
    }
  }

  function askKey() {
    const form = document.getElementById("key-form");
    if (form.hidden) {
      form.hidden = false;
      document.getElementById("key").focus();
    }
  }

  function render(status, caps) {
    const box = status.box || {};
    document.getElementById("box-name").textContent = box.name || "gateway";
    document.title = "lobes " + (box.name || "gateway");
    renderMesh(status, caps);
    renderRoles(caps);
    renderGears(status);
    renderBox(status);
    renderAdmission(status);
    record(status);
    renderCharts();
  }

  function renderRoles(caps) {
    const rows = Object.entries(caps.roles || {}).map(([role, c]) => [
      [role, c.route || "", c.served_name || "", c.ready ? "ready" : "not ready",
        c.served_by || c.hosted_by || (c.proxied ? "peers" : ""), whyNot(c)],
      { "data-role": role, "data-ready": c.ready ? "true" : "false", class: c.ready ? "" : "down" },
    ]);
    fill(document.querySelector("#roles tbody"), rows);
  }

  function whyNot(c) {
    if (c.ready) return "";
    if (c.reason) return c.reason;
    const peers = c.peer ? [c.peer] : c.replicas || c.owners || [];
    return peers.filter((p) => !p.ready || !p.compatible).map((p) => p.origin + ": " + p.reason).join("; ");
  }

  function renderGears(status) {
    const rows = (status.backends || []).map((g) => [
      [g.name, g.served_name, g.engine_version || "–", g.ready ? "ready" : "no: " + (g.reason || ""),
        fmt(g.running, 0) + " / " + fmt(g.waiting, 0), pct(g.kv_cache_usage_perc),
        pct(g.prefix_cache_hit_rate), fmt(g.prompt_tokens_per_s, 1), fmt(g.generation_tokens_per_s, 1),
        g.last_error_s_ago === null || g.last_error_s_ago === undefined ? "none" : fmt(g.last_error_s_ago, 0, " s ago")],
      { "data-gear": g.name, "data-ready": g.ready ? "true" : "false" },
    ]);
    fill(document.querySelector("#gears tbody"), rows);
  }

  function renderBox(status) {
    const box = status.box || {};
    const p = status.pressure || {};
    const reading = p.pressure || {};
    const limits = p.thresholds || {};
    const gib = (kb) => (kb === null || kb === undefined ? "–" : (kb / 1048576).toFixed(1) + " GiB");
    const pairs = [
      ["host", box.name], ["hardware", box.hardware || "–"], ["origin", box.origin || "–"],
      ["CPUs", box.cpus],
      ["memory available", gib(box.mem_available_kb) + " of " + gib(box.mem_total_kb)],
      ["the plan's budget", budget(box)],
      ["MemAvailable", fmt(reading.mem_available_percent, 1, " %") + " (sheds under " +
        fmt(limits.memavailable_degraded, 0, " %") + ")"],
      ["PSI memory full avg10", fmt(reading.psi_memory_full_avg10, 1, " %") + " (sheds over " +
        fmt(limits.psi_memory_full, 0, " %") + ")"],
      ["swap used", fmt(reading.swap_used_percent, 1, " %")],
      ["shedding", p.shed ? "yes (" + p.reason + "): only " + p.servable_tier + " served" : "no"],
    ];
    const dl = document.getElementById("box");
    dl.replaceChildren(...pairs.flatMap(([name, value]) => [el("dt", name), el("dd", value)]));
    dl.setAttribute("data-shed", p.shed ? "true" : "false");
  }

  function counts(map) {
    const parts = Object.entries(map || {}).filter(([, n]) => n > 0).map(([k, n]) => k + ": " + n);
    return parts.length ? parts.join(", ") : "none";
  }

  function renderAdmission(status) {
    const rows = Object.entries(status.admission || {}).map(([role, a]) => [
      [role, a.slots, a.running, counts(a.queued), counts(a.queued_by_client)], { "data-role": role },
    ]);
    fill(document.querySelector("#admission tbody"), rows);
    const ttft = Object.entries(status.ttft || {}).map(([role, t]) => [
      [role, t.requests, fmt(t.p50_s === null ? null : t.p50_s * 1000, 0, " ms"),
        fmt(t.p95_s === null ? null : t.p95_s * 1000, 0, " ms"), fmt(t.window_s, 0, " s")],
      { "data-role": role },
    ]);
    fill(document.querySelector("#ttft tbody"), ttft);
  }

  function queued(status, role) {
    const a = (status.admission || {})[role];
    if (!a) return null;
    return Object.values(a.queued || {}).reduce((sum, n) => sum + n, 0);
  }

  function record(status) {
    const now = Date.now();
    for (const g of status.backends || []) {
      if (g.task === "audio") continue;
      const q = queued(status, g.name);
      const samples = history.get(g.name) || [];
      samples.push({ t: now, tps: g.generation_tokens_per_s || 0, queue: q === null ? (g.waiting || 0) : q });
      while (samples.length > HISTORY) samples.shift();
      history.set(g.name, samples);
    }
  }

  function line(samples, key, width, height) {
    const top = Math.max(1, ...samples.map((s) => s[key]));
    const step = width / Math.max(1, HISTORY - 1);
    const start = width - step * (samples.length - 1);
    return samples.map((s, i) => (start + i * step).toFixed(1) + "," +
      (height - 2 - (height - 4) * s[key] / top).toFixed(1)).join(" ");
  }

  function renderCharts() {
    const figures = [...history.entries()].map(([role, samples]) => {
      const chart = svg("svg", { class: "chart", viewBox: "0 0 260 70", "data-role": role });
      chart.append(svg("polyline", { class: "tps", points: line(samples, "tps", 260, 70) }),
        svg("polyline", { class: "queue", points: line(samples, "queue", 260, 70) }));
      const last = samples[samples.length - 1];
      const caption = el("figcaption", role + ": " + fmt(last.tps, 1) + " tok/s, queue " + last.queue +
        " (max " + fmt(Math.max(...samples.map((s) => s.tps)), 1) + " tok/s)");
      const figure = el("figure");
      figure.append(chart, caption);
      return figure;
    });
    document.getElementById("charts").replaceChildren(...figures);
  }

  function worst(states) {
    return states.reduce((a, b) => (STATES.indexOf(b) > STATES.indexOf(a) ? b : a), "ready");
  }

  function renderMesh(status, caps) {
    const mesh = document.getElementById("mesh");
    const box = status.box || {};
    const peers = new Map();
    for (const link of status.links || []) {
      if (!peers.has(link.origin)) peers.set(link.origin, []);
      peers.get(link.origin).push(link);
    }
    const roles = Object.entries(caps.roles || {});
    const here = roles.filter(([, c]) => c.feasible && !c.proxied);
    const nodes = [];
    const heading = [box.name || "this gateway", box.origin || "", box.hardware || "",
      hardware(box)].filter(Boolean);
    const items = here.map(([role, c]) => [role + " · " + c.route + (c.ready ? "" : " (not ready)"),
      c.ready ? "ready" : "unreachable"]);
    const selfHeight = 16 + 17 * heading.length + 16 * items.length;
    const count = peers.size;
    const height = Math.max(selfHeight + 20, count * 110 + 10, 120);
    const selfTop = (height - selfHeight) / 2;
    const middle = selfTop + selfHeight / 2;
    nodes.push(drawBox(20, selfTop, 300, selfHeight, "self", heading, items,
      { "data-box": box.name || "self", "data-state": "ready" }));
    mesh.setAttribute("viewBox", "0 0 900 " + height);
    let index = 0;
    const lines = [];
    for (const [origin, links] of peers) {
      const top = 10 + index * 110;
      const state = worst(links.map((l) => l.state));
      const named = links.find((l) => l.hardware);
      nodes.push(drawBox(600, top, 290, 95, "peer", named ? [origin, named.hardware] : [origin],
        links.map((l) => [l.role + " (" + l.kind + "): " + l.state, l.state]),
        { "data-origin": origin, "data-state": state }));
      links.forEach((l, i) => {
        const offset = (i - (links.length - 1) / 2) * 8;
        const edge = svg("line", { x1: 320, y1: middle + offset, x2: 600, y2: top + 47 + offset,
          class: l.state, "data-role": l.role, "data-origin": origin, "data-state": l.state });
        edge.append(svg("title", {}, l.role + " → " + origin + ": " + l.state + " (" + l.reason + ")"));
        lines.push(edge);
      });
      index += 1;
    }
    if (count === 0) {
      nodes.push(svg("text", { x: 400, y: middle, class: "small" }, "no peer links: this box answers alone"));
    }
    mesh.replaceChildren(...lines, ...nodes);
  }

  // The plan keeps the headroom free beside the gears' shares: what is available past it is
  // what the box can still take before it eats into what the plan left for everything else.
  function budget(box) {
    if (box.gear_shares_gib === null || box.gear_shares_gib === undefined) return "–";
    const text = "gears' shares " + box.gear_shares_gib.toFixed(1) + " GiB, headroom kept " +
      box.memory_headroom_gib.toFixed(1) + " GiB";
    if (box.mem_available_kb === null || box.mem_available_kb === undefined) return text;
    const left = box.mem_available_kb / 1048576 - box.memory_headroom_gib;
    return text + "; " + (left >= 0 ? left.toFixed(1) + " GiB available past the headroom"
      : (-left).toFixed(1) + " GiB into the headroom");
  }

  function hardware(box) {
    const parts = [];
    if (box.cpus) parts.push(box.cpus + " CPUs");
    if (box.mem_total_kb) parts.push((box.mem_total_kb / 1048576).toFixed(0) + " GiB memory");
    return parts.join(", ");
  }

  function drawBox(x, y, w, h, kind, heading, items, attrs) {
    const group = svg("g", Object.assign({ class: kind }, attrs));
    group.append(svg("rect", { x, y, width: w, height: h, rx: 6,
      class: "box " + kind, "data-state": attrs["data-state"] }));
    let row = y + 20;
    heading.forEach((text, i) => {
      group.append(svg("text", { x: x + 10, y: row, class: i ? "small" : "" }, text));
      row += 17;
    });
    for (const [text, state] of items) {
      if (row > y + h - 6) break;
      group.append(svg("text", { x: x + 10, y: row, class: state }, text));
      row += 16;
    }
    return group;
  }

  document.getElementById("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("key");
    if (input.value) sessionStorage.setItem(KEY, input.value);
    input.value = "";
    if (timer !== null) clearTimeout(timer);
    timer = null;
    poll();
  });

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer === null) poll();
  });

  // The last answer ages even when no poll ends (a gateway that hangs): say so.
  setInterval(() => {
    if (lastOk) showState(failing ? "stale" : "live", document.getElementById("problem").textContent);
  }, 2000);
  poll();
})();
