// A trial page's "Register as a model version" (templates/_trial_register.html): one of the
// trial's checkpoints as the next version of a model, through the API with the session's
// CSRF token (muster.js's callApi); a new model's name is made first. What the server
// answers, the version or why not in its own words, is shown under the form, as text.
// Each checkpoint row's Register button picks its checkpoint in the form.
"use strict";

(function () {
  function form() { return document.querySelector("form[data-register]"); }

  function say(result, parts, problem) {
    result.replaceChildren(...parts);
    result.className = "register-result banner " + (problem ? "error" : "info");
    result.setAttribute("role", problem ? "alert" : "status");
    result.hidden = parts.length === 0;
  }

  // "Registered digits v2 (verified)", the version a link to its model's page.
  function registered(version) {
    const link = document.createElement("a");
    link.href = "/models/" + encodeURIComponent(version.model) + "#v" + version.version;
    link.textContent = version.model + " v" + version.version;
    const accepted = version.accepted_unverified;
    const mark = version.verified ? "verified" : accepted
      ? "unverified: " + accepted.reason + ", by " + accepted.by : "not verified";
    return [document.createTextNode("Registered "), link,
      document.createTextNode(" (" + mark + "), checkpoint " + version.checkpoint_uuid + ".")];
  }

  function body(fields, trialId) {
    const asked = {trial_id: trialId};
    const chosen = fields.checkpoint.value;
    if (chosen === "pick:best") { asked.pick = "best"; }
    else if (chosen !== "pick:latest") { asked.checkpoint = chosen; }
    const reason = fields.accept_unverified ? fields.accept_unverified.value.trim() : "";
    if (reason) { asked.accept_unverified = reason; }
    return asked;
  }

  function newModelAsked(target) {
    const label = target.querySelector(".new-name");
    const isNew = target.elements.model.value === "";
    label.hidden = !isNew;
    target.elements.new_model.required = isNew;
  }

  // A model made here joins the choices, so the next version goes to it without making it.
  function remember(target, name) {
    const select = target.elements.model;
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    select.insertBefore(option, select.lastElementChild);
    select.value = name;
    target.elements.new_model.value = "";
    newModelAsked(target);
  }

  async function register(target) {
    const fields = target.elements;
    const result = target.parentElement.querySelector(".register-result");
    const button = target.querySelector("button[type=submit]");
    const made = fields.model.value === "";
    const name = made ? fields.new_model.value.trim() : fields.model.value;
    button.disabled = true;
    try {
      if (made) {
        await callApi("/api/v1/models", {name: name});
        remember(target, name);
      }
      const version = await callApi("/api/v1/models/" + encodeURIComponent(name) + "/versions",
                                    body(fields, Number(target.dataset.register)));
      say(result, registered(version), false);
    } catch (error) {
      say(result, [document.createTextNode(error.message)], true);
    } finally {
      button.disabled = false;
    }
  }

  document.addEventListener("submit", (event) => {
    const target = event.target;
    if (!target.matches("form[data-register]")) { return; }
    event.preventDefault();
    register(target);
  });

  document.addEventListener("change", (event) => {
    const target = event.target.form;
    if (target && target.matches("form[data-register]") && event.target.name === "model") {
      newModelAsked(target);
    }
  });

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-register-checkpoint]");
    if (!button) { return; }
    const target = form();
    if (!target) { location.reload(); return; }  // offered since the page loaded: it has the form
    target.elements.checkpoint.value = button.dataset.registerCheckpoint;
    target.scrollIntoView({block: "center"});
    target.elements.model.focus();
  });

  const target = form();
  if (target) { newModelAsked(target); }
})();
