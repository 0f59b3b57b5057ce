// Live parts of a dashboard page. Every element with `data-live` and an id is refreshed in place from
// a fresh copy of the same page every few seconds while the tab is visible, so the heat-map, the
// queues and task states move without a reload. A part the user is typing into is left alone until
// they leave it; a failed fetch (the plane restarting, say) is simply tried again at the next tick.
(function () {
  "use strict";
  if (!document.querySelector("[data-live][id]")) return;
  var everyMs = Number(document.body.dataset.liveS || 5) * 1000;
  var busy = false;

  function swap(part, fresh) {
    var next = fresh.getElementById(part.id);
    if (!next) return;
    var typing = part.contains(document.activeElement) && document.activeElement !== document.body;
    if (typing || next.innerHTML === part.innerHTML) return;
    // Keep open what the reader opened (a chart's table of numbers, say).
    var open = Array.prototype.map.call(part.querySelectorAll("details"), function (d) { return d.open; });
    part.innerHTML = next.innerHTML;
    part.querySelectorAll("details").forEach(function (d, i) { if (open[i]) d.open = true; });
    part.className = next.className;
    part.dataset.refreshedAt = String(Date.now());
  }

  function refresh() {
    if (busy || document.visibilityState !== "visible") return;
    busy = true;
    fetch(location.href, {credentials: "same-origin", headers: {"X-Live-Refresh": "1"}})
      .then(function (answer) {
        if (!answer.ok || answer.redirected) throw new Error(String(answer.status));
        return answer.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (part) { swap(part, fresh); });
        document.body.dataset.liveAt = String(Date.now());
      })
      .catch(function () {})
      .then(function () { busy = false; });
  }

  setInterval(refresh, everyMs);
})();
