"""The built-in web pages of `surge serve`: a playground at ``/`` and a live dashboard at ``/dashboard``.

Both are static files (``surge/web/static/``) that call only Surge's public HTTP API; see
:func:`surge.web.ui.mount_web_ui`.
"""
