// Live parts of a dashboard page. Every element with `data-live` and an id is refreshed in place from
// a fresh copy of the same page every few seconds while the tab is visible, so the heat-map, the
// queues and task states move without a reload. A part the user is typing into is left alone until
// they leave it; a failed fetch (the plane restarting, say) is simply tried again at the next tick.
// A part whose fresh copy is no longer marked `data-live` is final (a what-if answer that was being
// computed, say): it is swapped once more and then left alone, and the script stops when none is left.
(function () {
  "use strict";
  if (!document.querySelector("[data-live][id]")) return;
  var everyMs = Number(document.body.dataset.liveS || 5) * 1000;
  var busy = false;
  var timer = null;

  function swap(part, fresh) {
    var next = fresh.getElementById(part.id);
    if (!next) return;
    var typing = part.contains(document.activeElement) && document.activeElement !== document.body;
    if (typing) return;
    if (next.innerHTML !== part.innerHTML) {
      // Keep open what the reader opened (a chart's table of numbers, say).
      var open = Array.prototype.map.call(part.querySelectorAll("details"), function (d) { return d.open; });
      part.innerHTML = next.innerHTML;
      part.querySelectorAll("details").forEach(function (d, i) { if (open[i]) d.open = true; });
      part.className = next.className;
      part.dataset.refreshedAt = String(Date.now());
    }
    if (next.dataset.state !== undefined) part.dataset.state = next.dataset.state;
    if (!next.hasAttribute("data-live")) part.removeAttribute("data-live");
  }

  function refresh() {
    if (!document.querySelector("[data-live][id]")) { clearInterval(timer); return; }
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

  timer = setInterval(refresh, everyMs);
})();
