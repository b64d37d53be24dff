"""Anthropic's ``/v1/messages`` and ``count_tokens``: the request mapped onto chat
(``request``, ``service``) and the reply rendered in Anthropic's shapes (``render``)."""
