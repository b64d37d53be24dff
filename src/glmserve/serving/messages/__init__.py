"""Anthropic's ``/v1/messages`` and ``count_tokens``: the request mapped onto chat
(``request``) and the answer built in Anthropic's shapes (``service``)."""
