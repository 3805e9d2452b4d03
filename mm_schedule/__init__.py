"""mm_schedule: multimodal embeddings into LLM prefill.

Importing this package loads neither torch nor triton; the scheduler and kernels
load them on first use.
"""

__version__ = "0.1.0"
