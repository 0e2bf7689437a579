"""Model shapes the peer benchmarks compare on (the issue's "small" and "base"); vocabulary 8,000, tied."""

SHAPES = {
    "small": dict(d_model=256, n_heads=4, d_ff=1024, layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, layers=6),
}
VOCAB = 8000
