"""Model shapes the peer benchmarks compare on ("small" and "base" on CPUs, "base" and "big" on GPUs); vocabulary
8,000, tied."""

SHAPES = {
    "small": dict(d_model=256, n_heads=4, d_ff=1024, layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, layers=6),
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, layers=6),
}
VOCAB = 8000
