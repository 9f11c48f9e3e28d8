// Charts drawn with uPlot from the public API, every series already downsampled by the
// server (min/max buckets, at most 1,000 points a curve):
// - an experiment's page: every trial's learning curve of the searcher's metric
//   (GET /api/v1/experiments/{id}/curves), the metric against each hyperparameter
//   (GET /api/v1/experiments/{id}/trials) and the hyperparameters' importance
//   (GET /api/v1/experiments/{id}/importance), redrawn while the experiment runs;
// - a trial's page: each metric it reports (GET /api/v1/trials/{id}/series), and, in a
//   panel of their own, its replicas' resources (the same answer's `system` series, one
//   per resource and rank: a chart per resource, a curve per rank, against the clock).
// uPlot draws the axes, keeps the scales and turns a drag into a zoom on x (a double-click
// or "Reset zoom" undoes it); the curves and points are drawn by this file in uPlot's draw
// hook, so that 1,000 trials are two canvas paths rather than 1,000 series, the dimmed
// trials go first and the highlighted ones on top. Hovering shows the trial, x and y under
// the cursor; a click opens that trial. Integer hyperparameters are jittered by trial id
// (always the same picture) within ±0.3 of their value, categories drawn as strips, log
// ones on a log axis labelled at each decade.
// When a chart has drawn, its element gets `data-drawn` (and the count of its curves in
// `data-curves`), which tests and the screenshot script wait for; each plot's element holds
// what it drew, `musterPlotted` ({trial, number, x, y, at}: `at` the x position drawn), its
// x axis's ticks as drawn (`musterTicks`: {splits, labels}) and the trials it highlighted
// (`musterHighlighted`), for the tests to compare with the API.
"use strict";

