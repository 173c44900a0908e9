"""The model's TransformerLens surface: what a TransformerLens user reaches for, on our model.

    tl_native.py     TransformerLensSurface (W_E, W_U, W_Q ... as stacked views, to_tokens,
                     to_str_tokens, generate) and FeedbackActivationCache (apply_ln_to_stack,
                     decompose_resid, ... with the fused input as the stream's first component)
    serial_cache.py  run_with_cache(serial=True): hooks in every chunk of a serial run, stitched
    decoding.py      greedy decoding: Std / Soft / Fused (docs/modes.md)

`FeedbackTransformer` inherits the surface; nothing here changes what the model computes.
"""
