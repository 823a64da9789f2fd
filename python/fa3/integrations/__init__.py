"""fa3 inside other frameworks, each an optional dependency imported only by its module.

fa3.integrations.sdpa      PyTorch's scaled_dot_product_attention (flash backend) on fa3
fa3.integrations.transformers  attn_implementation="fa3" for Hugging Face transformers models

Importing this package imports neither framework; each module's register() does, and
raises ImportError naming the missing package when it is absent.
"""
