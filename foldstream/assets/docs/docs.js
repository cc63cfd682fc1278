// GET /docs: Swagger UI over this instance's /openapi.json, every file served by the instance.
// A bearer token entered on /ui (kept for the browser tab) is sent with every request.
"use strict";
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: new URL("../openapi.json", window.location.href).pathname,
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null, // the default would send the document to an outside validator
    tryItOutEnabled: false,
    requestInterceptor: function (request) {
      const token = window.sessionStorage.getItem("foldstream-token");
      if (token && !request.headers.Authorization) {
        request.headers.Authorization = "Bearer " + token;
      }
      return request;
    },
  });
});
