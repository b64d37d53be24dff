"""``/v1/chat/completions``: ``ChatService`` (``service``), and the rules other APIs' requests
meet once mapped onto chat fields (``mapped``, ``hosted_tools``)."""
