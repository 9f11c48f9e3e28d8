// The log tail of a trial at rest, asked for as soon as its <pre> is parsed, while the page's other
// scripts still load; log.js takes the answer over (readTail). Loaded right after the <pre>
// (trial.html), which names the attempt in `data-tail-attempt`.
"use strict";

(function () {
  const pre = document.getElementById("log");
  if (!pre || !pre.dataset.tailAttempt) { return; }
  const params = new URLSearchParams({tail: "1000", attempt: pre.dataset.tailAttempt});
  const url = "/api/v1/trials/" + pre.dataset.trial + "/logs?" + params.toString();
  window.musterLogTail = {url: url, answer: fetch(url, {credentials: "same-origin"}).then(
    async (response) => ({response: response, text: response.ok ? await response.text() : ""}))};
  window.musterLogTail.answer.then((got) => {
    if (got.response.ok && !pre.textContent) { pre.textContent = got.text; pre.scrollTop = pre.scrollHeight; }
  });
})();
