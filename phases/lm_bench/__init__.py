"""Phase lm_bench: a Transformer LM of five sizes -- end-to-end step times, warm-up, precision, and the same model on our Triton kernels."""
