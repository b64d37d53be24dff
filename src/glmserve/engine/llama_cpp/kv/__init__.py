"""The llama_cpp engine's KV cache at work: the continuous-batching scheduler (``scheduler.py``)
over the sequences and their KV slots (``sequence.py``), the host prompt cache of pushed-out
prompt states (``prompt_cache.py``), and the one ``llama_batch`` a step decodes
(``batch.py``). How much memory the cache takes is planned at load (``loading/memory.py``)."""
