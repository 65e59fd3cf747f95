// tunedeck's live page: one event stream for the views on screen, and canvas charts fed by deltas.
// Served inline in the page's <head> (app.ui.live_route.head_html). The server side is app/ui/live.py.
//
// On each click, key, scroll or resize, and once a second (a local check: no request), the page
// works out which live views it shows: the Run tab
// with a run id, the GPU panel open and on screen, the Runs tab. When that set changes it closes its
// stream and opens /tunedeck/live?run=N&gpu=1&runs=1 for the new set; a hidden browser tab shows none
// and holds no stream. The stream sends chart points (only those that changed) and "look again"
// notes, on which the page presses a hidden Gradio button that redraws that view's text once.
// A stream that ends (a finished run, drawn) is not reopened until the views change.
(() => {
  if (window.tunedeckLive) return;

  // Gradio 6.31's status trackers count elapsed time in a requestAnimationFrame loop that keeps going
  // after the event is over (even an idle page with one Markdown renders 60 frames a second: ~5% of a
  // core for the renderer, ~2% for the GPU process). This script runs before Gradio's modules load,
  // so their captured requestAnimationFrame is this one: a short callback that only reads
  // performance.now() (that timer) runs twice a second instead; every other callback is untouched.
  const frame = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (callback) => {
    const source = Function.prototype.toString.call(callback);
    if (source.length < 200 && source.includes("performance.now()")) {
      return -setTimeout(() => frame(callback), 1000); // negative: never a real frame id
    }
    return frame(callback);
  };
  const cancelFrame = window.cancelAnimationFrame.bind(window);
  window.cancelAnimationFrame = (id) => (id < 0 ? clearTimeout(-id) : cancelFrame(id));
  const CHECK_MS = 1000;
  const RETRY_MS = 3000;
  const PRESS_GAP_MS = 400; // at most ~2 Gradio refreshes a second per view, the last one always sent
  const RUN_TEXT_GAP_MS = 5000; // a live run's text (step, ETA, log) every 5 s at most, a new status at once; charts at once

  // ------------------------------------------------------------------ numbers and ticks
  function niceStep(span, count) {
    const raw = span / Math.max(count, 1);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const m = [1, 2, 2.5, 5, 10].find((f) => f * power >= raw) || 10;
    return m * power;
  }
  function ticks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const step = niceStep(hi - lo, count);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }
  function fmt(v, exp, step) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (exp || a >= 1e6 || a < 1e-3) return v.toExponential(a >= 1e6 || exp ? 1 : 0).replace("e+", "e");
    const text = step ? Number(step.toPrecision(6)).toString() : "0.01";
    const digits = text.includes(".") ? Math.min(6, text.split(".")[1].length) : 0;
    return v.toLocaleString("en-US", { maximumFractionDigits: digits });
  }

  // ------------------------------------------------------------------ one chart
  class Chart {
    constructor(host) {
      this.host = host;
      this.meta = null;
      this.series = new Map(); // label -> {color, points: [[x, y], ...]}
      this.now = null; // the server's clock at the last message (charts whose x is a clock time)
      host.textContent = "";
      this.title = document.createElement("div");
      this.title.className = "td-chart-title";
      this.canvas = document.createElement("canvas");
      this.canvas.className = "td-chart-canvas";
      this.canvas.setAttribute("role", "img");
      this.legend = document.createElement("div");
      this.legend.className = "td-chart-legend";
      this.tip = document.createElement("div");
      this.tip.className = "td-chart-tip";
      host.append(this.title, this.canvas, this.legend, this.tip);
      this.canvas.addEventListener("mousemove", (e) => this.hover(e));
      this.canvas.addEventListener("mouseleave", () => (this.tip.style.display = "none"));
      this.pending = false;
      new ResizeObserver(() => this.schedule()).observe(host);
    }

    apply(update, now) {
      if (update.meta) {
        this.meta = update.meta;
        this.title.textContent = update.meta.label;
      }
      if (now !== undefined) this.now = now;
      for (const label of update.drop || []) this.series.delete(label);
      for (const [label, part] of Object.entries(update.set || {})) {
        const s = this.series.get(label) || { color: "#888", points: [] };
        if (part.from_x === null || part.from_x === undefined) s.points = part.points.slice();
        else {
          let keep = s.points.length;
          while (keep > 0 && s.points[keep - 1][0] >= part.from_x) keep--;
          s.points.length = keep;
          for (const p of part.points) s.points.push(p);
        }
        this.series.set(label, s);
      }
      for (const [label, color] of Object.entries(update.colors || {})) {
        const s = this.series.get(label);
        if (s) s.color = color;
      }
      if (this.meta && this.meta.relative_window_s && this.now !== null) {
        const cut = this.now - this.meta.relative_window_s;
        for (const s of this.series.values()) {
          let drop = 0;
          while (drop < s.points.length && s.points[drop][0] < cut) drop++;
          if (drop) s.points.splice(0, drop);
        }
      }
      this.schedule();
    }

    schedule() {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => {
        this.pending = false;
        this.draw();
      });
    }

    xOf(p) {
      return this.meta && this.meta.relative_window_s ? p[0] - this.now : p[0];
    }

    extent() {
      const m = this.meta || {};
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (const s of this.series.values())
        for (const p of s.points) {
          const x = this.xOf(p);
          if (x < x0) x0 = x;
          if (x > x1) x1 = x;
          if (p[1] < y0) y0 = p[1];
          if (p[1] > y1) y1 = p[1];
        }
      const dataMax = y1;
      if (m.x_lim) {
        if (m.x_lim[0] !== null) x0 = m.x_lim[0];
        if (m.x_lim[1] !== null) x1 = m.x_lim[1];
      }
      if (m.y_lim) {
        if (m.y_lim[0] !== null) y0 = m.y_lim[0];
        if (m.y_lim[1] !== null) y1 = m.y_lim[1];
      }
      if (!(x1 > x0)) { x0 = (isFinite(x0) ? x0 : 0) - 0.5; x1 = x0 + 1; }
      const yFixed = m.y_lim && m.y_lim[0] !== null;
      if (!(y1 > y0) && yFixed) y1 = y0 + (Math.abs(y0) || 1);
      else if (!(y1 > y0)) { const c = isFinite(y0) ? y0 : 0; y0 = c - (Math.abs(c) * 0.1 || 0.5); y1 = c + (Math.abs(c) * 0.1 || 0.5); }
      else if (!(m.y_lim && m.y_lim[1] !== null)) y1 += (y1 - y0) * 0.05;
      return { x0, x1, y0, y1, dataMax };
    }

    draw() {
      live.draws++;
      const width = this.host.clientWidth;
      if (!width) return; // hidden (another tab): drawn when it is shown (ResizeObserver)
      const height = 220, dpr = window.devicePixelRatio || 1;
      const c = this.canvas;
      if (c.width !== Math.round(width * dpr) || c.height !== Math.round(height * dpr)) {
        c.width = Math.round(width * dpr);
        c.height = Math.round(height * dpr);
        c.style.width = width + "px";
        c.style.height = height + "px";
      }
      const g = c.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, width, height);
      const m = this.meta || { x_title: "", y_title: "", kind: "line" };
      const count = [...this.series.values()].reduce((n, s) => n + s.points.length, 0);
      if (!count) {
        g.fillStyle = getComputedStyle(this.host).color || "#444";
        g.globalAlpha = 0.6;
        g.font = "13px sans-serif";
        g.textAlign = "center";
        g.fillText("no data yet", width / 2, height / 2);
        g.globalAlpha = 1;
        this.map = null;
        this.drawLegend(m);
        this.publish(m, { x0: 0, x1: 0, y0: 0, y1: 0, dataMax: -Infinity }, [], 0, width, height);
        return;
      }
      const e = this.extent();
      const left = 58, right = 10, top = 8, bottom = 34;
      const pw = Math.max(10, width - left - right), ph = height - top - bottom;
      const X = (x) => left + ((x - e.x0) / (e.x1 - e.x0)) * pw;
      const Y = (y) => top + ph - ((y - e.y0) / (e.y1 - e.y0)) * ph;
      this.map = { X, Y, e, left, pw };
      const style = getComputedStyle(this.host);
      const ink = style.color || "#444";
      g.font = "11px sans-serif";
      g.fillStyle = ink;
      g.strokeStyle = "rgba(128,128,128,0.25)";
      g.lineWidth = 1;
      const xt = ticks(e.x0, e.x1, Math.max(2, Math.floor(pw / 90)));
      const yt = ticks(e.y0, e.y1, Math.max(2, Math.floor(ph / 40)));
      const xs = xt.length > 1 ? xt[1] - xt[0] : 0, ys = yt.length > 1 ? yt[1] - yt[0] : 0;
      g.textAlign = "center";
      g.textBaseline = "top";
      for (const t of xt) {
        const px = X(t);
        g.beginPath(); g.moveTo(px, top); g.lineTo(px, top + ph); g.stroke();
        g.fillText(fmt(t, false, xs), px, top + ph + 4);
      }
      g.textAlign = "right";
      g.textBaseline = "middle";
      for (const t of yt) {
        const py = Y(t);
        g.beginPath(); g.moveTo(left, py); g.lineTo(left + pw, py); g.stroke();
        g.fillText(fmt(t, m.y_exp, ys), left - 4, py);
      }
      g.textAlign = "center";
      g.textBaseline = "bottom";
      g.fillText(m.x_title || "", left + pw / 2, height - 1);
      g.save();
      g.translate(11, top + ph / 2);
      g.rotate(-Math.PI / 2);
      g.textBaseline = "middle";
      g.fillText(m.y_title || "", 0, 0);
      g.restore();
      g.save();
      g.beginPath(); g.rect(left, top, pw, ph); g.clip();
      const lines = [];
      for (const [label, s] of this.series) {
        const pts = s.points;
        g.strokeStyle = g.fillStyle = s.color;
        g.lineWidth = 1.6;
        if (m.kind === "point" || pts.length === 1) {
          for (const p of pts) { g.beginPath(); g.arc(X(this.xOf(p)), Y(p[1]), 3, 0, 2 * Math.PI); g.fill(); }
        } else {
          g.beginPath();
          pts.forEach((p, i) => (i ? g.lineTo(X(this.xOf(p)), Y(p[1])) : g.moveTo(X(this.xOf(p)), Y(p[1]))));
          g.stroke();
        }
        lines.push({ label: "series: " + label, vertices: pts.length, stroke: s.color });
      }
      g.restore();
      this.drawLegend(m);
      this.publish(m, e, lines, count, width, height);
    }

    drawLegend(m) {
      const names = [...this.series.keys()];
      const key = names.map((n) => n + "=" + this.series.get(n).color).join("|");
      if (key === this.legendKey) return;
      this.legendKey = key;
      this.legend.textContent = "";
      if (m.legend === false) return;
      for (const n of names) {
        const item = document.createElement("span");
        item.className = "td-chart-key";
        const sw = document.createElement("i");
        sw.style.background = this.series.get(n).color;
        item.append(sw, document.createTextNode(n));
        this.legend.append(item);
      }
    }

    // What was drawn, for people using a screen reader and for the Chromium tests (tests/chart_scene.py).
    publish(m, e, lines, count, width, height) {
      const axis = (name, title, lo, hi) => `${name}-axis titled '${title}' for a linear scale with values from ${lo} to ${hi}`;
      const scene = {
        width, height, block_height: this.host.getBoundingClientRect().height,
        axes: [axis("X", m.x_title || "", e.x0, e.x1), axis("Y", m.y_title || "", e.y0, e.y1)],
        lines, points: [], legend: m.legend === false ? [] : [...this.series.keys()], legend_clipped: [],
      };
      this.host.dataset.scene = JSON.stringify(scene);
      this.host.dataset.points = String(count);
      this.host.dataset.ymax = isFinite(e.dataMax) ? String(e.dataMax) : "";
      const parts = [...this.series].map(([n, s]) => {
        const ys = s.points.map((p) => p[1]);
        return ys.length ? `${n}: ${ys.length} points from ${fmt(Math.min(...ys))} to ${fmt(Math.max(...ys))}` : `${n}: no points`;
      });
      this.canvas.setAttribute("aria-label", `${m.label || "chart"}. ${parts.join("; ") || "no data yet"}`);
    }

    hover(ev) {
      if (!this.map || !this.series.size) return;
      const r = this.canvas.getBoundingClientRect();
      const { e, left, pw } = this.map;
      const x = e.x0 + ((ev.clientX - r.left - left) / pw) * (e.x1 - e.x0);
      const rows = [];
      for (const [label, s] of this.series) {
        let best = null;
        for (const p of s.points) if (best === null || Math.abs(this.xOf(p) - x) < Math.abs(this.xOf(best) - x)) best = p;
        if (best) rows.push(`${label}: ${fmt(best[1], this.meta && this.meta.y_exp)} at ${fmt(this.xOf(best))}`);
      }
      this.tip.textContent = rows.join("\n");
      this.tip.style.display = rows.length ? "block" : "none";
      this.tip.style.left = Math.min(ev.clientX - r.left + 12, r.width - 160) + "px";
      this.tip.style.top = ev.clientY - r.top + 12 + "px";
    }
  }

  const charts = new Map(); // chart elem_id -> Chart (a re-rendered block gets a new one)
  function chartFor(id) {
    const host = document.querySelector(`#${CSS.escape(id)} .td-chart`);
    if (!host) return null;
    let chart = charts.get(id);
    if (!chart || chart.host !== host) {
      chart = new Chart(host);
      charts.set(id, chart);
    }
    return chart;
  }

  // ------------------------------------------------------------------ the stream
  const shown = (el) => !!el && el.getClientRects().length > 0 && getComputedStyle(el).visibility !== "hidden";
  const onScreen = (el) => {
    if (!shown(el)) return false;
    const r = el.getBoundingClientRect();
    return r.bottom > 0 && r.top < window.innerHeight;
  };
  function wanted() {
    if (document.hidden) return "";
    const q = new URLSearchParams();
    const runId = document.querySelector("#run-id input");
    const id = runId && runId.value.trim();
    if (id && /^\d+$/.test(id) && shown(document.querySelector("#run-header"))) q.set("run", id);
    if (onScreen(document.querySelector("#gpu-memory-plot"))) {
      q.set("gpu", "1");
      const device = document.querySelector("#gpu-device input");
      if (device && shown(device) && device.value) q.set("device", device.value);
    }
    if (shown(document.querySelector("#runs-table"))) q.set("runs", "1");
    return q.toString();
  }

  const pressed = new Map(); // button id -> {at, timer}
  function press(id, gap) {
    const entry = pressed.get(id) || { at: 0, timer: null };
    pressed.set(id, entry);
    const go = () => {
      entry.timer = null;
      entry.at = Date.now();
      const button = document.getElementById(id);
      if (button) button.click();
    };
    if (gap === 0 && entry.timer) { // at once: the waiting press goes now
      clearTimeout(entry.timer);
      entry.timer = null;
    }
    const wait = entry.at + gap - Date.now();
    if (wait <= 0 && !entry.timer) go();
    else if (!entry.timer) entry.timer = setTimeout(go, Math.max(wait, 0));
  }

  // The progress bar follows the stream at once (run_text.progress_html draws it: bar, then
  // "step N/T · ETA ..."); the ETA and the rest of the run's text come with the next redraw.
  function showStep(runId, step, total) {
    const el = document.getElementById("run-progress");
    const shownId = document.querySelector("#run-id input");
    if (!el || typeof step !== "number" || !shownId || shownId.value.trim() !== String(runId)) return;
    el.dataset.step = String(step);
    if (typeof total === "number" && total > 0) {
      el.dataset.total = String(total);
      const bar = el.firstElementChild && el.firstElementChild.firstElementChild;
      if (bar) bar.style.width = Math.min(100, (100 * step) / total).toFixed(1) + "%";
    }
    const label = el.children[1];
    if (label) label.textContent = label.textContent.replace(/^step \d+\/\S+/, "step " + step + "/" + (total || "?"));
  }

  const BUTTONS = { run: "run-poll", runs: "runs-refresh", devices: "gpu-poll" };
  let lastStatus = null;
  function handle(msg) {
    if (msg.kind === "charts") {
      for (const [id, update] of Object.entries(msg.charts)) {
        const chart = chartFor(id);
        if (chart) chart.apply(update, msg.now);
      }
    } else if (msg.kind === "run") {
      showStep(msg.run_id, msg.step, msg.total);
      const moved = msg.status !== lastStatus; // queued -> running -> finished: shown at once
      lastStatus = msg.status;
      press(BUTTONS.run, moved ? 0 : RUN_TEXT_GAP_MS);
    } else if (BUTTONS[msg.kind]) press(BUTTONS[msg.kind], PRESS_GAP_MS);
  }

  const live = { key: null, source: null, ended: null, messages: 0, draws: 0 };
  function check() {
    const key = wanted();
    if (key === live.key) return;
    if (live.source) live.source.close();
    live.source = null;
    live.key = key;
    if (!key || key === live.ended) return;
    live.ended = null;
    const source = new EventSource(new URL("tunedeck/live?" + key, document.baseURI));
    source.onmessage = (e) => {
      live.messages++;
      handle(JSON.parse(e.data));
    };
    source.onerror = () => {
      // CLOSED: the server refused the stream (restarting, or an error); open it again in a while.
      if (source.readyState === EventSource.CLOSED && live.source === source) {
        live.source = null;
        setTimeout(() => { if (live.key === key && !live.source) live.key = null; }, RETRY_MS);
      }
    };
    source.addEventListener("end", () => {
      source.close();
      if (live.source === source) {
        live.source = null;
        live.ended = key;
      }
    });
    live.source = source;
  }
  // What the page shows changes on a click or a key (a tab, the run id, the GPU panel), a scroll or a
  // resize, or a hidden browser tab: look then; and once a second in case something else moved it.
  let soon = null;
  const checkSoon = () => {
    if (soon === null) soon = setTimeout(() => { soon = null; check(); }, 80);
  };
  for (const name of ["click", "keyup", "change"]) document.addEventListener(name, checkSoon, true);
  for (const name of ["scroll", "resize"]) window.addEventListener(name, checkSoon, { passive: true });
  document.addEventListener("visibilitychange", check);
  setInterval(check, CHECK_MS);
  window.tunedeckLive = live;
})();
