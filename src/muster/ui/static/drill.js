// "Run a drill" on an experiment's page (templates/experiment.html): the faults checked and
// the scale, posted to `POST /api/v1/experiments/{id}/drills` with the session's CSRF token
// (muster.js's callApi); then the browser goes to the new drill's page. The API reads no
// faults as every fault, so a form with none checked is not sent: it says so instead.
"use strict";

(function () {
  async function start(form) {
    const faults = Array.from(form.querySelectorAll("input[name=faults]:checked"),
                              (box) => box.value);
    if (faults.length === 0) {
      showProblem("Check at least one fault to drill.");
      return;
    }
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const drill = await callApi(form.dataset.drill,
                                  {faults: faults, scale: Number(form.elements.scale.value)});
      showProblem("");
      location.href = "/drills/" + encodeURIComponent(drill.id);
    } catch (error) {
      showProblem(error.message);
      button.disabled = false;
    }
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!form.matches("form[data-drill]")) { return; }
    event.preventDefault();
    start(form);
  });
})();
