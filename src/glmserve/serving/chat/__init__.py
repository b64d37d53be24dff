"""``/v1/chat/completions``: ``ChatService`` (``service``: a request's reply stream, and its
chat completion), its renderer (``render``), and the rules other APIs' requests meet once
mapped onto chat fields (``mapped``, ``hosted_tools``)."""
