// Swagger UI over this server's API document (service/http/apidocs.py): FastAPI's own options, and no
// validator badge (it would send the document to validator.swagger.io). URLs relative to the page, so
// the page works behind a path prefix too.
"use strict";
window.ui = SwaggerUIBundle({
  url: new URL("openapi.json", document.baseURI).href,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  oauth2RedirectUrl: new URL("docs/oauth2-redirect", document.baseURI).href,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
