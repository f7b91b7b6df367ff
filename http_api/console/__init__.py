"""The web console (API.md "Console and streaming": `GET /ui/` on every broker).

Server-rendered page shells (`pages.py`) plus one small hand-written script and stylesheet
(`static/console.js`, `static/console.css`, committed; no CDN, nothing fetched from the network
at run time). The pages carry no cluster data themselves: the script reads it in the browser,
same-origin, through the broker's authorized JSON routes (/v1/metadata, /v1/topics/{t},
/v1/groups, /metrics, the SSE record stream ...), so a user sees exactly what their principal
may DESCRIBE/READ, with the credentials the browser already holds for the page.

`install_console(app, ctx)` adds the routes; `STATIC_PATHS` are the public assets (open in
http_api/broker/authorization.py like /healthz), `PAGE_ROUTES` the page patterns (any
authenticated principal: loading a page with security on makes the browser ask for Basic
credentials once, which its later fetches then carry).
"""
from http_api.console.pages import LOG_DIRS_PATH, PAGE_ROUTES, STATIC_PATHS, install_console

__all__ = ["LOG_DIRS_PATH", "PAGE_ROUTES", "STATIC_PATHS", "install_console"]
