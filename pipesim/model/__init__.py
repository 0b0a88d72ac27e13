"""What a model is and what one layer of it costs, before any hardware: sizes (`config`, `hf_config`),
per-layer FLOPs, saved activations, elementwise bytes, collectives and parameters under tp/sp/cp and
recomputation (`flops`, `activations`, `elementwise`, `comm`, `params`, `options`), and the bytes a rank
holds for parameters, gradients and optimizer states per ZeRO stage (`memory`). Formulas and their
sources: docs/large_models.md."""
