"""How a GGUF model is loaded: its metadata corrected (``metadata``), the devices llama.cpp has,
the ``--rpc`` servers' among them (``devices``), where its tensors go (``offload``: GPU layers
fitted per device by ``fit`` with compute buffers from llama.cpp's ``dry_run``, tensor
overrides, mmap and mlock) and the KV cache it gets (``memory``: the layout and context that
fit, the memory estimate)."""
