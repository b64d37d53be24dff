"""How a GGUF model is loaded: its metadata corrected (``metadata``), the devices llama.cpp has,
the ``--rpc`` servers' among them (``devices``), where its tensors go (``offload``: GPU layers
fitted per device by ``fit``, a mixture of experts' experts kept in host memory first by
``experts``, tensor overrides, mmap and mlock; ``measure``: the plan measured with llama.cpp's
``dry_run``, with the MTP context or draft model beside it and a context not given shrunk to
fit) and the KV cache it gets (``memory``: the layout and context that fit, the memory
estimate)."""
