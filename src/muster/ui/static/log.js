// The trial page's log viewer, over GET /api/v1/trials/{id}/logs, for a log of any size.
//
// One rank's log (a rank picked, or an attempt with one replica) is a virtual list over its
// bytes: the page holds at most MAX_CHUNKS pieces of CHUNK bytes (least recently used
// dropped) and reads the ones the screen needs; the DOM holds only the rows on screen. The
// scrollbar stands for the log's bytes (a browser caps an element's height, so a pixel may
// be many lines): dragging it jumps to that byte's line, while the wheel and the keys move
// line by line, so every line can be reached, the first byte of a 1 GB log included.
// Every rank merged has no byte offsets of its own (the server pages it by cursor): its
// tail and what follows are held (the newest MERGED_CHUNKS pieces) and shown the same way.
//
// A running trial's latest attempt is followed: new bytes are kept as they come and drawn
// at most once an animation frame, and the view sticks to the bottom while the reader is
// there. When the attempt ends and another starts, the next attempt is shown under a marker
// line that says why. Find searches one rank's whole log on the server
// (GET .../logs/search), steps through the matches (Enter, Shift+Enter, the buttons) and
// scrolls each into view, marked; the merged view searches what it holds. Lines are text
// (textContent), never markup. The download link saves one rank's whole log of the
// selected attempt, as written (GET /api/v1/trials/{id}/logs/download). What is drawn is
// said on the box: data-anchor, the first line's offset; data-busy, while bytes load; each
// row's data-offset (tests wait on them).
"use strict";

