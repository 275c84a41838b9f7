// orch dashboard: live updates and log following. Everything here is an
// addition; every page works without it.
(function () {
  "use strict";

  var POLL_MS = 2000;

  // load reads this page again as a document; live marks a poll, which
  // the server may answer without the heavy parts (the job page's logs).
  function load(live) {
    var headers = live ? { "X-Orch-Live": "1" } : {};
    return fetch(location.href, { credentials: "same-origin", cache: "no-store", headers: headers })
      .then(function (res) {
        if (!res.ok || res.redirected) return null;
        return res.text().then(function (html) {
          return new DOMParser().parseFromString(html, "text/html");
        });
      });
  }

  // swap replaces each [data-live] part whose content changed. A part
  // with data-key is swapped only when the key changes, so a followed log
  // is not thrown away on every poll; a poll's answer carries such a part
  // without its content (data-partial), and swap reports that it needs
  // the whole page for it.
  function swap(fresh) {
    var stale = false;
    document.querySelectorAll("[data-live][id]").forEach(function (old) {
      var neu = fresh.getElementById(old.id);
      if (!neu) return;
      if (old.hasAttribute("data-key")) {
        if (old.getAttribute("data-key") === neu.getAttribute("data-key")) return;
        if (neu.hasAttribute("data-partial")) { stale = true; return; }
      } else if (old.innerHTML === neu.innerHTML) {
        return;
      }
      old.replaceWith(document.importNode(neu, true));
    });
    return stale;
  }

  // refresh polls the page, and reads it whole when a keyed part changed.
  function refresh() {
    if (document.hidden) return Promise.resolve();
    return load(true)
      .then(function (fresh) {
        if (!fresh || !swap(fresh)) return;
        return load(false).then(function (whole) { if (whole) swap(whole); });
      })
      .then(followAll)
      .catch(function () { /* the next poll tries again */ });
  }

  function schedule() {
    setTimeout(function () { refresh().then(schedule, schedule); }, POLL_MS);
  }

  // follow streams a running attempt's log into its <pre>.
  function follow(pre) {
    if (pre.getAttribute("data-following")) return;
    pre.setAttribute("data-following", "1");
    var url = pre.getAttribute("data-follow");
    var started = false;
    fetch(url, { credentials: "same-origin", cache: "no-store" }).then(function (res) {
      if (!res.ok || !res.body) throw new Error("log " + res.status);
      var reader = res.body.getReader();
      var dec = new TextDecoder();
      function pump() {
        return reader.read().then(function (r) {
          if (r.done) return;
          var nearEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 40;
          if (!started) { pre.textContent = ""; started = true; }
          pre.appendChild(document.createTextNode(dec.decode(r.value, { stream: true })));
          if (nearEnd) pre.scrollTop = pre.scrollHeight;
          return pump();
        });
      }
      return pump();
    }).catch(function () {
      // No log yet (the agent is starting) or the stream broke: try again
      // while this attempt is still on the page.
      setTimeout(function () {
        if (!document.body.contains(pre)) return;
        pre.removeAttribute("data-following");
        follow(pre);
      }, 1500);
    });
  }

  function followAll() {
    document.querySelectorAll("pre[data-follow]").forEach(follow);
  }

  document.addEventListener("DOMContentLoaded", function () {
    followAll();
    if (document.body.hasAttribute("data-live-page")) schedule();
  });
})();
