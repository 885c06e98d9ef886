// Starts Swagger UI on the view's OpenAPI document: a file of its own, so the page needs no inline script.
(function () {
  "use strict";
  var target = document.getElementById("swagger-ui");
  if (!target || typeof window.SwaggerUIBundle !== "function") { return; }
  window.SwaggerUIBundle({ url: target.getAttribute("data-openapi"), dom_id: "#swagger-ui" });
})();
