// Deadline countdowns on "Running now", and "select all" on the dead letters. The
// database's clock is the reference: each row carries its now, so a skewed browser clock
// does not move a deadline.
"use strict";
(function () {
  var loaded = Date.now();
  function tick() {
    document.querySelectorAll("td.countdown").forEach(function (cell) {
      var deadline = Number(cell.dataset.deadline);
      var dbNow = Number(cell.dataset.now) + (Date.now() - loaded);
      var left = Math.round((deadline - dbNow) / 1000);
      var row = cell.closest("tr");
      if (left < 0) {
        cell.textContent = -left + "s past deadline";
        row.classList.add("overdue");
      } else {
        cell.textContent = left + "s";
        row.classList.remove("overdue");
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (document.querySelector("td.countdown")) {
      tick();
      setInterval(tick, 1000);
    }
    var all = document.getElementById("select-all");
    if (all) {
      all.addEventListener("change", function () {
        document.querySelectorAll("#dead input[name=id]").forEach(function (box) {
          box.checked = all.checked;
        });
      });
    }
  });
})();
