"""``/v1/responses`` and ``/v1/conversations``: the request mapped onto chat (``request``), the
reply rendered as Responses items and events (``render``), stored and background responses
(``stored``, ``run_events``), conversations, and reasoning sealed for stateless clients
(``sealed_reasoning``)."""
