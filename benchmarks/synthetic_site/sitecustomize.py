"""On a server's ``PYTHONPATH`` (with ``benchmarks/``) under ``serving_overhead.py --vllm-core
synthetic``: vLLM's ``AsyncLLM`` gets ``synthetic_vllm_core.py``'s engine core client."""

import synthetic_vllm_core

synthetic_vllm_core.install()
