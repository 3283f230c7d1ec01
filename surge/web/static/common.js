// Surge web UI: helpers shared by the playground and the dashboard.
// Model output is only ever put into the page as text nodes (textContent), never parsed as HTML.
"use strict";

const SurgeCommon = (() => {
  const KEY_STORAGE = "surge.apiKey";

  /** The API key kept in this tab's session storage ("" when none). */
  function getApiKey() {
    try {
      return sessionStorage.getItem(KEY_STORAGE) || "";
    } catch (e) {
      return "";
    }
  }

  /** Keep (or with "" forget) the API key in session storage only. */
  function setApiKey(key) {
    try {
      if (key) sessionStorage.setItem(KEY_STORAGE, key);
      else sessionStorage.removeItem(KEY_STORAGE);
    } catch (e) {
      /* storage disabled: the key lives only in the field */
    }
  }

  /** Request headers, with the bearer token when a key is set. */
  function headers(json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    const key = getApiKey();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  /** A new element with a class and text (text goes in as a text node). */
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // Inline `code` spans inside a text segment.
  function appendInline(parent, text) {
    const re = /`([^`\n]+)`/g;
    let last = 0;
    let m;
    while ((m = re.exec(text)) !== null) {
      if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      parent.appendChild(el("code", null, m[1]));
      last = re.lastIndex;
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  /**
   * Render model text into `container`: plain text with ``` fenced code blocks and `inline code`.
   * Everything is inserted as text nodes, so markup in the text shows as characters and never runs.
   * An unterminated fence (while streaming) renders as an open code block.
   */
  function renderText(container, text) {
    container.replaceChildren();
    const fence = /```(?:([^\n`]*)\n)?([\s\S]*?)(?:```|$)/g;
    let last = 0;
    let m;
    while ((m = fence.exec(text)) !== null) {
      // blank lines around a block are the block's margins
      if (m.index > last) appendInline(container, text.slice(last, m.index).replace(/\n+$/, ""));
      const pre = el("pre");
      const code = el("code", null, m[2].replace(/\n$/, "")); // the fence's own line break
      if (m[1] && m[1].trim()) code.dataset.lang = m[1].trim();
      pre.appendChild(code);
      container.appendChild(pre);
      last = fence.lastIndex;
      while (text[last] === "\n") last++;
    }
    if (last < text.length) appendInline(container, text.slice(last));
  }

  /** An Error named "ConnectionError": the server could not be reached or the connection broke. */
  function connectionError(message) {
    const e = new Error(message);
    e.name = "ConnectionError";
    return e;
  }

  /**
   * fetch(), but a request that cannot reach the server (the browser's bare "Failed to fetch")
   * throws a ConnectionError that says so. An abort still throws the AbortError.
   */
  async function fetchOrExplain(url, init) {
    try {
      return await fetch(url, init);
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw connectionError(`Cannot reach the server at ${location.origin} (${e.message}): is it running?`);
    }
  }

  /**
   * Read a `text/event-stream` response and call onData(parsedJson) for every `data:` event until
   * `[DONE]`. Comment lines (": ...") are skipped.
   * Throws when an event's data is not JSON, and a ConnectionError when the connection breaks or
   * the body ends before `[DONE]` (the server went away: the answer is cut short).
   */
  async function readSSE(response, onData) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const lost = "The connection to the server was lost before the end of the answer";
    let buf = "";
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (e) {
        if (e.name === "AbortError") throw e;
        throw connectionError(`${lost} (${e.message}).`);
      }
      const { value, done } = chunk;
      if (done) throw connectionError(`${lost}: the stream ended without [DONE].`);
      buf += decoder.decode(value, { stream: true });
      buf = buf.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = event
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""))
          .join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }

  /** The message of an OpenAI-style error body, or the HTTP status. */
  async function errorMessage(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return `${response.status}: ${body.error.message}`;
    } catch (e) {
      /* not JSON */
    }
    return `HTTP ${response.status} ${response.statusText}`;
  }

  /**
   * Parse the Prometheus text format into samples {name, labels, value}.
   * Follows the exposition format's grammar for names, label sets (with \\, \" and \n escapes) and values.
   */
  function parsePrometheus(text) {
    const samples = [];
    const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
    const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    for (const raw of text.split("\n")) {
      if (!raw || raw[0] === "#") continue;
      const m = line.exec(raw);
      if (!m) continue;
      const labels = {};
      if (m[2]) {
        let l;
        label.lastIndex = 0;
        while ((l = label.exec(m[2])) !== null) {
          labels[l[1]] = l[2].replace(/\\n/g, "\n").replace(/\\(["\\])/g, "$1");
        }
      }
      const v = m[3];
      const value = v === "+Inf" ? Infinity : v === "-Inf" ? -Infinity : parseFloat(v);
      samples.push({ name: m[1], labels, value });
    }
    return samples;
  }

  /** Sum of a metric over all its label sets (0 when absent). */
  function sum(samples, name) {
    let total = 0;
    for (const s of samples) if (s.name === name) total += s.value;
    return total;
  }

  /** Mean of a metric over its label sets (null when absent). */
  function mean(samples, name) {
    let total = 0;
    let n = 0;
    for (const s of samples) {
      if (s.name === name) {
        total += s.value;
        n++;
      }
    }
    return n ? total / n : null;
  }

  /** Cumulative histogram buckets [[le, count], ...] of `name` (without _bucket), summed over labels. */
  function buckets(samples, name) {
    const byLe = new Map();
    for (const s of samples) {
      if (s.name !== name + "_bucket") continue;
      const le = s.labels.le === "+Inf" ? Infinity : parseFloat(s.labels.le);
      byLe.set(le, (byLe.get(le) || 0) + s.value);
    }
    return [...byLe.entries()].sort((a, b) => a[0] - b[0]);
  }

  /**
   * The q-quantile (0..1) of cumulative buckets, interpolated linearly inside the bucket as
   * Prometheus' histogram_quantile does. Null when the buckets hold no observation.
   * A quantile in the +Inf bucket returns the highest finite bound.
   */
  function quantile(bkts, q) {
    if (!bkts.length) return null;
    const total = bkts[bkts.length - 1][1];
    if (!(total > 0)) return null;
    const rank = q * total;
    let prevLe = 0;
    let prevCount = 0;
    for (const [le, count] of bkts) {
      if (count >= rank) {
        if (le === Infinity) return prevLe;
        if (count === prevCount) return le;
        return prevLe + ((le - prevLe) * (rank - prevCount)) / (count - prevCount);
      }
      prevLe = le;
      prevCount = count;
    }
    return prevLe;
  }

  /** Element-wise difference of two bucket lists with the same bounds (null if they differ). */
  function bucketDelta(now, before) {
    if (!before || before.length !== now.length) return null;
    const out = [];
    for (let i = 0; i < now.length; i++) {
      if (now[i][0] !== before[i][0]) return null;
      out.push([now[i][0], now[i][1] - before[i][1]]);
    }
    return out;
  }

  /**
   * Put `text` on the clipboard. Resolves true once copied, false when the browser refused.
   * The Clipboard API exists only on a secure origin (https or localhost); a server reached as
   * plain http at a host name gets the older copy command on a selected, off-screen text box instead.
   */
  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      try {
        await navigator.clipboard.writeText(text);
        return true;
      } catch (e) {
        /* refused (no permission, page not focused): try the copy command */
      }
    }
    const box = el("textarea");
    box.value = text;
    box.setAttribute("readonly", "");
    box.style.position = "fixed";
    box.style.left = "-9999px";
    const focused = document.activeElement;
    document.body.appendChild(box);
    box.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (e) {
      ok = false;
    }
    box.remove();
    if (focused && focused.focus) focused.focus();
    return ok;
  }

  /** Poll /health every 5 s and show it on the top bar's status dot. */
  function watchHealth(dot, label) {
    async function check() {
      try {
        const r = await fetch("health", { cache: "no-store" });
        dot.className = "dot " + (r.ok ? "ok" : "bad");
        label.textContent = r.ok ? "Ready" : "Unavailable";
      } catch (e) {
        dot.className = "dot bad";
        label.textContent = "Offline";
      }
    }
    check();
    return setInterval(check, 5000);
  }

  return {
    getApiKey,
    setApiKey,
    headers,
    el,
    renderText,
    fetchOrExplain,
    readSSE,
    errorMessage,
    parsePrometheus,
    sum,
    mean,
    buckets,
    quantile,
    bucketDelta,
    copyText,
    watchHealth,
  };
})();
window.SurgeCommon = SurgeCommon;
