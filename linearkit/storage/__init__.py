"""Bytes on disk, knowing nothing of models: atomic writes (``atomic``), the strict safetensors
reader (``safetensors_header``) and writer (``tensor_file``). ``io`` (model files) and
``transforms`` (LoRA adapter files) both build on it."""
