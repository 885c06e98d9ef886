// The epoch page's buttons: a POST with a JSON body to the view's own API, then a reload.
// The JWT cookie Airflow's UI set travels with the request (same origin); nothing else is needed.
(function () {
  "use strict";
  var actions = document.getElementById("actions");
  if (!actions) { return; }
  var api = actions.getAttribute("data-api");
  var out = document.getElementById("action-result");

  function show(ok, text) {
    out.hidden = false;
    out.className = ok ? "alert alert-ok" : "alert";
    out.textContent = text;
  }

  function post(action, body) {
    actions.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    return fetch(api + "/" + action, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "application/json" },
      body: JSON.stringify(body || {}),
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (response.ok) {
          show(true, (data.outcome || "done") + (data.detail ? ": " + data.detail : "") + " - reloading");
          window.setTimeout(function () { window.location.reload(); }, 600);
        } else {
          show(false, response.status + ": " + (data.detail || response.statusText));
          actions.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
        }
      });
    }).catch(function (error) {
      show(false, "request failed: " + error);
      actions.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
    });
  }

  // Abort and reject ask for a reason in their dialog ("<action>-dialog"), the others for a confirmation.
  var reasons = { abort: "aborted by hand from the sink-state view", reject: "rejected by hand from the sink-state view" };
  actions.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-action]");
    if (!button) { return; }
    var action = button.getAttribute("data-action");
    if (reasons[action]) {
      document.getElementById(action + "-dialog").showModal();
      return;
    }
    if (window.confirm(button.getAttribute("data-confirm"))) { post(action, {}); }
  });
  Object.keys(reasons).forEach(function (action) {
    var dialog = document.getElementById(action + "-dialog");
    if (!dialog) { return; }
    dialog.addEventListener("close", function () {
      if (dialog.returnValue !== "confirm") { return; }
      // One line of text: the view refuses control characters (line breaks included) in a reason.
      var reason = document.getElementById(action + "-reason").value.replace(/[\u0000-\u001f\u007f-\u009f\s]+/g, " ").trim();
      post(action, { reason: reason || reasons[action] });
    });
  });
})();
