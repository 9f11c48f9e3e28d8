// Comparing trials. On an experiment's page: the trials table's first column picks trials,
// kept in the page's address (`compare=12,15,19`, at most 20) so a reload, another page of
// the table or a shared link keeps them, and the "Compare" link opens /compare?trials= with
// them. On /compare: one metric's curves of every trial overlaid, read from the public API
// (GET /api/v1/trials/{id}/series), drawn with uPlot; the metric chosen is in the address.
// Text only through textContent.
(function () {
  "use strict";

  const MAX_PICKED = 20;  // comparison.MAX_COMPARED

  // -- the experiment page's table --
  function picked() {
    const ids = [];
    for (const word of (new URLSearchParams(location.search).get("compare") || "").split(",")) {
      const id = Number(word);
      if (Number.isInteger(id) && id > 0 && !ids.includes(id) && ids.length < MAX_PICKED) { ids.push(id); }
    }
    return ids;
  }

  function savePicked(ids) {
    const params = new URLSearchParams(location.search);
    if (ids.length) { params.set("compare", ids.join(",")); } else { params.delete("compare"); }
    const query = params.toString();
    history.replaceState(history.state, "", location.pathname + (query ? "?" + query : "") + location.hash);
  }

  // The table is swapped in again on every sort, filter, page and poll: its boxes and the
  // link are set from the address each time.
  function showPicked() {
    const ids = picked();
    for (const box of document.querySelectorAll("input.pick")) {
      box.checked = ids.includes(Number(box.value));
      box.disabled = !box.checked && ids.length >= MAX_PICKED;
    }
    const link = document.getElementById("compare-link");
    if (!link) { return; }
    link.hidden = ids.length === 0;
    link.href = "/compare?trials=" + ids.join(",");
    link.textContent = "Compare " + ids.length + (ids.length === 1 ? " trial" : " trials");
    const clear = document.getElementById("compare-clear");
    if (clear) { clear.hidden = ids.length === 0; }
  }

  document.addEventListener("change", (event) => {
    const box = event.target;
    if (!(box instanceof HTMLInputElement) || !box.classList.contains("pick")) { return; }
    const id = Number(box.value);
    const ids = picked().filter((other) => other !== id);
    if (box.checked && ids.length < MAX_PICKED) { ids.push(id); }
    savePicked(ids);
    showPicked();
  });

  document.addEventListener("click", (event) => {
    if (event.target instanceof Element && event.target.id === "compare-clear") {
      event.preventDefault();
      savePicked([]);
      showPicked();
    }
  });

  document.addEventListener("htmx:afterSettle", showPicked);

  // -- the compare page's curves --
  async function series(trialId) {
    const answer = await fetch("/api/v1/trials/" + trialId + "/series", {credentials: "same-origin"});
    if (!answer.ok) { throw new Error("trial " + trialId + ": HTTP " + answer.status); }
    return answer.json();
  }

  const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                   "#7f7f7f", "#bcbd22", "#17becf"];

  function draw(holder, note, answers, wanted) {
    const [kind, name] = [wanted.slice(0, wanted.indexOf(":")), wanted.slice(wanted.indexOf(":") + 1)];
    const curves = [];
    const series = [{label: "step"}];
    answers.forEach((answer, i) => {
      const found = answer.series.find((s) => s.kind === kind && s.name === name);
      if (!found || !found.steps.length) { return; }
      curves.push([found.steps, found.values]);
      series.push({label: "trial " + answer.trial_id, stroke: COLOURS[i % COLOURS.length],
                   width: 1.5, spanGaps: true, points: {show: false}});
    });
    if (holder.chart) { holder.chart.destroy(); holder.chart = null; }
    holder.dataset.curves = String(curves.length);
    if (!curves.length) {
      note.textContent = "No trial reported " + name + ".";
      return;
    }
    const text = getComputedStyle(document.body).color;
    const axis = {stroke: text, grid: {stroke: "rgba(127,127,127,0.2)"}};
    holder.chart = new uPlot({
      width: Math.max(320, Math.min(holder.clientWidth || 900, 1100)),
      height: 320,
      scales: {x: {time: false}},
      axes: [Object.assign({label: "step"}, axis), Object.assign({label: name, size: 60}, axis)],
      series: series,
    }, uPlot.join(curves), holder);
    holder.dataset.drawn = wanted;
    note.textContent = curves.length + " of " + answers.length + " trials reported " + kind + " " + name + ".";
  }

  async function curvesPage() {
    const charts = document.getElementById("compare-charts");
    const holder = document.getElementById("compare-curves");
    const choice = document.getElementById("compare-metric");
    const note = document.getElementById("compare-note");
    if (!charts || !holder || !choice || !note) { return; }
    const ids = charts.dataset.trials.split(",").filter(Boolean);
    let answers;
    try {
      answers = await Promise.all(ids.map(series));
    } catch (problem) {
      note.textContent = "The curves could not be read: " + problem.message;
      return;
    }
    // The metric drawn is in the address (`metric=kind:name`), so a reload draws it again.
    const asked = new URLSearchParams(location.search).get("metric");
    if (asked && Array.from(choice.options).some((option) => option.value === asked)) { choice.value = asked; }
    draw(holder, note, answers, choice.value);
    choice.addEventListener("change", () => {
      const params = new URLSearchParams(location.search);
      params.set("metric", choice.value);
      history.replaceState(history.state, "", location.pathname + "?" + params.toString() + location.hash);
      draw(holder, note, answers, choice.value);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    showPicked();
    curvesPage();
  });
})();
