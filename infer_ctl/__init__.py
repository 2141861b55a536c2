"""inferctl: operate private SGLang inference clusters (PD disaggregation, speculative decoding)."""

__version__ = "0.1.0"
