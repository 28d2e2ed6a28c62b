"""One module per CLI stage, each exposing ``run(cfg, overrides)``: parse, seed, load, loop, write."""