(function () {
  const REFRESH_MS = 10000;
  const PALETTE = ["#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#cf222e",
                   "#0550ae", "#116329", "#953800", "#6639ba"];
  const HOVER_PX = 10;  // how near the cursor a point must be to be the one under it
  const JITTER = 0.3;  // an integer's or a category's points spread over ±JITTER

  async function getJSON(url) {
    const response = await fetch(url, {credentials: "same-origin"});
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      const error = new Error(body.message || body.detail || ("HTTP " + response.status));
      error.status = response.status;
      throw error;
    }
    return body;
  }

  // A note in `box`, in place of what it held: text, never markup (a metric's name is the
  // user's).
  function showNote(box, text) {
    const p = document.createElement("p");
    p.className = "chart-note";
    p.textContent = text;
    box.replaceChildren(p);
  }

  function width(el) { return Math.max(320, Math.min(1100, el.clientWidth || 900)); }

  function bounds(arrays) {
    let lo = Infinity, hi = -Infinity;
    for (const values of arrays) {
      for (const v of values) { if (v < lo) { lo = v; } if (v > hi) { hi = v; } }
    }
    if (!isFinite(lo)) { return [0, 1]; }
    if (lo === hi) { return [lo - 1, hi + 1]; }
    const pad = (hi - lo) * 0.04;
    return [lo - pad, hi + pad];
  }

  function number(v) {
    if (v === null || v === undefined) { return "–"; }
    return Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(2) : String(+v.toPrecision(4));
  }

  // A trial's colour, the same in every chart of the page.
  function colorOf(trialId) { return PALETTE[trialId % PALETTE.length]; }

  // A trial's offset in [-JITTER, JITTER]: a hash of its id, so every drawing is the same.
  function jitter(trialId) {
    let h = Math.imul((trialId | 0) ^ 0x9e3779b9, 0x85ebca6b);
    h ^= h >>> 13;
    h = Math.imul(h, 0xc2b2ae35);
    h ^= h >>> 16;
    return ((h >>> 0) / 4294967296 * 2 - 1) * JITTER;
  }

  // -- what is highlighted, shared by an experiment's charts and its legend --
  const view = {query: [], selected: new Set(), best: null, hovered: null, charts: new Set()};

  function searchText(t) {
    const words = ["#" + t.number, "trial " + t.trial_id, String(t.state || "")];
    for (const [name, value] of flatHparams(t.hparams || {}, "")) { words.push(name + "=" + value); }
    return words.join(" ").toLowerCase();
  }

  function flatHparams(hparams, prefix) {
    const found = [];
    for (const [key, value] of Object.entries(hparams)) {
      const name = prefix ? prefix + "." + key : key;
      if (value && typeof value === "object" && !Array.isArray(value)) {
        found.push(...flatHparams(value, name));
      } else {
        found.push([name, String(value)]);
      }
    }
    return found;
  }

  function matches(text) { return view.query.length > 0 && view.query.every((w) => text.includes(w)); }

  // How a trial is drawn: "best", "hovered", "on" (selected or found), "off" (dimmed: others
  // are highlighted) or "plain".
  function emphasis(trialId, text) {
    if (trialId === view.hovered) { return "hovered"; }
    if (trialId === view.best) { return "best"; }
    if (view.selected.has(trialId) || (text !== undefined && matches(text))) { return "on"; }
    return view.query.length || view.selected.size ? "off" : "plain";
  }

  function redrawAll() {
    for (const u of view.charts) {
      if (u.root.isConnected) { u.redraw(false, false); } else { view.charts.delete(u); }
    }
  }

  // -- one plot: uPlot for the axes, scales and zoom; the items drawn by `render` --
  const zooms = new Map();  // a plot's key → its x zoom, kept across the running page's redraws

  // The page's colours now, light or dark (muster.css, static/theme.js): the text's for the
  // axes, a faint one for the grid, and the best trial's (black on light, white on dark).
  function ink() {
    const text = getComputedStyle(document.body).color;
    const rgb = (text.match(/\d+/g) || ["0", "0", "0"]).slice(0, 3).map(Number);
    const darkPage = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 128;
    const faint = "rgba(" + rgb.join(",") + ",0.12)";
    return {text: text, faint: faint, best: darkPage ? "#f0f6fc" : "#000000"};
  }

  function plot(holder, spec) {
    const zoom = zooms.get(spec.key);  // read first: the new chart's own first scale resets it
    const colours = ink();
    STYLE.best.color = DOT.best.fill = colours.best;
    const axis = {stroke: colours.text, grid: {stroke: colours.faint}, ticks: {stroke: colours.faint}};
    const u = new uPlot({
      mode: 2,
      width: spec.width,
      height: spec.height,
      legend: {show: false},
      cursor: {drag: {x: true, y: false, setScale: true}, points: {show: false}},
      scales: {x: {time: Boolean(spec.time), distr: spec.log ? 3 : 1, log: 10, range: () => spec.xRange},
               y: {range: () => spec.yRange}},
      axes: [Object.assign({}, axis, spec.xAxis), Object.assign({}, axis, {label: spec.yLabel, size: 56})],
      series: [{}, {paths: () => null, points: {show: false}}],
      hooks: {
        draw: [(self) => render(self, holder, spec)],
        setCursor: [(self) => hover(self, holder, spec)],
        setScale: [(self, key) => { if (key === "x") { remember(self, spec); } }],
      },
    }, [null, [spec.xRange, spec.yRange]], holder);
    holder.chart = u;
    const tip = document.createElement("div");
    tip.className = "chart-tip";
    tip.hidden = true;
    u.over.appendChild(tip);
    holder.musterTip = tip;
    clickThrough(u, holder, spec);
    const reset = document.createElement("button");
    reset.type = "button";
    reset.className = "chart-reset";
    reset.textContent = "Reset zoom";
    reset.addEventListener("click", () => u.setScale("x", {min: spec.xRange[0], max: spec.xRange[1]}));
    holder.appendChild(reset);
    if (zoom) { u.setScale("x", zoom); }
    if (spec.shared) { view.charts.add(u); }
    return u;
  }

  function remember(u, spec) {
    const min = u.scales.x.min, max = u.scales.x.max;
    if (min === spec.xRange[0] && max === spec.xRange[1]) { zooms.delete(spec.key); } else { zooms.set(spec.key, {min, max}); }
    saveState();
  }

  // The charts' state in the page's address, so a reload or a shared link shows the same
  // picture: the legend's search (`find`), the selected trials (`sel`), each zoomed chart's
  // x range (`zoom.KEY=min,max`). The address's other words (the table's, the events') stay.
  const MAX_SELECTED = 200;
  function saveState() {
    const params = new URLSearchParams(location.search);
    for (const key of Array.from(params.keys())) {
      if (key.startsWith("zoom.") || key === "find" || key === "sel") { params.delete(key); }
    }
    if (view.query.length) { params.set("find", view.query.join(" ")); }
    if (view.selected.size) { params.set("sel", Array.from(view.selected).join(",")); }
    for (const [key, zoom] of zooms) { params.set("zoom." + key, zoom.min + "," + zoom.max); }
    const query = params.toString();
    history.replaceState(history.state, "", location.pathname + (query ? "?" + query : "") + location.hash);
  }

  function loadState() {
    const params = new URLSearchParams(location.search);
    view.query = (params.get("find") || "").toLowerCase().split(/\s+/).filter(Boolean).slice(0, 20);
    for (const word of (params.get("sel") || "").split(",").slice(0, MAX_SELECTED)) {
      const id = Number(word);
      if (Number.isInteger(id) && id > 0) { view.selected.add(id); }
    }
    for (const [key, value] of params) {
      if (!key.startsWith("zoom.")) { continue; }
      const [min, max] = value.split(",").map(Number);
      if (Number.isFinite(min) && Number.isFinite(max) && min < max) { zooms.set(key.slice(5), {min, max}); }
    }
  }

  function render(u, holder, spec) {
    const ctx = u.ctx;
    ctx.save();
    ctx.beginPath();
    ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
    ctx.clip();
    const highlighted = spec.curves ? renderCurves(u, spec) : renderPoints(u, spec);
    ctx.restore();
    holder.musterHighlighted = highlighted;
  }

  const STYLE = {
    plain: {color: null, width: 1, alpha: 0.8},
    off: {color: "#8c959f", width: 1, alpha: 0.25},
    on: {color: null, width: 2, alpha: 1},
    best: {color: "#000000", width: 2.5, alpha: 1},
    hovered: {color: "#fb8500", width: 3, alpha: 1},
  };

  // Dimmed and plain curves first (one path for all when there are many), then each
  // highlighted one on top. Returns the highlighted trials' ids.
  function renderCurves(u, spec) {
    const ctx = u.ctx;
    const many = spec.curves.length > 50;
    const top = [];
    const bulk = {solid: new Path2D(), dashed: new Path2D(), style: null};
    for (const c of spec.curves) {
      const how = emphasis(c.trial, c.text);
      if (how === "on" || how === "best" || how === "hovered") { top.push([c, how]); continue; }
      const style = STYLE[how];
      if (many || how === "off") {
        trace(u, bulk[c.dashed ? "dashed" : "solid"], c);
        bulk.style = bulk.style === null || how === "plain" ? how : bulk.style;
        continue;
      }
      stroke(u, c, style.color || c.color || colorOf(c.trial), style.width, style.alpha);
    }
    if (bulk.style !== null) {
      const style = bulk.style === "plain" ? {color: "#0969da", alpha: 0.25} : STYLE.off;
      ctx.globalAlpha = style.alpha;
      ctx.strokeStyle = style.color;
      ctx.lineWidth = uPlot.pxRatio || 1;
      ctx.stroke(bulk.solid);
      ctx.setLineDash([4, 3]);
      ctx.stroke(bulk.dashed);
      ctx.setLineDash([]);
      ctx.globalAlpha = 1;
    }
    const order = {on: 0, best: 1, hovered: 2};
    top.sort((a, b) => order[a[1]] - order[b[1]]);
    for (const [c, how] of top) {
      const style = STYLE[how];
      stroke(u, c, style.color || colorOf(c.trial), style.width, style.alpha);
    }
    if (spec.dots) { for (const c of spec.curves) { dots(u, c); } }
    return top.map((item) => item[0].trial);
  }

  // A short curve's reports as dots, so that each one can be seen and hovered.
  function dots(u, c) {
    const r = 2 * (uPlot.pxRatio || 1);
    const path = new Path2D();
    for (let k = 0; k < c.xs.length; k++) {
      const x = u.valToPos(c.xs[k], "x", true), y = u.valToPos(c.ys[k], "y", true);
      path.moveTo(x + r, y);
      path.arc(x, y, r, 0, 2 * Math.PI);
    }
    u.ctx.fillStyle = c.color || colorOf(c.trial);
    u.ctx.fill(path);
  }

  function trace(u, path, c) {
    for (let k = 0; k < c.xs.length; k++) {
      const x = u.valToPos(c.xs[k], "x", true), y = u.valToPos(c.ys[k], "y", true);
      if (k === 0) { path.moveTo(x, y); } else { path.lineTo(x, y); }
    }
    if (c.xs.length === 1) { path.arc(u.valToPos(c.xs[0], "x", true), u.valToPos(c.ys[0], "y", true), 2, 0, 2 * Math.PI); }
  }

  function stroke(u, c, color, lineWidth, alpha) {
    const path = new Path2D();
    trace(u, path, c);
    const ctx = u.ctx;
    ctx.globalAlpha = alpha;
    ctx.strokeStyle = color;
    ctx.lineWidth = lineWidth * (uPlot.pxRatio || 1);
    ctx.setLineDash(c.dashed ? [4, 3] : []);
    ctx.stroke(path);
    ctx.setLineDash([]);
    ctx.globalAlpha = 1;
  }

  const DOT = {
    plain: {fill: "#0969da", alpha: 0.55, r: 3},
    off: {fill: "#8c959f", alpha: 0.35, r: 2.5},
    on: {fill: null, alpha: 1, r: 4},  // the trial's colour
    best: {fill: "#000000", alpha: 1, r: 5},
    hovered: {fill: "#fb8500", alpha: 1, r: 5.5},
  };

  function renderPoints(u, spec) {
    const ctx = u.ctx;
    const ratio = uPlot.pxRatio || 1;
    const layers = {plain: [], off: [], on: [], best: [], hovered: []};
    for (const p of spec.points) {
      const how = emphasis(p.trial, p.text);  // a Pareto chart draws its front as the best
      layers[how === "plain" && spec.front && spec.front.has(p.trial) ? "best" : how].push(p);
    }
    for (const how of ["off", "plain", "on", "best", "hovered"]) {
      const dot = DOT[how];
      const groups = dot.fill ? [[dot.fill, layers[how]]] : layers[how].map((p) => [colorOf(p.trial), [p]]);
      for (const [fill, group] of groups) {
        const path = new Path2D();
        for (const p of group) {
          const x = u.valToPos(p.at, "x", true), y = u.valToPos(p.y, "y", true);
          path.moveTo(x + dot.r * ratio, y);
          path.arc(x, y, dot.r * ratio, 0, 2 * Math.PI);
        }
        ctx.globalAlpha = dot.alpha;
        ctx.fillStyle = fill;
        ctx.fill(path);
      }
    }
    ctx.globalAlpha = 1;
    return [...layers.on, ...layers.best, ...layers.hovered].map((p) => p.trial);
  }

  // The plotted point nearest the cursor (within HOVER_PX), in the tip, and as the hovered
  // trial of every chart of the page.
  function hover(u, holder, spec) {
    const left = u.cursor.left, top = u.cursor.top;
    let found = null;
    if (left >= 0 && top >= 0) {
      found = spec.curves ? nearestOnCurve(u, holder.musterPlotted, left, top) : nearestPoint(u, holder.musterPlotted, left, top);
    }
    const tip = holder.musterTip;
    holder.musterHovered = found;
    if (found === null) {
      tip.hidden = true;
    } else {
      tip.textContent = spec.describe(found);
      tip.hidden = false;
      const right = left > u.over.clientWidth / 2;
      tip.style.left = right ? "" : (left + 12) + "px";
      tip.style.right = right ? (u.over.clientWidth - left + 12) + "px" : "";
      tip.style.top = Math.max(0, top - 28) + "px";
    }
    u.over.classList.toggle("chart-pointing", found !== null && spec.link);
    const trial = found && spec.link ? found.trial : null;
    if (spec.shared && trial !== view.hovered) { view.hovered = trial; redrawAll(); }
  }

  function nearestPoint(u, points, left, top) {
    let found = null, nearest = HOVER_PX * HOVER_PX;
    for (const p of points) {
      const dx = u.valToPos(p.at, "x") - left, dy = u.valToPos(p.y, "y") - top;
      const d = dx * dx + dy * dy;
      if (d <= nearest) { nearest = d; found = p; }
    }
    return found;
  }

  // On a curve chart, the curve passing nearest the cursor (its segments, not only its
  // points), and of it the report nearest the cursor's x. `points` are the curves' reports
  // in order, curve after curve.
  function nearestOnCurve(u, points, left, top) {
    let found = null, nearest = HOVER_PX * HOVER_PX;
    let x0 = 0, y0 = 0;
    for (let k = 0; k < points.length; k++) {
      const p = points[k];
      const x1 = u.valToPos(p.at, "x"), y1 = u.valToPos(p.y, "y");
      const joined = k > 0 && points[k - 1].trial === p.trial;
      const d = joined ? segmentDistance(left, top, x0, y0, x1, y1) : (x1 - left) ** 2 + (y1 - top) ** 2;
      if (d <= nearest) {
        nearest = d;
        found = joined && Math.abs(x0 - left) < Math.abs(x1 - left) ? points[k - 1] : p;
      }
      x0 = x1;
      y0 = y1;
    }
    return found;
  }

  // The squared distance from (px, py) to the segment (x0, y0)–(x1, y1).
  function segmentDistance(px, py, x0, y0, x1, y1) {
    const dx = x1 - x0, dy = y1 - y0;
    const length = dx * dx + dy * dy;
    const t = length === 0 ? 0 : Math.max(0, Math.min(1, ((px - x0) * dx + (py - y0) * dy) / length));
    const ex = x0 + t * dx - px, ey = y0 + t * dy - py;
    return ex * ex + ey * ey;
  }

  // A click (not the end of a drag) on a point opens its trial.
  function clickThrough(u, holder, spec) {
    if (!spec.link) { return; }
    let down = null;
    u.over.addEventListener("mousedown", (e) => { down = [e.clientX, e.clientY]; });
    u.over.addEventListener("click", (e) => {
      const still = down && Math.abs(e.clientX - down[0]) < 4 && Math.abs(e.clientY - down[1]) < 4;
      if (still && holder.musterHovered) { location.assign("/trials/" + holder.musterHovered.trial); }
    });
  }

  // -- an experiment's learning curves: one per trial, each with its own steps --
  function drawCurves(el, note, answer, bestId) {
    const trials = answer.trials;
    el.replaceChildren();
    view.best = bestId;
    if (!trials.length) {
      note.textContent = "No trial has reported " + answer.metric + " yet.";
      el.musterPlotted = [];
      el.dataset.drawn = "true";
      el.dataset.curves = "0";
      return;
    }
    const stopped = trials.filter((t) => t.early_stop).length;
    const curves = trials.map((t) => ({trial: t.trial_id, number: t.number, xs: t.steps, ys: t.values,
                                       dashed: Boolean(t.early_stop), text: searchText(t)}));
    el.musterPlotted = curves.flatMap((c) => c.xs.map((x, k) => ({trial: c.trial, number: c.number, x: x, y: c.ys[k], at: x})));
    plot(el, {
      key: "curves", width: width(el), height: 320, shared: true, link: true, curves: curves,
      xRange: bounds(trials.map((t) => t.steps)), yRange: bounds(trials.map((t) => t.values)),
      xAxis: {label: "step"}, yLabel: answer.metric,
      describe: (p) => "trial " + p.trial + " (#" + p.number + ") · step " + p.x + " · " + answer.metric + " " + number(p.y),
    });
    const best = trials.find((t) => t.trial_id === bestId);
    note.textContent = trials.length + " curves (one per trial, up to " + answer.points_per_trial +
      " points each)" + (best ? "; black: the best trial, #" + best.number : "") +
      (stopped ? "; dashed: " + stopped + " stopped early by the searcher" : "") +
      ". Hover for values, click a curve for its trial, drag to zoom.";
    el.dataset.curves = String(trials.length);
    el.dataset.best = best ? String(best.number) : "";
    el.dataset.drawn = "true";
  }

  // -- the legend: find trials, select them; the rest are dimmed in every chart --
  function legend(box, trials, metric) {
    const list = box.querySelector("ul") || legendFrame(box);
    const rows = trials.map((t) => legendRow(t, metric));
    list.replaceChildren(...rows);
    filterLegend(box);
  }

  function legendFrame(box) {
    const bar = document.createElement("div");
    bar.className = "legend-bar";
    const search = document.createElement("input");
    search.type = "search";
    search.placeholder = "#12, trial 345, lr=0.01 …";
    search.setAttribute("aria-label", "Find trials");
    search.value = view.query.join(" ");  // from the address (`loadState`)
    search.addEventListener("input", () => {
      view.query = search.value.toLowerCase().split(/\s+/).filter(Boolean);
      filterLegend(box);
      redrawAll();
      saveState();
    });
    const count = document.createElement("span");
    count.className = "legend-count";
    const clear = document.createElement("button");
    clear.type = "button";
    clear.textContent = "Clear selection";
    clear.addEventListener("click", () => {
      view.selected.clear();
      for (const check of box.querySelectorAll("input[type=checkbox]")) { check.checked = false; }
      redrawAll();
      saveState();
    });
    bar.append(search, count, clear);
    const list = document.createElement("ul");
    list.className = "legend-list";
    box.append(bar, list);
    return list;
  }

  function legendRow(t, metric) {
    const row = document.createElement("li");
    row.dataset.trial = String(t.trial_id);
    row.dataset.text = searchText(t);
    const label = document.createElement("label");
    const check = document.createElement("input");
    check.type = "checkbox";
    check.checked = view.selected.has(t.trial_id);
    check.addEventListener("change", () => {
      if (check.checked) { view.selected.add(t.trial_id); } else { view.selected.delete(t.trial_id); }
      redrawAll();
      saveState();
    });
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = t.trial_id === view.best ? ink().best : colorOf(t.trial_id);
    label.append(check, swatch, document.createTextNode("#" + t.number + (t.trial_id === view.best ? " (best)" : "")));
    const link = document.createElement("a");
    link.href = "/trials/" + t.trial_id;
    link.textContent = "trial " + t.trial_id;
    const last = document.createElement("span");
    last.className = "dim";
    last.textContent = t.values.length ? metric + " " + number(t.values[t.values.length - 1]) + " at step " + t.steps[t.steps.length - 1] : "";
    last.title = last.textContent;  // cut with an ellipsis where the column is narrow
    row.append(label, link, last);
    return row;
  }

  function filterLegend(box) {
    let shown = 0;
    const rows = box.querySelectorAll("li");
    for (const row of rows) {
      row.hidden = view.query.length > 0 && !matches(row.dataset.text);
      if (!row.hidden) { shown += 1; }
    }
    box.querySelector(".legend-count").textContent = view.query.length ? shown + " of " + rows.length + " trials match" : rows.length + " trials";
  }

  // -- the metric against one hyperparameter: a point per trial --
  // How a hyperparameter's values are placed on x: their positions (`at`), the range and
  // the x axis (ticks at each integer, category or decade).
  function placement(type, points) {
    const numeric = points.every((p) => typeof p.x === "number");
    if (type === "categorical" || !numeric) {
      const values = Array.from(new Set(points.map((p) => String(p.x))));
      values.sort((a, b) => numeric ? Number(a) - Number(b) : a.localeCompare(b));
      const at = (p) => values.indexOf(String(p.x)) + jitter(p.trial);
      return {at, range: [-0.5, values.length - 0.5], log: false,
              ticks: () => values.map((_, i) => i), labels: () => values};
    }
    if (type === "log" && points.every((p) => p.x > 0)) {
      const lo = Math.floor(Math.log10(Math.min(...points.map((p) => p.x))));
      let hi = Math.ceil(Math.log10(Math.max(...points.map((p) => p.x))));
      if (hi === lo) { hi = lo + 1; }
      const decades = [];
      for (let e = lo; e <= hi; e++) { decades.push(e); }
      return {at: (p) => p.x, range: [10 ** lo, 10 ** hi], log: true,
              ticks: () => decades.map((e) => 10 ** e), labels: () => decades.map((e) => "1e" + e)};
    }
    if (type === "int" || points.every((p) => Number.isInteger(p.x))) {
      const [lo, hi] = [Math.min(...points.map((p) => p.x)), Math.max(...points.map((p) => p.x))];
      const each = hi - lo <= 20;
      return {at: (p) => p.x + jitter(p.trial), range: [lo - 0.5, hi + 0.5], log: false,
              ticks: each ? () => Array.from({length: hi - lo + 1}, (_, i) => lo + i) : null,
              labels: each ? (splits) => splits.map(String) : null};
    }
    return {at: (p) => p.x, range: bounds([points.map((p) => p.x)]), log: false, ticks: null, labels: null};
  }

  function drawScatter(box, name, type, points, metric) {
    const holder = document.createElement("div");
    holder.className = "hp-chart";
    holder.dataset.hparam = name;
    const title = document.createElement("h3");
    title.textContent = name;
    holder.appendChild(title);
    box.appendChild(holder);
    const place = placement(type, points);
    holder.musterPlotted = points.map((p) => ({trial: p.trial, number: p.number, x: p.x, y: p.y, at: place.at(p), text: p.text}));
    const xAxis = {};
    if (place.ticks) {
      xAxis.splits = place.ticks;
      xAxis.values = (u, splits) => {
        const labels = place.labels(splits);
        holder.musterTicks = {splits: splits.slice(), labels: labels.slice()};
        return labels;
      };
    }
    plot(holder, {
      key: "hp:" + name, width: 320, height: 200, shared: true, link: true, points: holder.musterPlotted,
      xRange: place.range, yRange: bounds([points.map((p) => p.y)]), log: place.log,
      xAxis: xAxis, yLabel: metric,
      describe: (p) => "trial " + p.trial + " (#" + p.number + ") · " + name + " " +
        (typeof p.x === "number" ? number(p.x) : String(p.x)) + " · " + metric + " " + number(p.y),
    });
  }

  async function drawHparams(box, experiment, metric) {
    const types = JSON.parse(box.dataset.types || "{}");
    const trials = await getJSON("/api/v1/experiments/" + experiment + "/trials?limit=1000&state=SUCCEEDED&sort=" + encodeURIComponent(metric));
    box.replaceChildren();
    const withValue = trials.filter((t) => t.best_validation && typeof t.best_validation[metric] === "number");
    if (!withValue.length) {
      showNote(box, "No SUCCEEDED trial has a value of " + metric + " yet.");
      box.dataset.drawn = "true";
      return;
    }
    for (const [name, type] of Object.entries(types)) {
      const path = name.split(".");
      const points = withValue.map((t) => {
        let x = t.hparams;
        for (const key of path) { x = x && typeof x === "object" ? x[key] : undefined; }
        return {trial: t.id, number: t.number, x: x, y: t.best_validation[metric],
                text: searchText({trial_id: t.id, number: t.number, state: t.state, hparams: t.hparams})};
      }).filter((p) => p.x !== undefined && p.x !== null);
      drawScatter(box, name, type, points, metric);
    }
    box.dataset.drawn = "true";
  }

  async function drawImportance(box, experiment) {
    let answer;
    try {
      answer = await getJSON("/api/v1/experiments/" + experiment + "/importance");
    } catch (error) {
      showNote(box, "Not computed: " + error.message);
      box.dataset.drawn = "true";
      return;
    }
    box.replaceChildren();
    const head = document.createElement("p");
    head.className = "chart-note";
    head.textContent = answer.evaluator + " over " + answer.trials_used + " trials (" +
      answer.ended_trials + " ended), " + answer.metric + "." + (answer.message ? " " + answer.message : "");
    box.appendChild(head);
    for (const item of answer.importances) {
      const row = document.createElement("div");
      row.className = "bar";
      const label = document.createElement("span");
      label.textContent = item.name;
      const track = document.createElement("span");
      const fill = document.createElement("span");
      fill.className = "fill";
      fill.style.width = (100 * item.importance).toFixed(1) + "%";
      track.appendChild(fill);
      const value = document.createElement("span");
      value.textContent = item.importance.toFixed(3);
      row.append(label, track, value);
      box.appendChild(row);
    }
    box.dataset.drawn = "true";
  }

  // -- a multi-objective search's Pareto front: its first two objectives against each
  // other, every trial that has both, the front in the best trial's ink; a list of the
  // front's trials with each objective's value under it --
  async function drawPareto(box, note, experiment) {
    let answer;
    try {
      answer = await getJSON("/api/v1/experiments/" + experiment + "/front");
    } catch (error) {
      note.textContent = "Pareto front: " + error.message;
      box.dataset.drawn = "true";
      return;
    }
    box.replaceChildren();
    const [ox, oy] = answer.objectives;
    const front = answer.points.filter((p) => p.on_front);
    box.dataset.front = front.map((p) => p.trial_id).join(",");
    box.dataset.points = String(answer.points.length);
    const direction = (o) => o.name + (o.smaller_is_better ? " (smaller is better)" : " (larger is better)");
    note.textContent = front.length + (front.length === 1 ? " trial is" : " trials are") +
      " on the front (no other is as good on every objective and better on one), " +
      (answer.points.length - front.length) + " beaten, " + answer.without_values +
      " without a finite value of every objective. x: " + direction(ox) + "; y: " + direction(oy) + ".";
    if (answer.points.length) {
      const holder = document.createElement("div");
      holder.className = "hp-chart pareto-chart";
      box.appendChild(holder);
      holder.musterPlotted = answer.points.map((p) => ({
        trial: p.trial_id, number: p.number, x: p.values[ox.name], y: p.values[oy.name],
        at: p.values[ox.name], front: p.on_front,
        text: searchText({trial_id: p.trial_id, number: p.number, state: "SUCCEEDED", hparams: p.hparams})}));
      plot(holder, {
        key: "pareto", width: width(box), height: 320, shared: true, link: true,
        points: holder.musterPlotted, front: new Set(front.map((p) => p.trial_id)),
        xRange: bounds([holder.musterPlotted.map((p) => p.x)]),
        yRange: bounds([holder.musterPlotted.map((p) => p.y)]), log: false,
        xAxis: {label: ox.name}, yLabel: oy.name,
        describe: (p) => "trial " + p.trial + " (#" + p.number + ")" + (p.front ? " · on the front" : "") +
          " · " + ox.name + " " + number(p.x) + " · " + oy.name + " " + number(p.y),
      });
    }
    const list = document.createElement("table");
    list.className = "pareto-list";
    const head = list.createTHead().insertRow();
    for (const text of ["Trial", "Number", ...answer.objectives.map((o) => o.name)]) {
      const cell = document.createElement("th");
      cell.textContent = text;
      head.appendChild(cell);
    }
    const body = list.createTBody();
    for (const p of front) {
      const row = body.insertRow();
      const link = document.createElement("a");
      link.href = "/trials/" + p.trial_id;
      link.textContent = String(p.trial_id);
      row.insertCell().appendChild(link);
      row.insertCell().textContent = String(p.number);
      for (const o of answer.objectives) { row.insertCell().textContent = number(p.values[o.name]); }
    }
    box.appendChild(list);
    box.dataset.drawn = "true";
  }

  async function experimentCharts(section) {
    const experiment = section.dataset.experiment;
    const metric = section.dataset.metric;
    if (!metric) { return; }
    const curves = document.getElementById("curves");
    const note = document.getElementById("curves-note");
    const key = document.createElement("div");  // the legend, under the curves' note
    key.className = "chart-legend";
    key.setAttribute("aria-label", "trials of the charts");
    note.after(key);
    const hp = document.getElementById("hp-charts");
    const importance = document.getElementById("importance");
    const pareto = document.getElementById("pareto");
    async function draw() {
      view.charts.clear();
      if (pareto) { await drawPareto(pareto, document.getElementById("pareto-note"), experiment); }
      try {
        const answer = await getJSON("/api/v1/experiments/" + experiment + "/curves");
        // 404: no SUCCEEDED trial with a value yet, so no best to mark; anything else shows.
        const best = await getJSON("/api/v1/experiments/" + experiment + "/best").catch((error) => {
          if (error.status === 404) { return null; }
          throw error;
        });
        drawCurves(curves, note, answer, best ? best.id : null);
        legend(key, answer.trials, answer.metric);
      } catch (error) {
        note.textContent = "Learning curves: " + error.message;
      }
      if (below.shown) { await drawBelow(); }
    }
    // The charts under the curves (one per hyperparameter, the importance) are read and
    // drawn once they come near the screen, and redrawn with the curves from then on.
    const below = {shown: false};
    async function drawBelow() {
      if (hp) { await drawHparams(hp, experiment, metric).catch((error) => { hp.textContent = error.message; }); }
      if (importance) { await drawImportance(importance, experiment); }
    }
    if (hp || importance) {
      const near = new IntersectionObserver((entries) => {
        if (!entries.some((e) => e.isIntersecting)) { return; }
        near.disconnect();
        below.shown = true;
        drawBelow();
      }, {rootMargin: "400px 0px"});
      near.observe(hp || importance);
    }
    await draw();
    document.addEventListener("muster:theme", () => { draw(); });  // the new colours
    if (section.dataset.ended !== "true") {
      const timer = setInterval(async () => {
        if (document.hidden) { return; }
        await draw();
        const live = document.querySelector("#live .state");
        if (live && ["COMPLETED", "CANCELED", "ERROR"].includes(live.textContent.trim())) {
          clearInterval(timer);
          await draw();
        }
      }, REFRESH_MS);
    }
  }

  // -- a trial's metrics: one small chart per metric and kind; its resources apart --
  async function trialCharts(box, resources) {
    const trial = Number(box.dataset.trial);
    async function draw() {
      const answer = await getJSON("/api/v1/trials/" + trial + "/series");
      const reported = answer.series.filter((s) => s.kind !== "system");
      if (resources) { drawResources(resources, answer.series.filter((s) => s.kind === "system")); }
      box.replaceChildren();
      if (!reported.length) {
        showNote(box, "No metrics reported yet.");
      }
      reported.forEach((s, i) => {
        const holder = document.createElement("div");
        holder.className = "hp-chart";
        const title = document.createElement("h3");
        title.textContent = s.kind + " " + s.name + " (" + s.reports + " reports; lowest " +
          number(s.lowest) + ", highest " + number(s.highest) + ")";
        holder.appendChild(title);
        box.appendChild(holder);
        const curve = {trial: trial, xs: s.steps, ys: s.values, dashed: false, color: PALETTE[i % PALETTE.length]};
        holder.musterPlotted = s.steps.map((x, k) => ({trial: trial, x: x, y: s.values[k], at: x}));
        plot(holder, {
          key: s.kind + ":" + s.name, width: 360, height: 200, shared: false, link: false, curves: [curve],
          dots: s.steps.length < 50,
          xRange: bounds([s.steps]), yRange: bounds([s.values]), xAxis: {label: "step"}, yLabel: s.name,
          describe: (p) => "step " + p.x + " · " + s.name + " " + number(p.y),
        });
      });
      box.dataset.curves = String(reported.length);
      box.dataset.drawn = "true";
    }
    const failed = (error) => { box.textContent = "Metrics: " + error.message; };
    await draw().catch(failed);
    document.addEventListener("muster:theme", () => { draw().catch(failed); });
    if (box.dataset.atRest !== "true") {
      setInterval(() => { if (!document.hidden) { draw().catch(failed); } }, REFRESH_MS);
    }
  }

  // -- a trial's resources: a chart per resource, a curve per rank, x the clock --
  // The `system` series are named `<resource>/rank-<r>` (muster.system_metrics); a
  // sample's step is its time in ms. Memory is drawn in MiB.
  const RESOURCES = [
    {name: "system/cpu_percent", title: "CPU (% of one core)", scale: 1},
    {name: "system/rss_bytes", title: "Memory (RSS, MiB)", scale: 1 / 1048576},
    {name: "system/gpu_util_percent", title: "GPU utilisation (%)", scale: 1},
    {name: "system/gpu_memory_bytes", title: "GPU memory (MiB)", scale: 1 / 1048576},
  ];

  function clock(seconds) { return new Date(seconds * 1000).toLocaleTimeString(); }

  function drawResources(box, series) {
    box.replaceChildren();
    let drawn = 0;
    for (const resource of RESOURCES) {
      const curves = [];
      for (const s of series) {
        const match = /^(.*)\/rank-(\d+)$/.exec(s.name);
        if (!match || match[1] !== resource.name) { continue; }
        const rank = Number(match[2]);
        // A curve's identity (`trial`, which hovering follows) is its rank here.
        curves.push({trial: rank, rank: rank, xs: s.steps.map((ms) => ms / 1000),
                     ys: s.values.map((v) => v * resource.scale), dashed: false,
                     color: PALETTE[rank % PALETTE.length], peak: s.highest});
      }
      if (!curves.length) { continue; }
      curves.sort((a, b) => a.rank - b.rank);
      drawn += 1;
      const holder = document.createElement("div");
      holder.className = "hp-chart";
      holder.dataset.resource = resource.name;
      holder.dataset.curves = String(curves.length);
      const top = curves.reduce((a, b) => (b.peak > a.peak ? b : a));
      const title = document.createElement("h3");
      title.textContent = resource.title + " · " + curves.length + (curves.length === 1 ? " rank" : " ranks") +
        "; peak " + number(top.peak * resource.scale) + " (rank " + top.rank + ")";
      holder.appendChild(title);
      box.appendChild(holder);
      holder.musterPlotted = curves.flatMap((c) => c.xs.map((x, k) => ({trial: c.rank, rank: c.rank, x: x, y: c.ys[k], at: x})));
      plot(holder, {
        key: resource.name, width: 360, height: 200, shared: false, link: false, curves: curves,
        dots: curves.every((c) => c.xs.length < 50), time: true,
        xRange: bounds(curves.map((c) => c.xs)), yRange: [0, bounds(curves.map((c) => c.ys))[1] || 1],
        xAxis: {label: "time"}, yLabel: resource.title,
        describe: (p) => "rank " + p.rank + " · " + clock(p.x) + " · " + number(p.y),
      });
    }
    if (!drawn) { showNote(box, "No resource samples yet: each replica's are taken while it runs."); }
    box.dataset.resources = String(drawn);
    box.dataset.drawn = "true";
  }

  loadState();
  const section = document.getElementById("charts");
  if (section && section.dataset.experiment) { experimentCharts(section); }
  const metrics = document.getElementById("metric-charts");
  if (metrics && metrics.dataset.trial) { trialCharts(metrics, document.getElementById("resource-charts")); }
})();
