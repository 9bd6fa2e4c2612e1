// The interactive reference for /openapi.json: "Authorize" takes a team's bearer token, and
// "Try it out" sends requests to this node with it. Swagger UI keeps the token in memory only.
window.ui = window.SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger",
  deepLinking: true,
  docExpansion: "list",
  defaultModelsExpandDepth: 0,
  tryItOutEnabled: false,
  persistAuthorization: false,
  validatorUrl: null,
});
