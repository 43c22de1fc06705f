// The dashboard's own script (no framework, no build): live pages, deadline countdowns on
// "Running now", and "select all" on the dead letters.
//
// Live pages: every `data-refresh` milliseconds (SLOTD_DASHBOARD_REFRESH) the page asks
// its own address again with the header X-Slotd-Live (the server answers with the page's
// <main> only, and shares one read among the tabs showing the same page) and swaps in the
// parts marked [data-live] that changed. One ask at a time; none while the tab is out of
// sight (the database pays for pages a person can see); none into a part holding the
// keyboard focus (a half-typed form is not replaced).
"use strict";
(function () {
  var LIVE_HEADER = "X-Slotd-Live";

  // The countdowns: the database's clock is the reference. Each cell carries the
  // database's now when it was rendered, and the moment it reached the page.
  function tick() {
    document.querySelectorAll("td.countdown").forEach(function (cell) {
      if (!cell.dataset.arrived) cell.dataset.arrived = String(Date.now());
      var deadline = Number(cell.dataset.deadline);
      var dbNow = Number(cell.dataset.now) + (Date.now() - Number(cell.dataset.arrived));
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

  function say(text) {
    var status = document.getElementById("live-status");
    if (!status) return;
    status.hidden = false;
    status.textContent = " · " + text;
  }

  function clock() {
    return new Date().toTimeString().slice(0, 8);
  }

  // What the server last sent for each live part, and how many updates in a row a part
  // under the mouse has let pass (a row does not move under a pointer about to click it,
  // for two updates at most).
  var received = {};
  var held = {};
  var HOLD = 2;

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    var missing = false;
    document.querySelectorAll("[data-live]").forEach(function (part) {
      var next = fresh.getElementById(part.id);
      if (!next) {
        missing = true;
        return;
      }
      var body = next.innerHTML;
      if (body === received[part.id]) return; // nothing new: the countdowns tick on
      if (part.contains(document.activeElement) && document.activeElement !== document.body) return;
      if (part.matches(":hover") && (held[part.id] || 0) < HOLD) {
        held[part.id] = (held[part.id] || 0) + 1;
        return;
      }
      held[part.id] = 0;
      received[part.id] = body;
      // A traceback the reader unfolded stays unfolded through the update.
      var open = [];
      part.querySelectorAll("details[open][id]").forEach(function (d) {
        open.push(d.id);
      });
      part.innerHTML = body;
      open.forEach(function (id) {
        var d = document.getElementById(id);
        if (d) d.open = true;
      });
    });
    if (missing) {
      // The page changed its shape (a task that finished): take its whole <main>.
      var main = fresh.getElementById("main");
      var mine = document.getElementById("main");
      if (main && mine) {
        mine.innerHTML = main.innerHTML;
        received = {};
      }
    }
    tick();
  }

  function live(every) {
    var timer = null;
    var asking = false;

    function later() {
      clearTimeout(timer);
      timer = setTimeout(ask, every);
    }

    function ask() {
      if (document.hidden) return; // resumed by visibilitychange
      if (asking) return;
      asking = true;
      var headers = {};
      headers[LIVE_HEADER] = "1";
      fetch(window.location.href, { headers: headers, credentials: "same-origin", cache: "no-store" })
        .then(function (reply) {
          return reply.text().then(function (body) {
            if (reply.status === 401 || reply.status === 403) {
              say("signed out: reload the page");
              return false;
            }
            if (reply.status === 200 || reply.status === 404) {
              swap(body);
              say("live, updated " + clock());
              return reply.status === 200; // a task gone for good: nothing more to ask
            }
            say("no update at " + clock() + " (HTTP " + reply.status + "), trying again");
            return true;
          });
        })
        .catch(function () {
          say("no update at " + clock() + " (unreachable), trying again");
          return true;
        })
        .then(function (again) {
          asking = false;
          if (again) later();
        });
    }

    document.addEventListener("visibilitychange", function () {
      if (!document.hidden) ask();
    });
    say("live, every " + Math.round(every / 1000) + "s");
    later();
  }

  document.addEventListener("DOMContentLoaded", function () {
    // As the server sent them, before a countdown changes a digit.
    document.querySelectorAll("[data-live]").forEach(function (part) {
      received[part.id] = part.innerHTML;
    });
    tick(); // a countdown may also arrive with a live update
    setInterval(tick, 1000);
    var every = Number(document.body.dataset.refresh || 0);
    if (every > 0 && document.querySelector("[data-live]")) live(every);
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
