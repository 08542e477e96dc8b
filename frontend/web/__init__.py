"""The chat page at `/`: static files (static/: index.html, app.js, markdown.js, style.css) served from
memory with a restrictive Content-Security-Policy (page.py). No build step and nothing from another origin:
the page talks to this server's own /v1/models and /v1/chat/completions."""
