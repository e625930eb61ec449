"""HTTP: middleware, request state, body parsing, the serve path and the routes."""
