"""vllm-omni integration: the Kafka OmniConnector, its payload codec and the vllm plugin.

Nothing here imports vllm, vllm_omni or torch at import time: torch is imported only to move
tensors (a payload that holds one), vllm_omni only by the plugin's `register()`.
"""
