// The Tenure console: fetch each fragment with the API key of this tab, swap it in when it changed,
// and post incident resolutions to the JSON API. No framework, no inline script (the CSP forbids it).
(function () {
  "use strict";
  var KEY = "tenure.apiKey";

  function apiKey() { return sessionStorage.getItem(KEY) || ""; }

  function headers(extra) {
    var h = Object.assign({ Accept: "text/html, application/problem+json" }, extra || {});
    var key = apiKey();
    if (key) { h.Authorization = "Bearer " + key; }
    return h;
  }

  function flash(text, kind) {
    var el = document.getElementById("flash");
    el.textContent = text; // text, never markup: a problem's detail is shown as it is
    el.className = "flash " + (kind || "info");
    el.hidden = !text;
  }

  function showSignIn(needed) {
    document.getElementById("sign-in").hidden = !needed;
    document.getElementById("sign-out").hidden = needed || !apiKey();
  }

  async function problemText(response) {
    try {
      var p = await response.json();
      return (p.status || response.status) + " " + (p.title || "") + ": " + (p.detail || "");
    } catch (e) {
      return response.status + " " + response.statusText;
    }
  }

  async function load(el) {
    // Never replace what the operator is typing into (an incident's resolve form).
    if (el.contains(document.activeElement) && document.activeElement !== document.body) { return; }
    var response;
    try {
      response = await fetch(el.dataset.src, { headers: headers(), cache: "no-store", credentials: "omit" });
    } catch (e) {
      el.dataset.state = "offline";
      document.getElementById("status-line").textContent = "The API does not answer; retrying.";
      return;
    }
    if (response.status === 401) {
      el.dataset.state = "unauthenticated";
      el.textContent = "Sign in with an API key to see this.";
      showSignIn(true);
      return;
    }
    if (!response.ok) {
      el.dataset.state = "error";
      var p = document.createElement("p");
      p.className = "problem";
      p.textContent = await problemText(response);
      el.replaceChildren(p);
      el.dataset.last = "";
      return;
    }
    var html = await response.text();
    if (html !== el.dataset.last) {
      el.innerHTML = html; // our own server's rendering, every value escaped by Jinja
      el.dataset.last = html;
    }
    el.dataset.state = "ok";
    el.dataset.loadedAt = String(Date.now());
    document.getElementById("status-line").textContent = "Live · updated " + new Date().toISOString();
  }

  function fragments() { return Array.prototype.slice.call(document.querySelectorAll("[data-src]")); }

  function loadAll() { fragments().forEach(function (el) { load(el); }); }

  function poll() {
    fragments().forEach(function (el) {
      var every = parseInt(el.dataset.poll || "0", 10);
      if (every > 0) {
        setInterval(function () { if (!document.hidden) { load(el); } }, every);
      }
    });
  }

  function uuid() {
    if (window.crypto && crypto.randomUUID) { return crypto.randomUUID(); }
    var b = crypto.getRandomValues(new Uint8Array(16));
    return Array.prototype.map.call(b, function (x) { return ("0" + x.toString(16)).slice(-2); }).join("");
  }

  async function resolve(form) {
    var body = {
      runId: form.dataset.runId,
      resolution: form.elements.resolution.value,
      note: form.elements.note.value,
    };
    if (body.resolution === "resume") {
      body.attemptId = form.elements.attemptId.value;
      body.leaseEpoch = parseInt(form.elements.leaseEpoch.value || "0", 10);
    }
    var response = await fetch("/incidents/" + encodeURIComponent(form.dataset.incidentId) + "/resolve", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json", "Idempotency-Key": uuid() }),
      body: JSON.stringify(body),
      credentials: "omit",
    });
    if (response.ok) {
      flash("Incident " + form.dataset.incidentId + " resolved: " + body.resolution + ".", "ok");
    } else {
      flash("Not resolved. " + (await problemText(response)), "refused");
    }
    document.activeElement.blur();
    loadAll();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.getElementById("sign-in-form").addEventListener("submit", function (event) {
      event.preventDefault();
      var input = document.getElementById("api-key");
      sessionStorage.setItem(KEY, input.value.trim());
      input.value = "";
      showSignIn(false);
      flash("", "");
      loadAll();
    });
    document.getElementById("sign-out").addEventListener("click", function () {
      sessionStorage.removeItem(KEY);
      location.reload();
    });
    document.addEventListener("submit", function (event) {
      var form = event.target;
      if (form.classList && form.classList.contains("resolve")) {
        event.preventDefault();
        resolve(form);
      }
    });
    showSignIn(false);
    loadAll();
    poll();
  });
})();
