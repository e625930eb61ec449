"""The routes' edges: each turns a parsed JSON body into a ``Call`` the one pipeline runs
(``gateway.pipeline``), and renders its ``Result``. Pure: no aiohttp, no I/O of their own."""
