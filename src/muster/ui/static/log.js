// The trial page's log viewer, over GET /api/v1/trials/{id}/logs: the tail first (a 1 GB
// log opens at once), earlier bytes when scrolled to the top, then, while the trial runs,
// a follow of the current attempt; when an attempt ends and another starts, a marker line
// says why, and the next attempt is followed. The download link saves one rank's whole log of
// the selected attempt, as written (GET /api/v1/trials/{id}/logs/download).
"use strict";

(function () {
  const pre = document.getElementById("log");
  if (!pre) { return; }
  const trial = pre.dataset.trial;
  const attemptSelect = document.getElementById("log-attempt");
  const rankSelect = document.getElementById("log-rank");
  const find = document.getElementById("log-find");
  const status = document.getElementById("log-status");
  const download = document.getElementById("log-download");
  const TAIL_LINES = 1000;
  const PAGE_BYTES = 256 * 1024;
  const KEEP_CHARS = 8 * 1024 * 1024;  // what the page holds at most
  let text = "";
  let firstOffset = null;  // where the bytes shown start (one rank's log), for paging back
  let controller = null;
  let loadingEarlier = false;

  function base(extra) {
    const params = new URLSearchParams(extra);
    if (attemptSelect.value) { params.set("attempt", attemptSelect.value); }
    if (rankSelect.value !== "") { params.set("rank", rankSelect.value); }
    return "/api/v1/trials/" + trial + "/logs?" + params.toString();
  }

  // The rank shown, or rank 0 while every rank is shown merged: a download is one file.
  function setDownload() {
    const rank = rankSelect.value === "" ? "0" : rankSelect.value;
    const params = new URLSearchParams({rank: rank});
    if (attemptSelect.value) { params.set("attempt", attemptSelect.value); }
    download.href = "/api/v1/trials/" + trial + "/logs/download?" + params.toString();
    download.textContent = "download rank " + rank + " (raw)";
    download.hidden = !attemptSelect.value;
  }

  function render(keepScroll) {
    if (text.length > KEEP_CHARS) { text = text.slice(text.length - KEEP_CHARS); firstOffset = null; }
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
    const needle = find.value;
    if (!needle) {
      pre.textContent = text;
    } else {
      pre.textContent = "";
      const parts = text.split(needle);
      parts.forEach((part, i) => {
        pre.appendChild(document.createTextNode(part));
        if (i < parts.length - 1) {
          const mark = document.createElement("mark");
          mark.textContent = needle;
          pre.appendChild(mark);
        }
      });
      status.textContent = (parts.length - 1) + " found";
    }
    if (!keepScroll && atBottom) { pre.scrollTop = pre.scrollHeight; }
  }

  async function readTail() {
    const url = base({tail: TAIL_LINES});
    // The page asked for this very tail before its scripts loaded (trial.html): use it.
    const early = window.musterLogTail && url.endsWith(window.musterLogTail.url.split("?")[1]) ? window.musterLogTail : null;
    window.musterLogTail = null;
    const got = early ? await early.answer : null;
    const response = got ? got.response : await fetch(url, {credentials: "same-origin"});
    if (!response.ok) { status.textContent = "log: " + response.status; return false; }
    const start = response.headers.get("X-Muster-Offset");
    firstOffset = start === null ? null : Number(start);
    text = got ? got.text : await response.text();
    render(false);
    pre.scrollTop = pre.scrollHeight;
    return true;
  }

  async function readEarlier() {
    if (loadingEarlier || !firstOffset) { return; }
    loadingEarlier = true;
    const offset = Math.max(0, firstOffset - PAGE_BYTES);
    const response = await fetch(base({offset: offset, limit: firstOffset - offset}),
                                 {credentials: "same-origin"});
    if (response.ok) {
      const earlier = await response.text();
      const height = pre.scrollHeight;
      text = earlier + text;
      firstOffset = offset;
      render(true);
      pre.scrollTop = pre.scrollHeight - height;
    }
    loadingEarlier = false;
  }

  // Follows one attempt until it ends: its last `tail` lines first (all of it without),
  // then its bytes as they come; then the next attempt, if the trial made one.
  async function follow(attempt, tail) {
    controller = new AbortController();
    const params = new URLSearchParams({follow: "true", one_attempt: "true", attempt: attempt});
    if (tail !== undefined) { params.set("tail", tail); }
    if (rankSelect.value !== "") { params.set("rank", rankSelect.value); }
    status.textContent = "following attempt " + attempt;
    try {
      const response = await fetch("/api/v1/trials/" + trial + "/logs?" + params.toString(),
                                   {credentials: "same-origin", signal: controller.signal});
      if (!response.ok || !response.body) { status.textContent = "follow: " + response.status; return; }
      const reader = response.body.getReader();
      const decoder = new TextDecoder("utf-8");
      for (;;) {
        const {value, done} = await reader.read();
        if (done) { break; }
        text += decoder.decode(value, {stream: true});
        render(false);
      }
      text += decoder.decode();
      render(false);
      await next(attempt);
    } catch (error) {
      if (error.name !== "AbortError") { status.textContent = "follow stopped: " + error.message; }
    }
  }

  async function next(ended) {
    const response = await fetch("/api/v1/trials/" + trial, {credentials: "same-origin"});
    if (!response.ok) { return; }
    const info = await response.json();
    const later = info.attempts.filter((a) => !a.standby && a.number > ended);
    if (later.length) {
      const previous = info.attempts.find((a) => a.number === ended) || {};
      text += "\n── attempt " + later[0].number + " (after attempt " + ended + " ended " +
              (previous.reason || previous.state || "") + ") ──\n";
      render(false);
      await follow(later[0].number);
    } else {
      status.textContent = info.state + (["SUCCEEDED", "FAILED", "CANCELED", "SUSPECT"].includes(info.state) ? "" : " …");
      if (!["SUCCEEDED", "FAILED", "CANCELED", "SUSPECT"].includes(info.state)) {
        setTimeout(() => next(ended), 1000);
      }
    }
  }

  async function open() {
    if (controller) { controller.abort(); controller = null; }
    setDownload();
    const selected = Number(attemptSelect.value);
    const latest = attemptSelect.options.length ? Number(attemptSelect.options[attemptSelect.options.length - 1].value) : 0;
    if (pre.dataset.atRest === "true" || selected !== latest || !selected) {
      await readTail();
      status.textContent = selected ? "attempt " + selected : "no attempt yet";
      if (!selected && pre.dataset.atRest !== "true") { setTimeout(() => location.reload(), 2000); }
      return;
    }
    // A running trial: its last lines, then its bytes as they come, in one stream.
    text = "";
    firstOffset = null;
    await follow(selected, TAIL_LINES);
  }

  pre.addEventListener("scroll", () => { if (pre.scrollTop < 40) { readEarlier(); } });
  attemptSelect.addEventListener("change", open);
  rankSelect.addEventListener("change", open);
  find.addEventListener("input", () => { status.textContent = ""; render(true); });
  open();
})();
