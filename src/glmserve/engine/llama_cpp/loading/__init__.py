"""How a GGUF model is loaded: its metadata corrected (``metadata``), where its tensors go
(``offload``: GPU layers, tensor overrides, mmap and mlock) and the KV cache it gets
(``memory``: the layout and context that fit, the memory estimate)."""
