// "New experiment" and "Run again": the config and a context (an archive, a folder packed
// here as a .tar.gz by pack_worker.js, or an earlier experiment's snapshot) posted to
// POST /api/v1/experiments, as `muster experiment create` does. The server validates; its
// problems are listed here, one per key path. The page sends one Idempotency-Key per load,
// and Submit stays disabled until the answer: a double click creates one experiment. The
// upload shows its progress, and Cancel aborts it while it is under way (nothing is made).
"use strict";

(function () {
  const form = document.getElementById("new-experiment");
  if (!form) { return; }
  const status = document.getElementById("submit-status");
  const problems = document.getElementById("config-problems");
  const submit = form.querySelector("button[type=submit]");
  const cancel = document.getElementById("cancel-upload");
  const EXCLUDED = new Set([".git", "__pycache__", ".venv", "muster-run", ".mypy_cache"]);
  const MAX_FILES = 10000;
  const MAX_BYTES = 256 * 1024 * 1024;
  const MiB = 1024 * 1024;
  // One key for this form: a retry of this submission (after an error, or a click again)
  // is answered with the experiment already made, never a second one.
  const key = Array.from(crypto.getRandomValues(new Uint8Array(16)),
    (byte) => byte.toString(16).padStart(2, "0")).join("");
  let upload = null;  // the XMLHttpRequest under way, if any

  // The chosen folder's files (the folder's own name dropped), without what the CLI
  // leaves out too, packed as a tar.gz by the worker.
  function pack(files) {
    const entries = [];
    for (const file of files) {
      const parts = file.webkitRelativePath.split("/").slice(1);
      if (parts.length && !parts.some((part) => EXCLUDED.has(part))) {
        entries.push({path: parts.join("/"), file: file});
      }
    }
    if (entries.length > MAX_FILES) { throw new Error("the folder holds more than " + MAX_FILES + " files; keep data sets out of it"); }
    const total = entries.reduce((sum, entry) => sum + entry.file.size, 0);
    if (total > MAX_BYTES) { throw new Error("the folder holds more than 256 MiB; keep data sets out of it and read them by path"); }
    return new Promise((resolve, reject) => {
      const worker = new Worker("/static/pack_worker.js");
      worker.onmessage = (event) => {
        const said = event.data;
        if (said.packed !== undefined) {
          status.textContent = "packing the folder: " + said.packed + " of " + said.of + " files…";
          return;
        }
        worker.terminate();
        if (said.error !== undefined) { reject(new Error(said.error)); } else { resolve(said.archive); }
      };
      worker.onerror = (event) => { worker.terminate(); reject(new Error("packing failed: " + event.message)); };
      worker.postMessage({entries: entries});
    });
  }

  function show(message) {
    problems.textContent = "";
    const lines = message.split(/\n/).map((line) => line.trim()).filter(Boolean);
    for (const line of lines) {
      const item = document.createElement("li");
      item.textContent = line;
      problems.appendChild(item);
    }
    problems.hidden = !lines.length;
  }

  function mib(bytes) {
    return (bytes / MiB).toFixed(bytes < 10 * MiB ? 2 : 1);
  }

  // The form posted with its key; resolves to the answer {status, body}, or rejects when
  // the upload is canceled or the connection fails.
  function post(body) {
    return new Promise((resolve, reject) => {
      const request = new XMLHttpRequest();
      request.open("POST", "/api/v1/experiments");
      const headers = {...csrfHeaders(), "Idempotency-Key": key};
      for (const [name, value] of Object.entries(headers)) { request.setRequestHeader(name, value); }
      request.responseType = "json";
      request.upload.onprogress = (event) => {
        if (event.lengthComputable) {
          status.textContent = "uploading " + mib(event.loaded) + " of " + mib(event.total) + " MiB…";
        }
      };
      request.upload.onload = () => { cancel.hidden = true; status.textContent = "creating…"; };
      request.onload = () => resolve({status: request.status, body: request.response || {}});
      request.onabort = () => reject(new Error("the upload was canceled; nothing was created"));
      request.onerror = () => reject(new Error("the server could not be reached; submit again (the same submission is never made twice)"));
      upload = request;
      cancel.hidden = false;
      request.send(body);
    });
  }

  function finish(message) {
    upload = null;
    cancel.hidden = true;
    submit.disabled = false;
    status.textContent = "";
    show(message);
  }

  // A 401: the session ended (expired, logged out elsewhere). Said in words, with a login that
  // opens beside this page, so the config typed here is kept for the retry.
  function sessionEnded() {
    finish("");
    const item = document.createElement("li");
    const link = document.createElement("a");
    link.href = "/login?next=%2Faccount";
    link.target = "_blank";
    link.rel = "noopener";
    link.textContent = "log in again in a new tab";
    item.append("Your session has ended, so nothing was submitted: ", link,
                ", then submit again (what you typed here is kept).");
    problems.replaceChildren(item);
    problems.hidden = false;
  }

  cancel.addEventListener("click", () => { if (upload) { upload.abort(); } });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (submit.disabled) { return; }
    submit.disabled = true;
    show("");
    const body = new FormData();
    body.append("config", form.elements.config.value);
    try {
      if (form.dataset.source) {
        body.append("context_from", form.dataset.source);
      } else if (form.elements.context.files.length) {
        const archive = form.elements.context.files[0];
        body.append("context", archive, archive.name);
      } else if (form.elements.folder.files.length) {
        status.textContent = "packing the folder…";
        body.append("context", await pack(form.elements.folder.files), "context.tar.gz");
      }
      status.textContent = "submitting…";
      const answer = await post(body);
      if (answer.status === 401) { sessionEnded(); return; }
      if (answer.status >= 400) { finish(answer.body.message || String(answer.status)); return; }
      location.href = "/experiments/" + answer.body.id;
    } catch (error) {
      finish(error.message);
    }
  });
})();
