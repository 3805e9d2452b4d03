"""Adapters from model libraries to mm_schedule items and encoders.

Each submodule imports its library when it is imported itself, never before:
``import mm_schedule.integrations`` loads nothing but this docstring.

* ``mm_schedule.integrations.transformers``: Hugging Face transformers vision-language
  models (Qwen2-VL, Qwen2.5-VL, LLaVA, Gemma 3).
* ``mm_schedule.integrations.sglang``: a stand-in for SGLang's ``mm_schedule`` module and
  ``install()`` to put it into a running SGLang (torch is loaded by the stand-in only).
* ``mm_schedule.integrations.vllm``: vLLM's model runner (its multimodal gather and merge).
"""
