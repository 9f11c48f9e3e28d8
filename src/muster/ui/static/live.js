// Live pages: one server-sent event stream a page (GET /api/v1/events/stream, scoped by the
// body's data-stream: "experiment_id=3", "trial_id=7", or "" for the whole server). Each
// event refreshes the page's live parts (elements with data-live, fetched again by htmx's
// "refresh" trigger), at most once every REFRESH_MS. The parts that change without an event
// (progress, the newest metrics) keep their own polls.
// When the stream breaks, a banner says why: the server is unreachable (the browser
// reconnects by itself, and the page refreshes once it is back), or the session ended (a
// link to log in again that comes back to this page).
"use strict";

(function () {
  const scope = document.body.dataset.stream;
  const banner = document.getElementById("connection");
  if (scope === undefined || !banner || !window.EventSource) { return; }
  const REFRESH_MS = 500;
  const REOPEN_MS = 5000;
  let source = null;
  let timer = null;
  let broken = false;

  function refresh() {
    timer = null;
    if (!window.htmx) { return; }
    for (const part of document.querySelectorAll("[data-live]")) { htmx.trigger(part, "refresh"); }
  }

  function soon() {
    if (timer === null) { timer = setTimeout(refresh, REFRESH_MS); }
  }

  // The banner's sentence (text only), with a login link that comes back here.
  function say(text, login) {
    if (!text) { banner.hidden = true; banner.replaceChildren(); return; }
    const parts = [document.createTextNode(text)];
    if (login) {
      const link = document.createElement("a");
      link.href = "/login?next=" + encodeURIComponent(location.pathname + location.search);
      link.textContent = "Log in again";
      parts.push(document.createTextNode(" "), link);
    }
    banner.replaceChildren(...parts);
    banner.hidden = false;
  }

  // Why the stream broke: a 401 from the server (the session ended), or no answer at all.
  async function diagnose() {
    let status = 0;
    try {
      status = (await fetch("/api/v1/whoami", {credentials: "same-origin", cache: "no-store"})).status;
    } catch (error) {
      status = 0;
    }
    if (status === 401) {
      source.close();
      say("Your session has ended: this page no longer updates.", true);
    } else if (status === 0 || status >= 500) {
      say("The server does not answer: this page shows what it last knew and updates again once the server is back.");
    }
    if (source.readyState === EventSource.CLOSED && status !== 401) { setTimeout(open, REOPEN_MS); }
  }

  function open() {
    source = new EventSource("/api/v1/events/stream" + (scope ? "?" + scope : ""));
    source.addEventListener("ready", () => {
      if (broken) { broken = false; say(""); soon(); }
    });
    source.addEventListener("muster", soon);
    source.addEventListener("reset", soon);
    source.onerror = () => {
      broken = true;
      diagnose();
    };
  }

  open();
  window.addEventListener("pagehide", () => { if (source) { source.close(); } });
})();
