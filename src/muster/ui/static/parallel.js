// The experiment page's parallel coordinates: one line per trial across an axis for each
// searched hyperparameter and the searcher's metric (its best value), drawn on a canvas by
// Hermes (vendor/hermes.iife.js) from the public API (GET /api/v1/experiments/{id}/trials).
// Brushing an axis filters the trials table: the brushed ranges become the table's `where`
// words (hparam:NAME:LOW:HIGH, metric:NAME:LOW:HIGH) and the table's fragment is fetched
// with them, so the address keeps them (HX-Replace-Url) and a reload draws the same brushes.
// A categorical axis is drawn but brushing it filters nothing: a range has no categories.
(function () {
  "use strict";

  const PAGE = 1000;  // trials a request (search.MAX_TRIAL_PAGE allows 10,000)
  const MAX_TRIALS = 10000;  // an experiment's trials at most
  const REFRESH_MS = 10000;  // as the charts (charts.js)

  async function allTrials(experimentId) {
    const rows = [];
    for (let offset = 0; offset < MAX_TRIALS; offset += PAGE) {
      const answer = await fetch("/api/v1/experiments/" + experimentId + "/trials?limit=" + PAGE +
                                 "&offset=" + offset, {credentials: "same-origin"});
      if (!answer.ok) { throw new Error("HTTP " + answer.status); }
      const page = await answer.json();
      rows.push(...page);
      if (rows.length >= Number(answer.headers.get("X-Total-Count")) || !page.length) { break; }
    }
    return rows;
  }

  function dig(tree, name) {
    let value = tree;
    for (const key of name.split(".")) {
      if (value === null || typeof value !== "object" || !(key in value)) { return null; }
      value = value[key];
    }
    return value;
  }

  // The axes: each searched hyperparameter (`hparam:NAME`), then the metric (`metric:NAME`).
  function axes(types, metric, rows) {
    const H = Hermes.DimensionType;
    const found = Object.keys(types).map((name) => {
      const dimension = {key: "hparam:" + name, label: name,
                         type: types[name] === "log" ? H.Logarithmic : types[name] === "categorical" ? H.Categorical : H.Linear};
      if (dimension.type === H.Logarithmic) { dimension.logBase = 10; }  // only the axis's ticks
      if (dimension.type === H.Categorical) {
        dimension.categories = Array.from(new Set(rows.map((t) => String(dig(t.hparams, name)))));
      }
      return dimension;
    });
    if (metric) { found.push({key: "metric:" + metric, label: "best " + metric, type: H.Linear}); }
    return found;
  }

  function values(dimension, rows, metric) {
    return rows.map((t) => {
      const value = dimension.key.startsWith("metric:") ? t.best_validation[metric] : dig(t.hparams, dimension.label);
      if (dimension.type === Hermes.DimensionType.Categorical) { return String(value); }
      return typeof value === "number" ? value : Number.NaN;
    });
  }

  // The address's ranges as brushes, for the axes they name.
  function brushesFromAddress(dimensions) {
    const keys = new Set(dimensions.filter((d) => d.type !== Hermes.DimensionType.Categorical).map((d) => d.key));
    const filters = {};
    for (const word of new URLSearchParams(location.search).getAll("where")) {
      const parts = word.split(":");
      if (parts.length < 4) { continue; }
      const high = parts.pop(), low = parts.pop(), key = parts.join(":");
      if (!keys.has(key) || low === "" || high === "") { continue; }
      filters[key] = [{value0: Number(low), value1: Number(high)}];
    }
    return filters;
  }

  // The brushed ranges replace the table's ranges on the chart's axes; the others stay.
  function filterTable(experimentId, dimensions, filters) {
    const mine = new Set(dimensions.map((d) => d.key));
    const params = new URLSearchParams(location.search);
    const kept = params.getAll("where").filter((word) => !mine.has(word.split(":").slice(0, -2).join(":")));
    params.delete("where");
    params.delete("offset");
    for (const word of kept) { params.append("where", word); }
    for (const dimension of dimensions) {
      const brushes = filters[dimension.key] || [];
      if (!brushes.length || dimension.type === Hermes.DimensionType.Categorical) { continue; }
      const low = Math.min(...brushes.map((b) => Math.min(b.value0, b.value1)));
      const high = Math.max(...brushes.map((b) => Math.max(b.value0, b.value1)));
      if (Number.isFinite(low) && Number.isFinite(high)) { params.append("where", dimension.key + ":" + low + ":" + high); }
    }
    const holder = document.getElementById("parallel");
    holder.dataset.brushed = params.getAll("where").join(" ");
    // The table's own element is the source: its hx-swap and hx-sync apply, as to its polls.
    htmx.ajax("GET", "/ui/experiments/" + experimentId + "/live?" + params.toString(),
              {source: document.getElementById("live"), target: "#live"});
  }

  // What a redraw would change: the trials, their states and their best values.
  function signature(rows, metric) {
    return rows.map((t) => t.id + ":" + t.state + ":" + (t.best_validation ? t.best_validation[metric] : "")).join(",");
  }

  // Draws the chart, or draws it again once its trials changed (a running experiment),
  // unless a brush is being dragged or its filter is on its way to the table.
  async function draw() {
    const holder = document.getElementById("parallel");
    const note = document.getElementById("parallel-note");
    if (!holder || !note || typeof Hermes === "undefined") { return; }
    const experimentId = holder.dataset.experiment;
    const metric = holder.dataset.metric;
    const types = JSON.parse(holder.dataset.types || "{}");
    let rows;
    try {
      rows = await allTrials(experimentId);
    } catch (problem) {
      note.textContent = "The trials could not be read: " + problem.message;
      return;
    }
    const drawn = signature(rows, metric);
    if (holder.chart && (drawn === holder.drawnFrom || holder.pressed || holder.pending)) { return; }
    if (holder.chart) {
      holder.chart.destroy();
      holder.chart = null;
    }
    holder.drawnFrom = drawn;
    const dimensions = axes(types, metric, rows);
    if (!rows.length || dimensions.length < 2) {
      note.textContent = rows.length ? "Fewer than two axes to draw." : "No trials yet.";
      return;
    }
    const data = {};
    for (const dimension of dimensions) { data[dimension.key] = values(dimension, rows, metric); }
    holder.style.height = "320px";
    const text = getComputedStyle(document.body).color;
    const label = {fillStyle: text, strokeStyle: "rgba(0,0,0,0)"};
    let timer = null;
    const changed = (filters) => {
      clearTimeout(timer);
      holder.pending = true;
      timer = setTimeout(() => {
        holder.pending = false;
        filterTable(experimentId, dimensions, filters);
      }, 150);
    };
    try {
      holder.chart = new Hermes.default(holder, dimensions, {
        filters: brushesFromAddress(dimensions),
        hooks: {onFilterChange: changed, onReset: () => changed({})},
        style: {axes: {label: label}, dimension: {label: label},
                data: {default: {lineWidth: 1, strokeStyle: "rgba(31,119,180,0.6)"},
                       filtered: {lineWidth: 1, strokeStyle: "rgba(127,127,127,0.08)"}}},
      }, data);
    } catch (problem) {
      note.textContent = "The chart could not be drawn: " + problem.message;
      return;
    }
    holder.dataset.axes = String(dimensions.length);
    holder.dataset.lines = String(rows.length);
    note.textContent = rows.length + " trials. Drag along an axis to keep the trials in that range " +
      "(the table follows); drag a brush to move it, click beside it to clear, double-click to reset.";
  }

  // Drawn once the section comes near the screen (its 1,000 trials are not read for a
  // visit that never scrolls to it), then every REFRESH_MS while the experiment runs.
  function start() {
    const holder = document.getElementById("parallel");
    if (!holder) { return; }
    holder.addEventListener("pointerdown", () => { holder.pressed = true; });
    document.addEventListener("pointerup", () => { holder.pressed = false; });
    const shown = new IntersectionObserver((entries) => {
      if (!entries.some((e) => e.isIntersecting)) { return; }
      shown.disconnect();
      draw();
      if (holder.dataset.ended === "true") { return; }
      const timer = setInterval(() => {
        const state = document.querySelector("#live .state");
        if (state && ["COMPLETED", "CANCELED", "ERROR"].includes(state.textContent.trim())) {
          clearInterval(timer);
        }
        if (!document.hidden) { draw(); }
      }, REFRESH_MS);
    }, {rootMargin: "400px 0px"});
    shown.observe(holder);
  }

  document.addEventListener("DOMContentLoaded", start);
})();
