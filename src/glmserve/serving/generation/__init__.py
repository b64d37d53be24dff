"""The generation pipeline every endpoint shares: a request's prompt rendered (``prompt``,
``template_vars``) and its sampling checked (``sampling``, ``stop``, ``reasoning_budget``), the
tools it offers (``tools``), its engine requests admitted and their deltas turned into choices
(``run``, ``merge``, ``chunks``), who sent it (``request_scope``) and what it cost
(``metrics``)."""
