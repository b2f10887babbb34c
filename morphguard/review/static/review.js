// Keyboard shortcuts only: every page works without this file.
(function () {
  "use strict";
  function typing(event) {
    var t = event.target;
    return t && (t.tagName === "TEXTAREA" || t.tagName === "SELECT" ||
                 (t.tagName === "INPUT" && t.type !== "radio" && t.type !== "checkbox"));
  }
  var rows = Array.prototype.slice.call(document.querySelectorAll("table.queue tbody tr[data-href]"));
  var current = -1;
  function select(i) {
    if (!rows.length) { return; }
    if (current >= 0) { rows[current].classList.remove("selected"); }
    current = Math.max(0, Math.min(rows.length - 1, i));
    rows[current].classList.add("selected");
    rows[current].scrollIntoView({block: "nearest"});
  }
  document.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      var form = document.querySelector("form.judge");
      if (form) { event.preventDefault(); form.requestSubmit(); }
      return;
    }
    if (typing(event) || event.ctrlKey || event.metaKey || event.altKey) { return; }
    if (rows.length) {
      if (event.key === "j") { select(current + 1); }
      else if (event.key === "k") { select(current - 1); }
      else if (event.key === "Enter" && current >= 0) { window.location.href = rows[current].dataset.href; }
      return;
    }
    var target = document.querySelector("[data-key='" + event.key + "']");
    if (!target) { return; }
    if (target.tagName === "INPUT") { target.checked = true; target.focus(); }
    else if (target.tagName === "A") { window.location.href = target.href; }
    else if (target.tagName === "BUTTON") { target.form.requestSubmit(); }
  });
}());
