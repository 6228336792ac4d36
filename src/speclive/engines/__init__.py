"""Remote engines: speclive's sessions running on an inference server instead of an in-process
backend (``speclive.engines.vllm``: ``vllm serve`` replicas over the OpenAI completions API)."""
