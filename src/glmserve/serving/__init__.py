"""Serving: API requests -> engine requests, engine outputs -> API responses and stream chunks,
the same for every engine.

- one package or module per API: ``chat`` (``ChatService``, over which the others are built),
  ``completions``, ``messages`` (Anthropic's), ``responses`` (with stored responses and
  conversations), ``embeddings``, ``tokenize``, ``lora`` (adapters loaded at run time),
  ``batches``;
- ``generation``: the pipeline they share (prompt, sampling, stop strings, tools, admission and
  deltas, the reply stream every chat-based API renders, metrics); ``structured``: JSON schemas
  and grammars;
- ``adapters``: one model's LoRA adapter table; ``items``: stored items and list pages.
"""
