"""vllm-omni integration: the Kafka OmniConnector, its payload codec and the vllm plugin; nothing
here imports vllm, vllm_omni or torch at import time. Guide: docs/vllm-omni.md."""
