// Charts drawn with uPlot from the public API, every series already downsampled by the
// server (min/max buckets, at most 1,000 points a curve):
// - an experiment's page: every trial's learning curve of the searcher's metric
//   (GET /api/v1/experiments/{id}/curves), the metric against each hyperparameter
//   (GET /api/v1/experiments/{id}/trials) and the hyperparameters' importance
//   (GET /api/v1/experiments/{id}/importance), redrawn while the experiment runs;
// - a trial's page: each metric it reports (GET /api/v1/trials/{id}/series).
// When a chart has drawn, its element gets `data-drawn` (and the count of its curves in
// `data-curves`), which tests and the screenshot script wait for.
"use strict";

(function () {
  const REFRESH_MS = 10000;
  const PALETTE = ["#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#cf222e",
                   "#0550ae", "#116329", "#953800", "#6639ba"];

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

  // -- an experiment's learning curves: one series per trial, each with its own steps --
  function drawCurves(el, note, answer, bestId) {
    const trials = answer.trials;
    el.replaceChildren();
    if (!trials.length) {
      note.textContent = "No trial has reported " + answer.metric + " yet.";
      el.dataset.drawn = "true";
      el.dataset.curves = "0";
      return;
    }
    const stopped = trials.filter((t) => t.early_stop).length;
    const series = [{}];
    const data = [null];
    trials.forEach((t, i) => {
      const best = t.trial_id === bestId;
      series.push({
        label: "trial #" + t.number,
        stroke: best ? "#000000" : PALETTE[i % PALETTE.length] + (trials.length > 50 ? "80" : "cc"),
        width: best ? 2.5 : 1,
        dash: t.early_stop ? [4, 3] : undefined,
        points: {show: false},
      });
      data.push([t.steps, t.values]);
    });
    const xs = bounds(trials.map((t) => t.steps));
    const ys = bounds(trials.map((t) => t.values));
    const chart = new uPlot({
      mode: 2,
      width: width(el),
      height: 320,
      legend: {show: false},
      cursor: {drag: {x: true, y: true, uni: 20}, points: {show: false}},
      scales: {x: {time: false, range: () => xs}, y: {range: () => ys}},
      axes: [{label: "step"}, {label: answer.metric}],
      series: series,
    }, data, el);
    el.chart = chart;
    const best = trials.find((t) => t.trial_id === bestId);
    note.textContent = trials.length + " curves (one per trial, up to " + answer.points_per_trial +
      " points each)" + (best ? "; black: the best trial, #" + best.number : "") +
      (stopped ? "; dashed: " + stopped + " stopped early by the searcher" : "") + ".";
    el.dataset.curves = String(trials.length);
    el.dataset.best = best ? String(best.number) : "";
    el.dataset.drawn = "true";
  }

  // -- the metric against one hyperparameter: a scatter, one point per trial --
  function drawScatter(box, name, type, points, metric) {
    const categorical = type === "categorical" || points.some((p) => typeof p.x !== "number");
    let labels = [];
    let rows = points;
    if (categorical) {
      const values = Array.from(new Set(points.map((p) => p.x)));
      const numeric = values.every((v) => typeof v === "number");
      labels = values.sort((a, b) => numeric ? a - b : String(a).localeCompare(String(b))).map(String);
      rows = points.map((p) => ({x: labels.indexOf(String(p.x)), y: p.y}));
    }
    rows = rows.filter((p) => typeof p.y === "number").sort((a, b) => a.x - b.x);
    const log = type === "log" && rows.every((p) => p.x > 0);
    const holder = document.createElement("div");
    holder.className = "hp-chart";
    const title = document.createElement("h3");
    title.textContent = name;
    holder.appendChild(title);
    box.appendChild(holder);
    const xs = categorical ? [-0.5, labels.length - 0.5] : null;
    new uPlot({
      width: 320,
      height: 200,
      legend: {show: false},
      cursor: {points: {show: false}},
      scales: {x: {time: false, distr: log ? 3 : 1, range: xs ? () => xs : undefined},
               y: {range: () => bounds([rows.map((p) => p.y)])}},
      axes: [
        categorical ? {splits: () => labels.map((_, i) => i), values: () => labels} : {},
        {label: metric, size: 56},
      ],
      series: [{}, {stroke: "#0969da", paths: () => null, points: {show: true, size: 6, fill: "#0969da80"}}],
    }, [rows.map((p) => p.x), rows.map((p) => p.y)], holder);
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
        return {x: x, y: t.best_validation[metric]};
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

  async function experimentCharts(section) {
    const experiment = section.dataset.experiment;
    const metric = section.dataset.metric;
    if (!metric) { return; }
    const curves = document.getElementById("curves");
    const note = document.getElementById("curves-note");
    const hp = document.getElementById("hp-charts");
    const importance = document.getElementById("importance");
    async function draw() {
      try {
        const answer = await getJSON("/api/v1/experiments/" + experiment + "/curves");
        // 404: no SUCCEEDED trial with a value yet, so no best to mark; anything else shows.
        const best = await getJSON("/api/v1/experiments/" + experiment + "/best").catch((error) => {
          if (error.status === 404) { return null; }
          throw error;
        });
        drawCurves(curves, note, answer, best ? best.id : null);
      } catch (error) {
        note.textContent = "Learning curves: " + error.message;
      }
      if (hp) { await drawHparams(hp, experiment, metric).catch((error) => { hp.textContent = error.message; }); }
      if (importance) { await drawImportance(importance, experiment); }
    }
    await draw();
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

  // -- a trial's metrics: one small chart per metric and kind --
  async function trialCharts(box) {
    const trial = box.dataset.trial;
    async function draw() {
      const answer = await getJSON("/api/v1/trials/" + trial + "/series");
      box.replaceChildren();
      if (!answer.series.length) {
        showNote(box, "No metrics reported yet.");
      }
      answer.series.forEach((s, i) => {
        const holder = document.createElement("div");
        holder.className = "hp-chart";
        const title = document.createElement("h3");
        title.textContent = s.kind + " " + s.name + " (" + s.reports + " reports; lowest " +
          number(s.lowest) + ", highest " + number(s.highest) + ")";
        holder.appendChild(title);
        box.appendChild(holder);
        new uPlot({
          width: 360, height: 200, legend: {show: false}, cursor: {points: {show: false}},
          scales: {x: {time: false}, y: {range: () => bounds([s.values])}},
          axes: [{}, {size: 56}],
          series: [{}, {stroke: PALETTE[i % PALETTE.length], width: 1.5,
                        points: {show: s.steps.length < 50, size: 4}}],
        }, [s.steps, s.values], holder);
      });
      box.dataset.curves = String(answer.series.length);
      box.dataset.drawn = "true";
    }
    const failed = (error) => { box.textContent = "Metrics: " + error.message; };
    await draw().catch(failed);
    if (box.dataset.atRest !== "true") {
      setInterval(() => { if (!document.hidden) { draw().catch(failed); } }, REFRESH_MS);
    }
  }

  const section = document.getElementById("charts");
  if (section && section.dataset.experiment) { experimentCharts(section); }
  const metrics = document.getElementById("metric-charts");
  if (metrics && metrics.dataset.trial) { trialCharts(metrics); }
})();
