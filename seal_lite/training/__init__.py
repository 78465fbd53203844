"""The policy update: TRL's GRPO trainer extended for SEAL (grpo.py) and its shared-prefix scoring (shared_prefix.py)."""

import warnings

# trl 1.14.2 warns on import about any vLLM outside 0.20-0.30; seal-lite drives vLLM 0.32 itself
# (seal_lite/engines/vllm_rollouts.py), not through TRL
warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)
