// Packs the "new experiment" page's folder as a .tar.gz off the page's thread (new.js
// starts it): reading and compressing a few hundred MiB must not freeze the page. Gets
// {entries: [{path, file}]} (the files already chosen, with their paths in the folder);
// posts {packed, of} as it goes, then {archive: Blob} or {error: text}.
"use strict";

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

async function pack(entries) {
  const parts = [];
  for (const [index, entry] of entries.entries()) {
    const file = entry.file;
    const mode = /\.(sh|bash)$/.test(entry.path) ? 0o755 : 0o644;
    parts.push(header(entry.path, file.size, mode, Math.floor(file.lastModified / 1000)));
    parts.push(new Uint8Array(await file.arrayBuffer()));
    const pad = (512 - (file.size % 512)) % 512;
    if (pad) { parts.push(new Uint8Array(pad)); }
    postMessage({packed: index + 1, of: entries.length});
  }
  parts.push(new Uint8Array(1024));
  const tar = new Blob(parts);
  return await new Response(tar.stream().pipeThrough(new CompressionStream("gzip"))).blob();
}

onmessage = async (event) => {
  try {
    postMessage({archive: await pack(event.data.entries)});
  } catch (error) {
    postMessage({error: error.message});
  }
};
