"""``/v1/batches`` and Anthropic's message batches: the service over the state store
(``service``), the input file parsed line by line (``files``), and the runner that runs lines at
the engines' batch priority (``runner``)."""
