// The log tail of a trial at rest, asked for as soon as its log box is parsed, while the page's
// other scripts still load; log.js takes the answer over (readTail) and draws it. Loaded right
// after the box (trial.html), which names the attempt in `data-tail-attempt`. Should the answer
// come before log.js runs, its text is shown meanwhile.
"use strict";

(function () {
  const box = document.getElementById("log");
  if (!box || !box.dataset.tailAttempt) { return; }
  const params = new URLSearchParams({tail: "1000", attempt: box.dataset.tailAttempt});
  const url = "/api/v1/trials/" + box.dataset.trial + "/logs?" + params.toString();
  window.musterLogTail = {url: url, answer: fetch(url, {credentials: "same-origin"}).then(
    async (response) => ({response: response,
                          bytes: response.ok ? new Uint8Array(await response.arrayBuffer()) : new Uint8Array(0)}))};
  window.musterLogTail.answer.then((got) => {
    if (got.response.ok && !box.dataset.viewer) {
      box.textContent = new TextDecoder("utf-8").decode(got.bytes);
      box.scrollTop = box.scrollHeight;
    }
  });
})();
