// "New experiment" and "Run again": the config and a context (an archive, a folder packed
// here as a .tar.gz, or an earlier experiment's snapshot) posted to POST /api/v1/experiments,
// as `muster experiment create` does. The server validates; its problems are listed here,
// one per key path.
"use strict";

(function () {
  const form = document.getElementById("new-experiment");
  if (!form) { return; }
  const status = document.getElementById("submit-status");
  const problems = document.getElementById("config-problems");
  const EXCLUDED = new Set([".git", "__pycache__", ".venv", "muster-run", ".mypy_cache"]);
  const MAX_FILES = 10000;
  const MAX_BYTES = 256 * 1024 * 1024;

  function octal(value, width) {
    return value.toString(8).padStart(width - 1, "0") + "\0";
  }

  function header(name, size, mode, mtime) {
    const block = new Uint8Array(512);
    const put = (text, at, width) => {
      const bytes = new TextEncoder().encode(text);
      if (bytes.length > width) { throw new Error("a name too long for a tar header: " + text); }
      block.set(bytes, at);
    };
    let prefix = "";
    let rest = name;
    if (new TextEncoder().encode(name).length > 100) {
      const cut = name.lastIndexOf("/", 155);
      if (cut < 1) { throw new Error("a path too long to pack: " + name); }
      prefix = name.slice(0, cut);
      rest = name.slice(cut + 1);
    }
    put(rest, 0, 100);
    put(octal(mode, 8), 100, 8);
    put(octal(0, 8), 108, 8);
    put(octal(0, 8), 116, 8);
    put(octal(size, 12), 124, 12);
    put(octal(mtime, 12), 136, 12);
    put("        ", 148, 8);
    put("0", 156, 1);
    put("ustar\u000000", 257, 8);
    put(prefix, 345, 155);
    let sum = 0;
    for (const byte of block) { sum += byte; }
    put(octal(sum, 7) + " ", 148, 8);
    return block;
  }

  // The chosen folder as a tar.gz of its contents (the folder's own name dropped), without
  // what the CLI leaves out too.
  async function pack(files) {
    const kept = Array.from(files).filter((file) => {
      const parts = file.webkitRelativePath.split("/").slice(1);
      return parts.length && !parts.some((part) => EXCLUDED.has(part));
    });
    if (kept.length > MAX_FILES) { throw new Error("the folder holds more than " + MAX_FILES + " files; keep data sets out of it"); }
    const total = kept.reduce((sum, file) => sum + file.size, 0);
    if (total > MAX_BYTES) { throw new Error("the folder holds more than 256 MiB; keep data sets out of it and read them by path"); }
    const parts = [];
    for (const file of kept) {
      const name = file.webkitRelativePath.split("/").slice(1).join("/");
      const mode = /\.(sh|bash)$/.test(name) ? 0o755 : 0o644;
      parts.push(header(name, file.size, mode, Math.floor(file.lastModified / 1000)));
      parts.push(new Uint8Array(await file.arrayBuffer()));
      const pad = (512 - (file.size % 512)) % 512;
      if (pad) { parts.push(new Uint8Array(pad)); }
    }
    parts.push(new Uint8Array(1024));
    const tar = new Blob(parts);
    return await new Response(tar.stream().pipeThrough(new CompressionStream("gzip"))).blob();
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

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
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
      const response = await fetch("/api/v1/experiments", {
        method: "POST", body: body, credentials: "same-origin", headers: csrfHeaders(),
      });
      const answer = await response.json();
      if (!response.ok) { status.textContent = ""; show(answer.message || String(response.status)); return; }
      location.href = "/experiments/" + answer.id;
    } catch (error) {
      status.textContent = "";
      show(error.message);
    }
  });
})();