(function () {
  const view = document.getElementById("log");
  if (!view) { return; }
  const trial = view.dataset.trial;
  const attemptSelect = document.getElementById("log-attempt");
  const rankSelect = document.getElementById("log-rank");
  const find = document.getElementById("log-find");
  const regexBox = document.getElementById("log-regex");
  const previousButton = document.getElementById("log-previous");
  const nextButton = document.getElementById("log-next");
  const foundText = document.getElementById("log-found");
  const status = document.getElementById("log-status");
  const download = document.getElementById("log-download");
  const TAIL_LINES = 1000;  // as many as the page comes with (EARLY_LOG_LINES, pages.py)
  const CHUNK = 64 * 1024;
  const MAX_CHUNKS = 256;  // 16 MiB of one rank's log held at once
  const MERGED_CHUNKS = 128;  // the merged view's newest 8 MiB
  const LOOK = 256 * 1024;  // a line longer is shown in pieces of this many bytes
  const MAX_PX = 8000000;  // the scroll range, under every browser's cap on a height
  const MATCHES_PAGE = 1000;
  const ENDED = ["SUCCEEDED", "FAILED", "CANCELED", "SUSPECT"];
  const decoder = new TextDecoder("utf-8");
  const oneByteEach = new TextDecoder("windows-1252");  // a char per byte: a merged search

  // The last lines the page came with (trial.html), as bytes: the tail of the attempt it
  // names, taken over by readTail (once) if they are all there.
  const earlyBox = view.querySelector(".log-early");
  let early = earlyBox ? {attempt: Number(earlyBox.dataset.attempt), offset: Number(earlyBox.dataset.offset),
                          next: Number(earlyBox.dataset.next), bytes: new TextEncoder().encode(earlyBox.textContent)} : null;
  if (early && early.bytes.length !== early.next - early.offset) { early = null; }

  view.dataset.viewer = "on";
  view.textContent = "";
  const rowsBox = document.createElement("div");
  rowsBox.className = "log-rows";
  const spacer = document.createElement("div");
  spacer.className = "log-spacer";
  view.append(rowsBox, spacer);

  // Bytes of one log by offset, in CHUNK-sized pieces; `fetch(index)` reads a missing one
  // (none for the merged view, which holds only what came).
  class LogBytes {
    constructor(load) {
      this.load = load;
      this.chunks = new Map();  // index -> {lo, hi, buf}: bytes [lo, hi) of the log
      this.loading = new Set();
      this.size = 0;
      this.first = 0;  // the first offset the view can show
    }

    chunk(index) {
      let got = this.chunks.get(index);
      if (got) { this.chunks.delete(index); this.chunks.set(index, got); return got; }
      got = {lo: index * CHUNK, hi: index * CHUNK, buf: new Uint8Array(CHUNK)};
      this.chunks.set(index, got);
      this.evict();
      return got;
    }

    evict() {
      while (this.chunks.size > (this.load ? MAX_CHUNKS : MERGED_CHUNKS)) {
        const index = this.load ? this.chunks.keys().next().value : Math.min(...this.chunks.keys());
        this.chunks.delete(index);
        if (!this.load) { this.first = Math.max(this.first, (index + 1) * CHUNK); }
      }
    }

    // Stores `data`, the log's bytes from `offset` (an answer's X-Muster-Offset).
    put(offset, data) {
      let at = offset;
      while (at < offset + data.length) {
        const index = Math.floor(at / CHUNK);
        const base = index * CHUNK;
        const piece = data.subarray(at - offset, Math.min(data.length, base + CHUNK - offset));
        const got = this.chunk(index);
        if (got.hi < at || got.lo > at + piece.length) { got.lo = at; got.hi = at; }  // apart: replaced
        got.buf.set(piece, at - base);
        got.hi = Math.max(got.hi, at + piece.length);
        got.lo = Math.min(got.lo, at);
        at += piece.length;
      }
    }

    append(data) {
      this.put(this.size, data);
      this.size += data.length;
    }

    // The chunk holding byte `at`, or null (then it is being read, if it can be).
    holding(at) {
      const index = Math.floor(at / CHUNK);
      const got = this.chunks.get(index);
      if (got && got.lo <= at && at < got.hi) { return got; }
      if (this.load && at < this.size && !this.loading.has(index)) {
        this.loading.add(index);
        this.load(index).finally(() => { this.loading.delete(index); draw(); });
      }
      return null;
    }

    // The last newline in [low, at): its offset, -1 if none, null if bytes are missing.
    newlineBefore(at, low) {
      let p = at;
      while (p > low) {
        const got = this.holding(p - 1);
        if (!got) { return null; }
        const base = Math.floor((p - 1) / CHUNK) * CHUNK;
        const from = Math.max(low, got.lo);
        const found = got.buf.lastIndexOf(10, p - 1 - base);
        if (found >= from - base) { return base + found; }
        p = from;
      }
      return -1;
    }

    // The first newline in [at, high), as newlineBefore.
    newlineFrom(at, high) {
      let p = at;
      while (p < high) {
        const got = this.holding(p);
        if (!got) { return null; }
        const base = Math.floor(p / CHUNK) * CHUNK;
        const to = Math.min(high, got.hi);
        const found = got.buf.subarray(0, to - base).indexOf(10, p - base);
        if (found !== -1) { return base + found; }
        p = to;
      }
      return -1;
    }

    bytes(from, to) {
      const out = new Uint8Array(to - from);
      for (let p = from; p < to;) {
        const got = this.holding(p);
        if (!got) { return null; }
        const base = Math.floor(p / CHUNK) * CHUNK;
        const end = Math.min(to, got.hi);
        out.set(got.buf.subarray(p - base, end - base), p - from);
        p = end;
      }
      return out;
    }

    // The start of the line that holds byte `at` (null: bytes missing).
    lineStart(at) {
      const low = Math.max(this.first, at - LOOK);
      const found = this.newlineBefore(at, low);
      return found === null ? null : found === -1 ? low : found + 1;
    }

    // The line that starts at `start`: {start, end, next}, its newline left out.
    line(start) {
      const high = Math.min(this.size, start + LOOK);
      const found = this.newlineFrom(start, high);
      if (found === null) { return null; }
      return found === -1 ? {start: start, end: high, next: high} : {start: start, end: found, next: found + 1};
    }
  }

  let store = new LogBytes(null);
  let note = "";  // a marker line above the first byte: why this attempt began
  let attemptShown = 0;
  let rankParam = "";  // the rank the byte offsets are of ("" when the server picks the only one)
  let controller = null;
  let generation = 0;  // each open() starts one; older answers are dropped
  const scroll = {anchor: 0, stick: true, carry: 0, move: 0, jump: null, centre: null, expected: 0};
  let rowHeight = 0;
  let lineBytes = 80;  // the average, learnt from what is drawn: lines in the scroll range
  let search = null;
  let drawing = false;

  function params(extra) {
    const query = new URLSearchParams(extra);
    if (attemptShown) { query.set("attempt", attemptShown); }
    if (rankParam !== "") { query.set("rank", rankParam); }
    return query;
  }

  function logUrl(extra) { return "/api/v1/trials/" + trial + "/logs?" + params(extra).toString(); }

  async function loadChunk(index, owner, own) {
    const response = await fetch(logUrl({offset: index * CHUNK, limit: CHUNK}), {credentials: "same-origin"});
    if (own !== generation || !response.ok) { return; }
    const data = new Uint8Array(await response.arrayBuffer());
    const start = Number(response.headers.get("X-Muster-Offset"));
    const end = Math.min((index + 1) * CHUNK, owner.size);
    // Bytes dropped to hold the log to its limit are not served: shown as one blank line.
    const gap = Math.min(start, end) - index * CHUNK;
    if (gap > 0) {
      const blank = new Uint8Array(gap).fill(32);
      blank[gap - 1] = 10;
      owner.put(index * CHUNK, blank);
    }
    if (start < end) { owner.put(start, data.subarray(0, end - start)); }
  }

  // -- drawing -----------------------------------------------------------------------------

  function draw() {
    if (drawing) { return; }
    drawing = true;
    requestAnimationFrame(() => { drawing = false; render(); });
  }

  function measure() {
    if (rowHeight) { return; }
    const probe = document.createElement("div");
    probe.className = "log-row";
    probe.textContent = "0";
    rowsBox.appendChild(probe);
    rowHeight = probe.getBoundingClientRect().height || 18;
    probe.remove();
  }

  function rowsOnScreen() { return Math.max(1, Math.ceil(view.clientHeight / rowHeight)); }

  // The rows wholly seen: fewer while a long line's sideways scrollbar covers the last.
  function wholeRows() { return Math.max(1, Math.floor(rowsBox.clientHeight / rowHeight)); }

  function scrollRange() {
    const lines = (store.size - store.first) / lineBytes + (note ? 1 : 0);
    return Math.max(0, Math.min(MAX_PX, (lines - wholeRows()) * rowHeight));
  }

  function byteToPx(offset, range) {
    const span = store.size - store.first;
    return span > 0 ? range * (offset - store.first) / span : 0;
  }

  // The start of the line `count` lines before the line starting at `start` (or first).
  function linesBack(start, count) {
    let at = start;
    for (let i = 0; i < count && at > store.first; i += 1) {
      const before = store.lineStart(at - 1);
      if (before === null) { return null; }
      at = before;
    }
    return at;
  }

  function bottomAnchor() {
    return store.size > store.first ? linesBack(store.size, wholeRows() - (note ? 1 : 0)) : store.first;
  }

  // Where the view starts, from the scroll since the last frame; null while bytes load.
  function settleAnchor() {
    if (scroll.centre !== null) {
      const at = linesBack(scroll.centre, Math.floor(rowsOnScreen() / 3));
      if (at === null) { return null; }
      scroll.anchor = at;
      scroll.centre = null;
    }
    if (scroll.jump !== null) {
      const at = store.lineStart(Math.max(store.first, Math.min(scroll.jump, store.size - 1)));
      if (at === null) { return null; }
      scroll.anchor = at;
      scroll.jump = null;
    }
    scroll.anchor = Math.max(scroll.anchor, store.first);
    while (scroll.move > 0) {
      const line = store.line(scroll.anchor);
      if (line === null) { return null; }
      if (line.next >= store.size) { scroll.move = 0; break; }
      scroll.anchor = line.next;
      scroll.move -= 1;
    }
    while (scroll.move < 0) {
      if (scroll.anchor <= store.first) { scroll.move = 0; break; }
      const at = store.lineStart(scroll.anchor - 1);
      if (at === null) { return null; }
      scroll.anchor = at;
      scroll.move += 1;
    }
    const bottom = bottomAnchor();
    if (bottom === null) { return null; }
    if (scroll.stick || scroll.anchor >= bottom) { scroll.anchor = bottom; scroll.stick = true; }
    return scroll.anchor;
  }

  // The lines on screen from `anchor`: null while bytes load.
  function visibleLines(anchor) {
    const lines = [];
    let at = anchor;
    while (lines.length < rowsOnScreen() && at < store.size) {
      const line = store.line(at);
      if (line === null) { return null; }
      const bytes = store.bytes(line.start, line.end);
      if (bytes === null) { return null; }
      lines.push({start: line.start, end: line.end, bytes: bytes});
      at = line.next;
    }
    return lines;
  }

  function render() {
    measure();
    const anchor = settleAnchor();
    const lines = anchor === null ? null : visibleLines(anchor);
    view.toggleAttribute("data-busy", lines === null || store.loading.size > 0);
    if (lines === null) { return; }
    if (lines.length) {
      const drawn = lines[lines.length - 1].end - lines[0].start + lines.length;
      lineBytes = Math.max(1, 0.8 * lineBytes + 0.2 * drawn / lines.length);
    }
    const shown = note && anchor === store.first ? [{note: note}].concat(lines) : lines;
    const seen = rowsBox.clientHeight;
    fillRows(shown.slice(0, rowsOnScreen()));
    placeScrollbar(anchor);
    view.dataset.anchor = String(anchor);
    if (rowsBox.clientHeight < seen) { draw(); }  // a sideways scrollbar came: one row less
  }

  function fillRows(lines) {
    while (rowsBox.children.length > lines.length) { rowsBox.lastChild.remove(); }
    while (rowsBox.children.length < lines.length) {
      const row = document.createElement("div");
      row.className = "log-row";
      rowsBox.appendChild(row);
    }
    const match = search && search.index >= 0 ? search.matches[search.index] : null;
    lines.forEach((line, i) => {
      const row = rowsBox.children[i];
      const marked = match && line.bytes && match.offset >= line.start && match.offset <= line.end ? match : null;
      const key = line.note ? "note" : line.start + ":" + line.end + ":" + (marked ? marked.offset + "-" + marked.end : "");
      if (row.dataset.key === key) { return; }
      row.dataset.key = key;
      row.className = line.note ? "log-row marker" : "log-row";
      if (line.note) { row.textContent = line.note; delete row.dataset.offset; return; }
      row.dataset.offset = String(line.start);
      if (!marked) { row.textContent = decoder.decode(line.bytes); return; }
      const cut = (at) => Math.max(0, Math.min(line.bytes.length, at - line.start));
      const mark = document.createElement("mark");
      mark.textContent = decoder.decode(line.bytes.subarray(cut(marked.offset), cut(marked.end)));
      row.textContent = "";
      row.append(decoder.decode(line.bytes.subarray(0, cut(marked.offset))), mark,
                 decoder.decode(line.bytes.subarray(cut(marked.end))));
    });
  }

  // The scrollbar stands for the bytes: put it where the view is, when it strays far.
  function placeScrollbar(anchor) {
    const range = scrollRange();
    const height = Math.round(range) + "px";
    if (spacer.style.height !== height) { spacer.style.height = height; }
    let top = view.scrollTop;
    if (scroll.stick) {
      top = range;
    } else if (anchor <= store.first) {
      top = 0;
    } else if (Math.abs(byteToPx(anchor, range) - top) > view.clientHeight || top < 1 || top > range - 2) {
      // Off the edges while lines are left: the wheel and keys can go on both ways.
      top = Math.min(Math.max(1, byteToPx(anchor, range)), Math.max(1, range - 2));
    }
    if (Math.abs(top - view.scrollTop) >= 1) { view.scrollTop = top; }
    scroll.expected = view.scrollTop;
  }

  // The wheel, a key or a touch moves the view line by line; any other scroll (the
  // scrollbar dragged, Home, End) goes to the byte its place on the bar stands for.
  let lineIntent = -Infinity;
  for (const kind of ["wheel", "keydown", "touchmove"]) {
    view.addEventListener(kind, () => { lineIntent = performance.now(); }, {passive: true});
  }

  view.addEventListener("scroll", () => {
    const top = view.scrollTop;
    const delta = top - scroll.expected;
    scroll.expected = top;
    if (!delta || !rowHeight) { return; }
    const range = view.scrollHeight - view.clientHeight;
    const atTop = top <= 0;
    const atBottom = top >= range - 1;
    scroll.stick = false;
    if (performance.now() - lineIntent > 500 || Math.abs(delta) > 2 * view.clientHeight) {
      Object.assign(scroll, {move: 0, carry: 0, centre: null, jump: null});
      if (atTop) { scroll.anchor = store.first; } else if (atBottom) { scroll.stick = true; } else {
        scroll.jump = store.first + Math.floor((store.size - store.first) * top / Math.max(1, range));
      }
    } else {  // a few lines at least at an edge, where the bar cannot move
      scroll.carry += delta;
      let rows = Math.trunc(scroll.carry / rowHeight);
      scroll.carry -= rows * rowHeight;
      if (!rows && (atTop || atBottom)) { rows = atTop ? -3 : 3; scroll.carry = 0; }
      scroll.move += rows;
    }
    draw();
  }, {passive: true});

  // -- reading and following -----------------------------------------------------------------

  // The rank shown, or rank 0 while every rank is shown merged: a download is one file.
  function setDownload() {
    const rank = rankSelect.value === "" ? "0" : rankSelect.value;
    const query = new URLSearchParams({rank: rank});
    if (attemptSelect.value) { query.set("attempt", attemptSelect.value); }
    download.href = "/api/v1/trials/" + trial + "/logs/download?" + query.toString();
    download.textContent = "download rank " + rank + " (raw)";
    download.hidden = !attemptSelect.value;
  }

  // The attempt's last lines: one rank's bytes (with their offset) or the merged view.
  async function readTail(own) {
    const came = early;
    early = null;
    if (came && came.attempt === attemptShown && rankParam === "") {  // the page's own tail
      const owner = new LogBytes(null);
      owner.load = (index) => loadChunk(index, owner, own);
      owner.size = came.next;
      owner.put(came.offset, came.bytes);
      store = owner;
      return "bytes";
    }
    const response = await fetch(logUrl({tail: TAIL_LINES}), {credentials: "same-origin"});
    if (own !== generation) { return null; }
    if (!response.ok) { status.textContent = "log: " + response.status; return null; }
    const data = new Uint8Array(await response.arrayBuffer());
    const offset = response.headers.get("X-Muster-Offset");
    if (offset === null) {
      store = new LogBytes(null);
      store.append(data);
      return "merged";
    }
    const owner = new LogBytes(null);
    owner.load = (index) => loadChunk(index, owner, own);
    owner.size = Number(response.headers.get("X-Muster-Next-Offset"));
    owner.put(Number(offset), data);
    store = owner;
    return "bytes";
  }

  // Follows one attempt until it ends (from the byte the tail ended at, or for the merged
  // view its last `tail` lines), then the next attempt, if the trial made one.
  async function follow(own, merged) {
    controller = new AbortController();
    const extra = {follow: "true", one_attempt: "true"};
    if (merged) { extra.tail = TAIL_LINES; } else { extra.offset = store.size; }
    status.textContent = "following attempt " + attemptShown;
    try {
      const response = await fetch(logUrl(extra), {credentials: "same-origin", signal: controller.signal});
      if (!response.ok || !response.body) { status.textContent = "follow: " + response.status; return; }
      const reader = response.body.getReader();
      for (;;) {
        const {value, done} = await reader.read();
        if (done || own !== generation) { break; }
        store.append(value);
        draw();
      }
      if (own === generation) { await next(attemptShown, own); }
    } catch (error) {
      if (error.name !== "AbortError") { status.textContent = "follow stopped: " + error.message; }
    }
  }

  async function next(ended, own) {
    const response = await fetch("/api/v1/trials/" + trial, {credentials: "same-origin"});
    if (!response.ok || own !== generation) { return; }
    const info = await response.json();
    const later = info.attempts.filter((a) => !a.standby && a.number > ended);
    if (later.length) {
      const previous = info.attempts.find((a) => a.number === ended) || {};
      const number = later[0].number;
      if (![...attemptSelect.options].some((o) => Number(o.value) === number)) {
        const option = document.createElement("option");
        option.value = String(number);
        option.textContent = String(number);
        attemptSelect.appendChild(option);
      }
      attemptSelect.value = String(number);
      await open("── attempt " + number + " (after attempt " + ended + " ended " +
                 (previous.reason || previous.state || "") + ") ──");
    } else if (ENDED.includes(info.state)) {
      status.textContent = info.state;
    } else {
      status.textContent = info.state + " …";
      setTimeout(() => { if (own === generation) { next(ended, own); } }, 1000);
    }
  }

  async function open(marker) {
    if (controller) { controller.abort(); controller = null; }
    generation += 1;
    const own = generation;
    note = typeof marker === "string" ? marker : "";
    setDownload();
    clearSearch();
    attemptShown = Number(attemptSelect.value) || 0;
    rankParam = rankSelect.value;
    Object.assign(scroll, {anchor: 0, stick: true, carry: 0, move: 0, jump: null, centre: null});
    const latest = attemptSelect.options.length ? Number(attemptSelect.options[attemptSelect.options.length - 1].value) : 0;
    if (!attemptShown) {
      status.textContent = "no attempt yet";
      if (view.dataset.atRest !== "true") { setTimeout(() => location.reload(), 2000); }
      return;
    }
    const mode = await readTail(own);
    if (mode === null) { return; }
    draw();
    if (view.dataset.atRest === "true" || attemptShown !== latest) {
      status.textContent = "attempt " + attemptShown;
      return;
    }
    if (mode === "merged") { store = new LogBytes(null); }
    await follow(own, mode === "merged");
  }

  // -- find --------------------------------------------------------------------------------
  //
  // The matches known are those in the bytes scanned, [low, high), in order; a search starts
  // at the view's top and grows that range a page at a time as next and previous go past
  // either end (the server pages forward or backward from a byte offset), so a common word
  // in a 1 GB log costs a page, not a scan of everything before the view. "match i of n" is
  // of the matches known; "n+" while the range is not the whole log.

  function clearSearch() {
    search = null;
    foundText.textContent = "";
  }

  async function askServer(wanted, extra) {
    const query = params(Object.assign({pattern: wanted.pattern, limit: MATCHES_PAGE}, extra));
    if (wanted.regex) { query.set("regex", "true"); }
    const url = "/api/v1/trials/" + trial + "/logs/search?" + query.toString();
    let response = await fetch(url, {credentials: "same-origin"});
    // The server scans a few logs at once; one more waits its turn (429, Retry-After).
    for (let tries = 0; response.status === 429 && tries < 30 && search === wanted; tries += 1) {
      await new Promise((done) => setTimeout(done, 1000));
      response = await fetch(url, {credentials: "same-origin"});
    }
    const answer = await response.json();
    if (!response.ok) { throw new Error(answer.message || String(response.status)); }
    return answer;
  }

  // One more page after `high`: from the server for one rank's log, else in what is held.
  async function pageForward(wanted) {
    if (!store.load) { heldMatches(wanted); return; }
    const answer = await askServer(wanted, {from: wanted.high});
    if (search !== wanted) { return; }
    wanted.matches.push(...answer.matches);
    wanted.high = answer.next_from;
    wanted.highDone = answer.complete;
  }

  // One more page before `low` (null: the log's end), nearest first from the server.
  async function pageBackward(wanted) {
    const extra = {direction: "backward"};
    if (wanted.low !== null) { extra.from = wanted.low; }
    const answer = await askServer(wanted, extra);
    if (search !== wanted) { return; }
    wanted.matches.unshift(...answer.matches.reverse());
    wanted.index += answer.matches.length;
    wanted.low = answer.next_from;
    wanted.lowDone = answer.complete;
  }

  // Pages one way until a match more is known, or that end of the log is reached.
  async function grow(wanted, forward) {
    const known = wanted.matches.length;
    while (search === wanted && wanted.matches.length === known &&
           !(forward ? wanted.highDone : wanted.lowDone)) {
      await (forward ? pageForward(wanted) : pageBackward(wanted));
    }
  }

  function heldMatches(wanted) {
    const bytes = store.bytes(store.first, store.size) || new Uint8Array(0);
    const text = oneByteEach.decode(bytes);
    const needle = oneByteEach.decode(new TextEncoder().encode(wanted.pattern));
    const expression = wanted.regex ? new RegExp(needle, "gm") : null;
    let at = Math.max(0, wanted.high - store.first);
    const stop = wanted.matches.length + MATCHES_PAGE;
    wanted.highDone = true;
    while (at <= text.length) {
      if (wanted.matches.length >= stop) { wanted.highDone = false; break; }
      let start, end;
      if (expression) {
        expression.lastIndex = at;
        const found = expression.exec(text);
        if (!found) { break; }
        start = found.index;
        end = start + found[0].length;
      } else {
        start = text.indexOf(needle, at);
        if (start === -1) { break; }
        end = start + needle.length;
      }
      const lineStart = start ? text.lastIndexOf("\n", start - 1) + 1 : 0;
      wanted.matches.push({offset: store.first + start, end: store.first + end, line_offset: store.first + lineStart});
      at = end > start ? end : start + 1;
    }
    wanted.high = store.first + at;
  }

  function showMatch() {
    if (!search) { return; }
    const total = search.matches.length;
    if (!total) { foundText.textContent = "no match"; return; }
    const whole = search.lowDone && search.highDone;
    foundText.textContent = "match " + (search.index + 1) + " of " + total + (whole ? "" : "+");
    const match = search.matches[search.index];
    Object.assign(scroll, {stick: false, move: 0, carry: 0, jump: null, centre: match.line_offset});
    draw();
  }

  // A search from `from` (null: backward from the log's end); the matches known are reset.
  function restart(wanted, from) {
    Object.assign(wanted, {matches: [], index: 0, low: from, high: from === null ? 0 : from,
                           lowDone: from === 0, highDone: from === null});
  }

  async function startSearch() {
    const pattern = find.value;
    if (!pattern) { clearSearch(); draw(); return; }
    const wanted = {pattern: pattern, regex: regexBox.checked};
    const top = store.load ? scroll.anchor : store.first;  // what is held is searched whole
    restart(wanted, top);
    wanted.lowDone = wanted.lowDone || !store.load;
    search = wanted;
    foundText.textContent = "searching…";
    try {
      await grow(wanted, true);
      if (!store.load) { while (search === wanted && !wanted.highDone) { await pageForward(wanted); } }
      if (search === wanted && !wanted.matches.length) { await grow(wanted, false); }  // only before
    } catch (error) {
      if (search === wanted) { foundText.textContent = "find: " + error.message; }
      return;
    }
    if (search !== wanted) { return; }
    const after = wanted.matches.findIndex((m) => m.offset >= scroll.anchor);
    wanted.index = after === -1 ? wanted.matches.length - 1 : after;
    showMatch();
  }

  async function step(by) {
    const wanted = search;
    if (!wanted || !wanted.matches.length) { return; }
    const forward = by > 0;
    try {
      if (forward ? wanted.index === wanted.matches.length - 1 : wanted.index === 0) {
        await grow(wanted, forward);
        if (search !== wanted) { return; }
        if (forward ? wanted.index === wanted.matches.length - 1 : wanted.index === 0) {
          await wrap(wanted, forward);  // past the log's end: its first match (or its last)
          showMatch();
          return;
        }
      }
    } catch (error) {
      if (search === wanted) { foundText.textContent = "find: " + error.message; }
      return;
    }
    wanted.index += forward ? 1 : -1;
    showMatch();
  }

  async function wrap(wanted, forward) {
    if (!(forward ? wanted.lowDone : wanted.highDone)) {
      restart(wanted, forward ? 0 : null);
      await grow(wanted, forward);
      if (search !== wanted) { return; }
    }
    wanted.index = forward ? 0 : wanted.matches.length - 1;
  }

  let typing = null;
  find.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(startSearch, 250);
  });
  regexBox.addEventListener("change", startSearch);
  find.addEventListener("keydown", (event) => {
    if (event.key !== "Enter") { return; }
    event.preventDefault();
    if (!search || search.pattern !== find.value) { clearTimeout(typing); startSearch(); return; }
    step(event.shiftKey ? -1 : 1);
  });
  nextButton.addEventListener("click", () => step(1));
  previousButton.addEventListener("click", () => step(-1));
  window.addEventListener("resize", draw);
  attemptSelect.addEventListener("change", () => open());
  rankSelect.addEventListener("change", () => open());
  open();
})();
