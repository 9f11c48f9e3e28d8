// The colour theme: the system's (light or dark, CSS's light-dark()), or the one the header's
// toggle chose, kept in this browser (localStorage). Loaded in <head>, before the first paint,
// so a dark page never flashes light. The toggle cycles auto → dark → light.
"use strict";

(function () {
  const KEY = "muster-theme";
  const ORDER = ["auto", "dark", "light"];
  const root = document.documentElement;

  function stored() {
    try {
      const value = localStorage.getItem(KEY);
      return ORDER.includes(value) ? value : "auto";
    } catch (error) {
      return "auto";  // storage refused (a private window's policy): the system's theme
    }
  }

  function apply(theme) {
    if (theme === "auto") { root.removeAttribute("data-theme"); } else { root.dataset.theme = theme; }
    const button = document.getElementById("theme-toggle");
    if (button) {
      button.textContent = "Theme: " + theme;
      button.title = "colours: " + (theme === "auto" ? "as the system's" : theme) + "; click to change";
    }
  }

  apply(stored());
  document.addEventListener("DOMContentLoaded", () => apply(stored()));
  document.addEventListener("click", (event) => {
    if (!event.target.closest("#theme-toggle")) { return; }
    const next = ORDER[(ORDER.indexOf(stored()) + 1) % ORDER.length];
    try { localStorage.setItem(KEY, next); } catch (error) { /* kept for this page only */ }
    apply(next);
    document.dispatchEvent(new CustomEvent("muster:theme", {detail: next}));
  });
})();
