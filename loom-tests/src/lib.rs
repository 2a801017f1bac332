//! Loom models for kvfence: see tests/ (built only with `--cfg loom`).
