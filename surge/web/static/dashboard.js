// Surge dashboard: scrapes /metrics every second and draws the last two minutes on canvases.
"use strict";

(() => {
  const C = window.SurgeCommon;
  const $ = (id) => document.getElementById(id);
  const PERIOD_MS = 1000; // scrape period
  const SPAN_S = 120; // seconds of history drawn
  const WINDOW_S = 10; // window of latency percentiles and the prefix cache hit rate
  let P = "surge:"; // the metric name prefix: "vllm:" under --metrics-prefix vllm (read from the scrape)

  const CHARTS = [
    { id: "requests", title: "Requests", series: [["running", "Running", "--c1"], ["waiting", "Waiting", "--c2"]], integer: true },
    { id: "kv", title: "KV cache usage", unit: "%", max: 100, series: [["kv", "Used", "--c1"]] },
    { id: "gen", title: "Output tokens/s", series: [["gen_tps", "Output", "--c1"]] },
    { id: "prompt", title: "Prompt tokens/s", series: [["prompt_tps", "Prompt", "--c3"]] },
    { id: "ttft", title: "TTFT", unit: "ms", series: [["ttft_p50", "p50", "--c1"], ["ttft_p90", "p90", "--c3"], ["ttft_p99", "p99", "--c2"]] },
    { id: "itl", title: "ITL", unit: "ms", series: [["itl_p50", "p50", "--c1"], ["itl_p90", "p90", "--c3"], ["itl_p99", "p99", "--c2"]] },
    { id: "preempt", title: "Preemptions/s", series: [["preempt_ps", "Preemptions", "--c2"]] },
    { id: "prefix", title: "Prefix cache hit rate", unit: "%", max: 100, series: [["prefix_hit", "Hit rate", "--c4"]] },
  ];

  const TILES = [
    ["running", "Running", (s) => fmtInt(s.running)],
    ["waiting", "Waiting", (s) => fmtInt(s.waiting)],
    ["kv", "KV cache", (s) => fmt(s.kv, 1, "%")],
    ["gen_tps", "Output tok/s", (s) => fmt(s.gen_tps, 1)],
    ["prompt_tps", "Prompt tok/s", (s) => fmt(s.prompt_tps, 1)],
    ["ttft_p50", "TTFT p50", (s) => fmt(s.ttft_p50, 1, "ms")],
    ["itl_p50", "ITL p50", (s) => fmt(s.itl_p50, 1, "ms")],
    ["preemptions", "Preemptions", (s) => fmtInt(s.preemptions)],
    ["prefix_total", "Prefix hits", (s) => fmt(s.prefix_total, 1, "%")],
    ["finished", "Finished", (s) => fmtInt(s.finished)],
  ];

  function fmt(v, digits, unit) {
    if (v === null || v === undefined || !isFinite(v)) return ["–", ""];
    return [v.toFixed(digits), unit || ""];
  }
  function fmtInt(v) {
    return v === null || v === undefined ? ["–", ""] : [String(Math.round(v)), ""];
  }

  // ---------- page skeleton ----------

  const tileValues = {};
  for (const [key, label] of TILES) {
    const tile = C.el("div", "tile");
    tile.dataset.tile = key;
    const v = C.el("div", "v", "–");
    tile.append(C.el("div", "k", label), v);
    $("tiles").appendChild(tile);
    tileValues[key] = v;
  }

  for (const chart of CHARTS) {
    const card = C.el("section", "card");
    card.dataset.chart = chart.id;
    const head = C.el("div", "card-head");
    head.appendChild(C.el("h3", null, chart.unit ? `${chart.title} (${chart.unit})` : chart.title));
    const legend = C.el("div", "legend");
    for (const [, label, color] of chart.series) {
      const item = C.el("span", null, label);
      item.style.setProperty("--swatch", `var(${color})`);
      legend.appendChild(item);
    }
    head.appendChild(legend);
    chart.canvas = C.el("canvas");
    card.append(head, chart.canvas);
    $("charts").appendChild(card);
  }

  // ---------- data ----------

  const history = []; // derived samples, one a second: {t, running, waiting, kv, gen_tps, ...}
  const snaps = []; // raw counters and histogram buckets of the last WINDOW_S + a few seconds
  const dash = { samples: 0, errors: 0, latest: null, history };
  window.surgeDashboard = dash; // read by the browser tests

  function rate(now, prev, key) {
    if (!prev) return null;
    const dt = now.t - prev.t;
    const d = now[key] - prev[key];
    return dt > 0 && d >= 0 ? d / dt : null; // a negative delta: the server restarted
  }

  function windowStart(now) {
    for (const s of snaps) if (s !== now && now.t - s.t <= WINDOW_S + 0.5) return s;
    return null;
  }

  function percentiles(now, old, key) {
    const delta = old ? C.bucketDelta(now[key], old[key]) : null;
    const out = {};
    for (const q of [50, 90, 99]) {
      const v = delta ? C.quantile(delta, q / 100) : null;
      out[q] = v === null ? null : v * 1000;
    }
    return out;
  }

  function derive(samples, t) {
    const now = {
      t,
      gen: C.sum(samples, P + "generation_tokens_total"),
      prompt: C.sum(samples, P + "prompt_tokens_total"),
      preemptions: C.sum(samples, P + "num_preemptions_total"),
      hits: C.sum(samples, P + "prefix_cache_hits_total"),
      queries: C.sum(samples, P + "prefix_cache_queries_total"),
      finished: C.sum(samples, P + "request_success_total"),
      ttftB: C.buckets(samples, P + "time_to_first_token_seconds"),
      itlB: C.buckets(samples, P + "inter_token_latency_seconds"),
    };
    const prev = snaps.length ? snaps[snaps.length - 1] : null;
    snaps.push(now);
    while (snaps.length && now.t - snaps[0].t > WINDOW_S + 5) snaps.shift();
    const old = windowStart(now);
    const ttft = percentiles(now, old, "ttftB");
    const itl = percentiles(now, old, "itlB");
    const kv = C.mean(samples, P + "kv_cache_usage_perc");
    const dq = old ? now.queries - old.queries : 0;
    return {
      t,
      running: C.sum(samples, P + "num_requests_running"),
      waiting: C.sum(samples, P + "num_requests_waiting"),
      kv: kv === null ? null : kv * 100,
      gen_tps: rate(now, prev, "gen"),
      prompt_tps: rate(now, prev, "prompt"),
      preempt_ps: rate(now, prev, "preemptions"),
      ttft_p50: ttft[50],
      ttft_p90: ttft[90],
      ttft_p99: ttft[99],
      itl_p50: itl[50],
      itl_p90: itl[90],
      itl_p99: itl[99],
      prefix_hit: dq > 0 ? ((now.hits - old.hits) / dq) * 100 : null,
      prefix_total: now.queries > 0 ? (now.hits / now.queries) * 100 : null,
      preemptions: now.preemptions,
      finished: now.finished,
    };
  }

  function showError(text) {
    const box = $("dash-error");
    box.hidden = !text;
    box.textContent = text || "";
  }

  // Tiles and charts that still show the last good scrape are greyed (class "stale") and said
  // so in a live note until a scrape succeeds again.
  let lastGood = null; // Date of the last scrape that succeeded
  function setStale(stale) {
    const main = document.querySelector("main.dash");
    if (main.classList.contains("stale") === stale) return;
    main.classList.toggle("stale", stale);
    $("dash-stale").textContent = stale
      ? lastGood
        ? `The values below are stale: last read at ${lastGood.toLocaleTimeString()}.`
        : "No values yet: /metrics has not been read."
      : "";
  }

  async function scrape() {
    const t = performance.now() / 1000;
    try {
      const r = await fetch("metrics", { headers: C.headers(false), cache: "no-store" });
      if (r.status === 401) {
        $("key-field").hidden = false;
        throw new Error("/metrics needs the server's API key.");
      }
      if (!r.ok) throw new Error(await C.errorMessage(r));
      const parsed = C.parsePrometheus(await r.text());
      // surge:engine_up is Surge's own, so it keeps surge: under the vllm prefix: a vLLM name tells
      if (parsed.some((x) => x.name === "vllm:num_requests_running")) P = "vllm:";
      const sample = derive(parsed, t);
      history.push(sample);
      while (history.length && t - history[0].t > SPAN_S + 2) history.shift();
      dash.samples++;
      dash.latest = sample;
      lastGood = new Date();
      showError("");
      setStale(false);
      render();
    } catch (e) {
      dash.errors++;
      showError(`Cannot read /metrics: ${e.message || e}`);
      setStale(true);
    }
  }

  async function loop() {
    const started = performance.now();
    await scrape();
    setTimeout(loop, Math.max(0, PERIOD_MS - (performance.now() - started)));
  }

  // ---------- drawing ----------

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 4, 6, 8, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function label(v, integer) {
    if (v >= 10000) return (v / 1000).toFixed(0) + "k";
    if (v >= 1000) return (v / 1000).toFixed(1) + "k";
    if (integer || v >= 10 || v === 0) return String(Math.round(v));
    return v.toFixed(v >= 1 ? 1 : 2);
  }

  function draw(chart) {
    const canvas = chart.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    if (!w || !h) return;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const css = getComputedStyle(document.documentElement);
    const color = (name) => css.getPropertyValue(name).trim();
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const left = 40;
    const right = w - 6;
    const top = 8;
    const bottom = h - 20;
    const now = history.length ? history[history.length - 1].t : 0;
    const x = (t) => right - ((now - t) / SPAN_S) * (right - left);

    let vmax = 0;
    for (const s of history) {
      for (const [key] of chart.series) if (s[key] !== null && s[key] > vmax) vmax = s[key];
    }
    const ymax = chart.max !== undefined ? chart.max : niceMax(chart.integer ? Math.max(vmax, 4) : vmax);
    const y = (v) => bottom - (Math.min(v, ymax) / ymax) * (bottom - top);

    ctx.font = `11px ${color("--font") || "sans-serif"}`;
    ctx.lineWidth = 1;
    ctx.strokeStyle = color("--grid");
    ctx.fillStyle = color("--muted");
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const v = (ymax * i) / 4;
      const yy = Math.round(y(v)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(left, yy);
      ctx.lineTo(right, yy);
      ctx.stroke();
      ctx.fillText(label(v, chart.integer), left - 6, yy);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "alphabetic";
    for (const [sec, text] of [[SPAN_S, "-2 min"], [SPAN_S / 2, "-1 min"], [0, "now"]]) {
      const xx = Math.min(Math.max(x(now - sec), left + 16), right - 12);
      ctx.fillText(text, xx, h - 4);
    }

    ctx.save();
    ctx.beginPath();
    ctx.rect(left, top - 2, right - left, bottom - top + 4);
    ctx.clip();
    chart.series.forEach(([key, , colorVar], i) => {
      const stroke = color(colorVar);
      const points = [];
      for (const s of history) {
        if (now - s.t > SPAN_S + 1) continue;
        points.push(s[key] === null || s[key] === undefined ? null : [x(s.t), y(s[key])]);
      }
      // one run of consecutive non-null points after another
      const runs = [];
      let current = [];
      for (const p of points) {
        if (p === null) {
          if (current.length) runs.push(current);
          current = [];
        } else current.push(p);
      }
      if (current.length) runs.push(current);
      for (const pts of runs) {
        if (i === 0 && chart.series.length <= 2 && pts.length > 1) {
          ctx.beginPath();
          ctx.moveTo(pts[0][0], bottom);
          for (const [px, py] of pts) ctx.lineTo(px, py);
          ctx.lineTo(pts[pts.length - 1][0], bottom);
          ctx.closePath();
          ctx.globalAlpha = 0.12;
          ctx.fillStyle = stroke;
          ctx.fill();
          ctx.globalAlpha = 1;
        }
        ctx.beginPath();
        ctx.strokeStyle = stroke;
        ctx.lineWidth = 1.8;
        ctx.lineJoin = "round";
        pts.forEach(([px, py], j) => (j ? ctx.lineTo(px, py) : ctx.moveTo(px, py)));
        if (pts.length === 1) ctx.lineTo(pts[0][0] + 1, pts[0][1]);
        ctx.stroke();
      }
    });
    ctx.restore();
  }

  function render() {
    const s = dash.latest;
    if (s) {
      for (const [key, , f] of TILES) {
        const [value, unit] = f(s);
        const v = tileValues[key];
        v.replaceChildren(value);
        if (unit) v.appendChild(C.el("small", null, unit));
      }
    }
    for (const chart of CHARTS) draw(chart);
  }

  // ---------- wiring ----------

  const keyInput = $("api-key");
  keyInput.value = C.getApiKey();
  if (keyInput.value) $("key-field").hidden = false;
  $("key-field").addEventListener("submit", (e) => e.preventDefault());
  keyInput.addEventListener("input", () => C.setApiKey(keyInput.value.trim()));
  window.addEventListener("resize", render);
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", render);
  C.watchHealth($("health-dot"), $("health-label"));
  render();
  loop();
})();
