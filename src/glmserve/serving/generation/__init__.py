"""The generation pipeline every endpoint shares: a request's prompt rendered (``prompt``,
``template_vars``) and its sampling checked (``sampling``, ``stop``, ``reasoning_budget``), the
tools it offers (``tools``), its engine requests admitted and their deltas turned into the
reply stream (``run``, ``merge``, ``reply``) that each API renders (``blocks`` for the APIs made
of blocks, ``chunks`` for the stream objects and their JSON written from templates), who sent it (``request_scope``) and what it cost
(``metrics``)."""
