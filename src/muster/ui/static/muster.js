// muster's web UI: the page's actions call the API (with the session's CSRF token), and
// problems are shown in one banner. Lists and states are refreshed by htmx polling.
"use strict";

function csrfHeaders() {
  const raw = document.body.getAttribute("hx-headers");
  return raw ? JSON.parse(raw) : {};
}

function showProblem(message) {
  const banner = document.getElementById("problem");
  banner.textContent = message;
  banner.hidden = !message;
}

async function callApi(url, body) {
  const response = await fetch(url, {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", ...csrfHeaders()},
    body: JSON.stringify(body || {}),
  });
  if (response.status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname); }
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try { message = (await response.json()).message || message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response.json();
}

function refreshed() {
  const live = document.getElementById("live") || document.getElementById("trial-state");
  if (live && window.htmx) { htmx.trigger(live, "refresh"); } else { location.reload(); }
}

function formBody(form) {
  const body = {};
  for (const [key, value] of new FormData(form)) {
    body[key] = form.elements[key] && form.elements[key].type === "number" ? Number(value) : value;
  }
  return body;
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-act]");
  if (!button) { return; }
  if (button.dataset.confirm && !confirm(button.dataset.confirm)) { return; }
  button.disabled = true;
  try { await callApi(button.dataset.act); showProblem(""); refreshed(); }
  catch (error) { showProblem(error.message); }
  finally { button.disabled = false; }
});

document.addEventListener("submit", async (event) => {
  const form = event.target;
  if (form.dataset.act) {
    event.preventDefault();
    try { await callApi(form.dataset.act, formBody(form)); showProblem(""); refreshed(); }
    catch (error) { showProblem(error.message); }
  } else if (form.dataset.review) {
    event.preventDefault();
    const decision = event.submitter ? event.submitter.value : "approve";
    const note = form.elements.note.value;
    try { await callApi(form.dataset.review, {decision: decision, note: note}); location.reload(); }
    catch (error) { showProblem(error.message); }
  }
});

document.addEventListener("htmx:responseError", (event) => {
  const status = event.detail.xhr.status;
  if (status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname); return; }
  showProblem("The server answered " + status + "; the page stopped updating. Reload it.");
});
